// The options of the attention-family ops (after the tensors each op reads or writes),
// defined once, as csrc/rope_options.h does for the rope ops: X(C++ parameter type, name,
// schema type). Generated from these lists: the schema text (registration.cpp), the
// parameter lists of the op functions and of append_setup / decode_setup, and the
// argument lists that forward them (attention_ops.cpp). Python reads the positions by
// name from the registered schemas: rope_ext/attention.py passes them as keywords.
// A reorder changes the schemas: torch.compile's on-disk FX graph cache does not key on
// a custom op's schema (seen with torch 2.14: a cached graph called append_kv with the
// old argument order after a reorder), so clear TORCHINDUCTOR_CACHE_DIR after one.
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "rope_options.h"  // the ROPE_OPT_* generators

// The token positions and the paged cache's block table, in every attention op.
#define ATTN_INDEX_LIST(X)                                  \
  X(const std::optional<at::Tensor>&, positions, "Tensor?") \
  X(const std::optional<at::Tensor>&, block_table, "Tensor?")
// The rotary part, shared by append_kv, attention_decode and the decode step.
#define ATTN_ROTARY_LIST(X)                                     \
  X(const std::optional<at::Tensor>&, offsets, "Tensor?")       \
  X(int64_t, offset, "int")                                     \
  X(const std::optional<at::Tensor>&, inv_freq, "Tensor?")      \
  X(const std::optional<at::Tensor>&, cos_sin_cache, "Tensor?") \
  X(double, base, "float")                                      \
  X(int64_t, rotary_dim, "int")                                 \
  X(bool, interleaved, "bool")
// attention_decode's own (and the decode step's).
#define ATTN_DECODE_LIST(X)                       \
  X(std::optional<double>, softmax_scale, "float?") \
  X(bool, causal, "bool")                         \
  X(int64_t, max_seqlen, "int")                   \
  X(int64_t, num_splits, "int")                   \
  X(const std::string&, impl, "str")
// fp8 cache scales and the attention factor, last in every attention op.
#define ATTN_SCALE_LIST(X)                                \
  X(const std::optional<at::Tensor>&, k_scale, "Tensor?") \
  X(const std::optional<at::Tensor>&, v_scale, "Tensor?") \
  X(double, attention_factor, "float")

#define ATTN_INDEX_SCHEMA ATTN_INDEX_LIST(ROPE_OPT_SCHEMA_)
#define ATTN_INDEX_PARAMS ATTN_INDEX_LIST(ROPE_OPT_PARAM_)
#define ATTN_INDEX_FORWARD ATTN_INDEX_LIST(ROPE_OPT_FORWARD_)
#define ATTN_ROTARY_SCHEMA ATTN_ROTARY_LIST(ROPE_OPT_SCHEMA_)
#define ATTN_ROTARY_PARAMS ATTN_ROTARY_LIST(ROPE_OPT_PARAM_)
#define ATTN_ROTARY_FORWARD ATTN_ROTARY_LIST(ROPE_OPT_FORWARD_)
#define ATTN_DECODE_SCHEMA ATTN_DECODE_LIST(ROPE_OPT_SCHEMA_)
#define ATTN_DECODE_PARAMS ATTN_DECODE_LIST(ROPE_OPT_PARAM_)
#define ATTN_DECODE_FORWARD ATTN_DECODE_LIST(ROPE_OPT_FORWARD_)
#define ATTN_SCALE_SCHEMA ATTN_SCALE_LIST(ROPE_OPT_SCHEMA_)
#define ATTN_SCALE_PARAMS ATTN_SCALE_LIST(ROPE_OPT_PARAM_)
#define ATTN_SCALE_FORWARD ATTN_SCALE_LIST(ROPE_OPT_FORWARD_)
