// Compile-time dispatch of runtime values, as flash-attention's static_switch.h: each
// macro runs its last argument (a lambda, called with no arguments) with NAME bound to
// the matching case as a constexpr (or a type), and returns what the lambda returns.
// The dispatch files list their instances through these instead of hand-written
// switches.
#pragma once
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#define ROPE_BOOL_SWITCH(COND, NAME, ...)   \
  [&] {                                     \
    if (COND) {                             \
      constexpr static bool NAME = true;    \
      return __VA_ARGS__();                 \
    } else {                                \
      constexpr static bool NAME = false;   \
      return __VA_ARGS__();                 \
    }                                       \
  }()

// The head dims of the decode kernels: 64, 128, 256 (the op layer refuses others).
#define ROPE_HEADDIM_SWITCH(D, NAME, ...)   \
  [&] {                                     \
    if ((D) == 64) {                        \
      constexpr static int NAME = 64;       \
      return __VA_ARGS__();                 \
    } else if ((D) == 128) {                \
      constexpr static int NAME = 128;      \
      return __VA_ARGS__();                 \
    } else {                                \
      constexpr static int NAME = 256;      \
      return __VA_ARGS__();                 \
    }                                       \
  }()

// Powers of two 1, 2, 4, 8 (rows per thread, query rows per CTA); larger values take 8,
// values in between the next power down.
#define ROPE_POW2_UPTO8_SWITCH(N, NAME, ...) \
  [&] {                                      \
    if ((N) < 2) {                           \
      constexpr static int NAME = 1;         \
      return __VA_ARGS__();                  \
    } else if ((N) < 4) {                    \
      constexpr static int NAME = 2;         \
      return __VA_ARGS__();                  \
    } else if ((N) < 8) {                    \
      constexpr static int NAME = 4;         \
      return __VA_ARGS__();                  \
    } else {                                 \
      constexpr static int NAME = 8;         \
      return __VA_ARGS__();                  \
    }                                        \
  }()

// The 16-bit activation types of the attention kernels (the op layer checked the dtype).
#define ROPE_HALF_TYPES_SWITCH(DTYPE, NAME, ...)                                                       \
  [&] {                                                                                               \
    TORCH_CHECK_TYPE((DTYPE) == at::kHalf || (DTYPE) == at::kBFloat16,                                \
                     "rope_ext: float16 or bfloat16 expected here, got ", (DTYPE));                   \
    if ((DTYPE) == at::kHalf) {                                                                       \
      using NAME = c10::Half;                                                                         \
      return __VA_ARGS__();                                                                           \
    } else {                                                                                          \
      using NAME = c10::BFloat16;                                                                     \
      return __VA_ARGS__();                                                                           \
    }                                                                                                 \
  }()
