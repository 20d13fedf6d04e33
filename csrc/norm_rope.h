// The fused RMSNorm + RoPE family: variant names and backend entry points (the op
// layer, norm_rope_ops.cpp, calls these).
#pragma once
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "rope_options.h"

#include "norm_rope_params.h"

namespace rope_ext {

// Variants, in the order of csrc/cuda/norm_rope_variants.cuh; "auto" picks "tile"
// when its 16-byte access applies, else "warp". The CPU runs one path for every name.
enum class NormRopeImpl : int { kWarp = 0, kTile = 1, kAuto = 2 };
inline const std::vector<std::string>& norm_rope_impl_names() {
  static const std::vector<std::string> names = {"warp", "tile"};
  return names;
}

// The ops' eager entry points without the dispatcher (pybind11: rope_ext._C).
// norm_rope_direct: xs in layout `layout` (an index of kLayouts), the outputs in it too.
std::vector<at::Tensor> norm_rope_direct(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& weights,
                                         double eps, double weight_offset, int64_t layout ROPE_PARAM_TYPES);
std::vector<at::Tensor> norm_rope_backward_direct(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& xs,
                                                  const std::vector<at::Tensor>& weights, double eps,
                                                  double weight_offset ROPE_PARAM_TYPES);

// Token groups per CPU work chunk (each chunk writes one row of the dw partial sums).
int64_t norm_rope_cpu_groups_per_chunk(const NormRopeParams& np);
void run_norm_rope_cpu(const NormRopeParams& np, at::ScalarType dtype);
#ifdef ROPE_EXT_WITH_CUDA
// Whether variant "tile" applies (16-byte rows), and why not.
bool norm_rope_tile_eligible(const NormRopeParams& np, int64_t elem_size, std::string* why);
// Rows of dw partial sums the launch writes (its blocks), for the backward's buffer.
int64_t norm_rope_cuda_partial_rows(const NormRopeParams& np, NormRopeImpl impl, int64_t elem_size, int device);
// tests/bench: rows per team of a tile (0: the rule; -1: one resident wave of blocks).
void set_norm_rope_rows_per_team(int rows);
// tests/bench: rows in flight per team in the tile variant (0: the rule; 1: no ring; 2-4:
// the shared-memory ring of that depth, lowered to what fits), and the depth the last
// launch of each direction ran with (0: none yet, or an empty launch).
void set_norm_rope_stages(int stages);
int last_norm_rope_stages(bool backward);
// The backward's weight grads from the kernel's partial rows (one launch).
void run_norm_rope_dw_sum_cuda(const NormRopeDwSum& a, c10::Device device);
void run_norm_rope_cuda(const NormRopeParams& np, NormRopeImpl impl, at::ScalarType dtype, c10::Device device);
#endif

}  // namespace rope_ext
