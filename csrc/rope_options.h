// The options of the rope-family ops (after the tensors they rotate), defined once:
// X(C++ parameter type, name, schema type). Generated from this list: the schema text of
// every op that takes them (registration.cpp), struct Options, the parameter lists of the
// op functions and eager entries (rope_ops.cpp, norm_rope_ops.cpp) and the argument lists
// that forward them. Python reads the positions by name from the registered schema
// (rope_ext/_ops.py), so a reorder here needs no other change; ROPE_EXT_TEST_OPTION_ORDER
// builds the same options in another order (tests/test_option_order.py runs the op and gradient
// tests on such a build). A reorder changes the schemas: clear torch.compile's on-disk
// FX graph cache after one (csrc/attention_options.h says why).
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#ifndef ROPE_EXT_TEST_OPTION_ORDER
#define ROPE_OPTION_LIST(X)                                   \
  X(const std::optional<at::Tensor>&, positions, "Tensor?")   \
  X(const std::optional<at::Tensor>&, offsets, "Tensor?")     \
  X(const std::optional<at::Tensor>&, cu_seqlens, "Tensor?")  \
  X(const std::optional<at::Tensor>&, inv_freq, "Tensor?")    \
  X(const std::optional<at::Tensor>&, cos_sin_cache, "Tensor?") \
  X(int64_t, offset, "int")                                   \
  X(double, base, "float")                                    \
  X(int64_t, rotary_dim, "int")                               \
  X(bool, interleaved, "bool")                                \
  X(bool, inverse, "bool")                                    \
  X(const std::string&, impl, "str")                          \
  X(double, scale, "float")                                   \
  X(int64_t, cp_size, "int")                                  \
  X(int64_t, cp_rank, "int")                                  \
  X(at::IntArrayRef, sections, "int[]")                       \
  X(bool, sections_interleaved, "bool")
#else  // the test order: scalars and tensors interleaved, inverse and impl moved
#define ROPE_OPTION_LIST(X)                                   \
  X(const std::string&, impl, "str")                          \
  X(bool, sections_interleaved, "bool")                       \
  X(const std::optional<at::Tensor>&, cos_sin_cache, "Tensor?") \
  X(double, scale, "float")                                   \
  X(const std::optional<at::Tensor>&, positions, "Tensor?")   \
  X(bool, inverse, "bool")                                    \
  X(int64_t, cp_rank, "int")                                  \
  X(const std::optional<at::Tensor>&, inv_freq, "Tensor?")    \
  X(int64_t, offset, "int")                                   \
  X(at::IntArrayRef, sections, "int[]")                       \
  X(const std::optional<at::Tensor>&, offsets, "Tensor?")     \
  X(double, base, "float")                                    \
  X(bool, interleaved, "bool")                                \
  X(int64_t, cp_size, "int")                                  \
  X(const std::optional<at::Tensor>&, cu_seqlens, "Tensor?")  \
  X(int64_t, rotary_dim, "int")
#endif

// ", Tensor? positions, Tensor? offsets, ...": the schema's options, after its tensors.
#define ROPE_OPT_SCHEMA_(T, name, S) ", " S " " #name
#define ROPE_SCHEMA_OPTS ROPE_OPTION_LIST(ROPE_OPT_SCHEMA_)
// ", const std::optional<at::Tensor>& positions, ...": a parameter list's options.
#define ROPE_OPT_PARAM_(T, name, S) , T name
#define ROPE_PARAMS ROPE_OPTION_LIST(ROPE_OPT_PARAM_)
// ", positions, offsets, ...": those parameters, forwarded.
#define ROPE_OPT_FORWARD_(T, name, S) , name
#define ROPE_FORWARD ROPE_OPTION_LIST(ROPE_OPT_FORWARD_)
// Options{positions, offsets, ...} from those parameters (names in scope).
#define ROPE_OPT_INIT_(T, name, S) name,
#define ROPE_OPTIONS Options{ROPE_OPTION_LIST(ROPE_OPT_INIT_)}
// ", const std::optional<at::Tensor>&, ...": the option types (declarations).
#define ROPE_OPT_TYPE_(T, name, S) , T
#define ROPE_PARAM_TYPES ROPE_OPTION_LIST(ROPE_OPT_TYPE_)

namespace rope_ext {

// The options of one call (references into the caller's arguments).
#define ROPE_OPT_MEMBER_(T, name, S) T name;
struct Options {
  ROPE_OPTION_LIST(ROPE_OPT_MEMBER_)
};
#undef ROPE_OPT_MEMBER_

}  // namespace rope_ext
