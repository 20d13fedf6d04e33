// The contract of the fused per-head RMSNorm + RoPE kernels (the q/k norms of Qwen3,
// Gemma 3, Qwen3-VL): norm_rope_ops.cpp fills it, csrc/cuda/norm_rope_variants.cuh and
// csrc/cpu/norm_rope_cpu.cpp implement it.
//
//   forward   y = R(theta) (x * rstd * (w + weight_offset)),  rstd = 1 / sqrt(mean(x^2) + eps)
//   backward  g = R(-theta) dy;  n = x * rstd;  gn = g * (w + weight_offset)
//             dx = rstd * (gn - n * mean(gn * n));  dw = sum over rows of g * n
// The mean runs over the whole head dim D (features past rotary_dim are normalised,
// not rotated). fp32 arithmetic, one rounding at each store.
#pragma once
#include "rope_params.h"

namespace rope_ext {

struct NormRopeParams {
  // Positions, frequencies, pairing and the [B, S, H, D] views of up to two tensors.
  // Forward: t[i].in = x, t[i].out = y. Backward: t[i].in = dy, t[i].out = dx, and
  // rope.sign = -1 (the table then holds -sin: the rotation back).
  RopeParams rope;
  const void* weight[kMaxTensors] = {nullptr, nullptr};  // [D] per tensor
  int64_t weight_stride[kMaxTensors] = {1, 1};
  DType weight_dtype[kMaxTensors] = {DType::kFloat32, DType::kFloat32};
  float eps = 1e-6f;
  float weight_offset = 0.f;  // Gemma 3 scales by (1 + w)

  // Backward only: the saved x (same [B, S, H, D] indexing as t[i], own strides) and
  // the per-block partial sums of dw, [dweight_rows, D] each in the arithmetic type
  // (fp32; float64 for float64 x), one row per block (CUDA) or work chunk (CPU), summed
  // by NormRopeDwSum's kernel (CUDA) or the op layer (CPU).
  bool backward = false;
  const void* x[kMaxTensors] = {nullptr, nullptr};
  int64_t x_stride[kMaxTensors][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
  void* dweight_partial[kMaxTensors] = {nullptr, nullptr};
  int64_t dweight_rows = 0;  // the launch checks that its blocks match
};

// The CUDA tile variant's row ring: its depth at most (rows in flight per team).
constexpr int kNormRopeMaxStages = 4;

// The backward's second launch (CUDA): dw[t][d] = sum over r < rows of partial[t][r * D + d],
// in fp32, stored in the weight's dtype.
struct NormRopeDwSum {
  const float* partial[kMaxTensors] = {nullptr, nullptr};
  void* out[kMaxTensors] = {nullptr, nullptr};
  DType out_dtype[kMaxTensors] = {DType::kFloat32, DType::kFloat32};
  int64_t rows = 0;
  int64_t D = 0;
  int num_tensors = 0;
};

}  // namespace rope_ext
