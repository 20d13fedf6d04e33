// Helpers shared by the op layers (rope_ops.cpp, norm_rope_ops.cpp, attention_ops.cpp):
// error messages, argument checks, the test hooks (poison, value checks).
#pragma once
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <utility>
#include <vector>
#include <string>
#include <type_traits>

#include "rope_params.h"

namespace rope_ext {

// Error messages are assembled with std::to_string and passed to TORCH_CHECK as one
// string: c10::str's ostringstream formatting of numbers was seen to segfault inside
// this extension on one PyTorch image (torch 2.11 on the H100 box), while a
// single-string message is passed through without a stream.
inline std::string fmt_one(const std::string& s) { return s; }
inline std::string fmt_one(const char* s) { return s; }
template <typename T, typename std::enable_if<std::is_arithmetic<T>::value, int>::type = 0>
std::string fmt_one(T v) { return std::to_string(v); }
inline std::string fmt_one(at::ScalarType t) { return c10::toString(t); }
inline std::string fmt_one(const c10::Device& d) { return d.str(); }
inline std::string fmt_one(at::IntArrayRef a) {
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}
template <typename... A>
std::string msg(const A&... a) {
  std::string s;
  int unused[] = {0, (s += fmt_one(a), 0)...};
  (void)unused;
  return s;
}

inline std::string shape_str(const at::Tensor& t) { return fmt_one(t.sizes()); }

inline void check_device(const at::Tensor& t, const char* name, const at::Tensor& x, const char* xname = "x") {
  TORCH_CHECK_VALUE(t.device() == x.device(), msg("rope_ext: ", name, " must be on ", x.device(),
                    " (the device of ", xname, "), got ", t.device()));
}

inline void check_index(const at::Tensor& t, const char* name, const at::Tensor& x, const char* xname = "x") {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, msg("rope_ext: ", name,
                   " must be an int32 or int64 tensor, got ", t.scalar_type()));
  check_device(t, name, x, xname);
}

// A strided view whose elements are all distinct: sorted by stride, each dimension
// steps over everything the smaller ones span (sufficient, and true of every slice,
// permutation or transpose of a dense buffer). The in-place checks of the rope ops and
// the cache checks of the attention ops.
inline bool non_overlapping(at::IntArrayRef sizes, at::IntArrayRef strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size)
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return true;
    if (sizes[d] > 1) dims.emplace_back(std::abs(strides[d]), sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // largest offset reachable by the smaller dimensions
  for (const auto& [stride, size] : dims) {
    if (stride <= span) return false;
    span += stride * (size - 1);
  }
  return true;
}

inline IndexArray index_array(const at::Tensor& t, int64_t stride) {
  IndexArray a;
  a.ptr = t.data_ptr();
  a.stride = stride;
  a.is64 = t.scalar_type() == at::kLong;
  return a;
}

inline DType to_dtype(at::ScalarType s) {
  return s == at::kHalf ? DType::kFloat16 : s == at::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
}

// Checks of index *values* (positions, cu_seqlens, cache slots, block tables) need the
// values on the host. Free for CPU tensors, so always run there; for CUDA tensors they
// need a device->host copy (a synchronization, which CUDA-graph capture forbids), so
// they run only after rope_ext.set_value_checks(True). The kernels never read or write
// out of bounds either way.
std::atomic<bool>& device_value_checks();
inline bool check_values_of(const at::Tensor& x) {
  return x.is_cpu() || device_value_checks().load(std::memory_order_relaxed);
}
// An index tensor's values on the host, int64 and contiguous (for those checks).
inline at::Tensor host_long(const at::Tensor& t) { return t.to(at::kCPU, at::kLong).contiguous(); }

// Test hook: fill every fresh output with NaN before the kernel runs, so that an
// element a kernel fails to write cannot pass a comparison (rope_ext._C.set_poison).
std::atomic<bool>& poison_outputs();
// An eager entry writes t in place: refused before any kernel where the op path's version
// bump would refuse it after (an inference tensor outside inference mode).
inline void check_writable(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(!t.is_inference() || c10::InferenceMode::is_enabled(),
                    "rope_ext: ", name, " is an inference tensor: writing it in place outside torch.inference_mode() "
                    "is not allowed (clone it first)");
}

inline void maybe_poison(const at::Tensor& t) {
  if (poison_outputs().load(std::memory_order_relaxed) && t.numel()) t.fill_(std::numeric_limits<double>::quiet_NaN());
}

}  // namespace rope_ext
