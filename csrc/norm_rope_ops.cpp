// The fused RMSNorm + RoPE ops (schemas in registration.cpp): argument checks, the
// translation into NormRopeParams (positions and frequencies through the rope op
// layer's make_params, so every RoPE option behaves as in apply_rope), and the
// CPU/CUDA implementations.
//
//   norm_rope(xs, weights, eps, weight_offset, <rope options>) -> ys
//   norm_rope_backward(grads, xs, weights, eps, weight_offset, <rope options>) -> dxs + dweights
// xs: one tensor or (q, k), 4-D [B, S, H, D] views; weights: [D] each. The rope
// option `impl` names the norm variant: "auto", "warp" or "tile".
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "norm_rope.h"
#include "op_utils.h"
#include "rope_math.h"
#include "rope_ops.h"

namespace rope_ext {
namespace {

constexpr int64_t kMaxNormDim = 512;  // the CUDA kernels keep a row in registers

NormRopeImpl parse_norm_impl(const std::string& name) {
  const auto& names = norm_rope_impl_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<NormRopeImpl>(i);
  TORCH_CHECK_VALUE(name == "auto", msg("rope_ext: impl of the fused norm + rope must be 'auto', 'warp' or 'tile'; got '",
                    name, "'"));
  return NormRopeImpl::kAuto;
}

std::vector<at::Tensor> run_norm_rope(const std::vector<at::Tensor>* grads, const std::vector<at::Tensor>& xs,
                                      const std::vector<at::Tensor>& weights, double eps, double weight_offset ROPE_PARAMS) {
  const size_t n = xs.size();
  TORCH_CHECK_VALUE(n == 1 || n == 2, msg("rope_ext: norm_rope takes one tensor or (q, k), got ", n));
  TORCH_CHECK_VALUE(weights.size() == n, msg("rope_ext: one norm weight per tensor: got ", n, " tensors and ",
                    weights.size(), " weights"));
  const bool bwd = grads != nullptr;
  const char* xname[2] = {n == 1 ? "x" : "q", "k"};
  const char* wname[2] = {n == 1 ? "weight" : "q_weight", "k_weight"};
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor &x = xs[i], &w = weights[i];
    TORCH_CHECK_VALUE(x.dim() == 4, msg("rope_ext: ", xname[i], " must be 4-D [B, S, H, D] after the layout transform, got ",
                      shape_str(x)));
    const int64_t D = x.size(3);
    TORCH_CHECK_VALUE(D <= kMaxNormDim, msg("rope_ext: the fused norm + rope supports head dims up to ", kMaxNormDim,
                      ", got D = ", D));
    TORCH_CHECK_TYPE(w.scalar_type() == at::kFloat || w.scalar_type() == at::kHalf || w.scalar_type() == at::kBFloat16 ||
                         (w.scalar_type() == at::kDouble && x.scalar_type() == at::kDouble),
                     msg("rope_ext: ", wname[i], " must be float32, float16 or bfloat16, got ", w.scalar_type()));
    TORCH_CHECK_VALUE(w.dim() == 1 && w.size(0) == D, msg("rope_ext: ", wname[i], " must have shape [head_dim] = [", D,
                      "], got ", shape_str(w)));
    TORCH_CHECK_VALUE(w.device() == x.device(), msg("rope_ext: ", wname[i], " must be on ", xname[i], "'s device ",
                      x.device(), ", got ", w.device()));
    TORCH_CHECK_TYPE(!(x.is_cuda() && x.scalar_type() == at::kDouble),
                     "rope_ext: the fused norm + rope runs float64 on the CPU only (float32/float16/bfloat16 on CUDA)");
    if (bwd) {
      const at::Tensor& g = (*grads)[i];
      TORCH_CHECK_VALUE(g.sizes() == x.sizes() && g.scalar_type() == x.scalar_type() && g.device() == x.device(),
                        msg("rope_ext: the gradient of ", xname[i], " must match it: got ", shape_str(g), " ",
                            g.scalar_type(), " for ", shape_str(x), " ", x.scalar_type()));
    }
  }
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, msg("rope_ext: eps must be finite and >= 0, got ", eps));
  TORCH_CHECK_VALUE(std::isfinite(weight_offset), msg("rope_ext: weight_offset must be finite, got ", weight_offset));
  const NormRopeImpl nimpl = parse_norm_impl(impl);

  std::vector<at::Tensor> outs;
  for (const auto& x : xs) outs.push_back(at::empty_like(x));
  // The rope part: in the backward the rotation runs back (sign -1) on dy.
  // (The lambda's captures shadow inverse and impl; Options keeps referring to the
  // caller's other arguments and to kAuto.)
  static const std::string kAuto = "auto";
  const Options o = [&, inverse = bwd ? !inverse : inverse, &impl = kAuto] { return ROPE_OPTIONS; }();
  Impl unused;
  NormRopeParams np;
  np.rope = make_params(bwd ? *grads : xs, outs, o, /*inplace=*/false, &unused);
  np.rope.copy_tail = true;
  np.eps = static_cast<float>(eps);
  np.weight_offset = static_cast<float>(weight_offset);
  // Weights keep their own dtype and stride (read once per block into fp32).
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& w = weights[i];
    np.weight[i] = w.data_ptr();
    np.weight_stride[i] = w.stride(0);
    np.weight_dtype[i] = w.scalar_type() == at::kHalf       ? DType::kFloat16
                         : w.scalar_type() == at::kBFloat16 ? DType::kBFloat16
                         : w.scalar_type() == at::kDouble   ? DType::kFloat64  // CPU, float64 x (gradcheck)
                                                            : DType::kFloat32;
  }

  std::vector<at::Tensor> partial;
  const int64_t D = xs[0].size(3);
  const bool on_cuda = xs[0].is_cuda();
  if (bwd) {
    np.backward = true;
    for (size_t i = 0; i < n; ++i) {
      np.x[i] = xs[i].data_ptr();
      for (int d = 0; d < 4; ++d) np.x_stride[i][d] = xs[i].stride(d);
    }
  }
  // Nothing to run only when every tensor is empty. A tensor with 0 heads next to a
  // non-empty one is dropped from the params with its weight and saved x (its weight
  // grad is zeros: its partial sums stay zero on the CPU, and the CUDA path returns
  // zeros for it): the other one is still normalised and rotated, and its dx and weight
  // grad written.
  bool empty = true;
  for (const auto& x : xs) empty = empty && x.numel() == 0;
  int kept[kMaxTensors] = {0, 1};
  if (!empty) {
    const int left = drop_empty_tensors(np.rope, kept);
    for (int j = 0; j < left; ++j) {
      const int i = kept[j];
      np.weight[j] = np.weight[i];
      np.weight_stride[j] = np.weight_stride[i];
      np.weight_dtype[j] = np.weight_dtype[i];
      np.x[j] = np.x[i];
      for (int d = 0; d < 4; ++d) np.x_stride[j][d] = np.x_stride[i][d];
    }
  }
  int64_t rows = 0;  // backward: rows of dw partial sums
  if (bwd) {
    const at::ScalarType acc = xs[0].scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    if (on_cuda) {
#ifdef ROPE_EXT_WITH_CUDA
      rows = norm_rope_cuda_partial_rows(np, nimpl, xs[0].element_size(), xs[0].device().index());
#endif
    } else {
      const int64_t groups = num_groups(np.rope), chunk = norm_rope_cpu_groups_per_chunk(np);
      rows = (groups + chunk - 1) / chunk;
    }
    // On CUDA every block writes its row of each kept tensor (no zero fill: one launch
    // fewer); a dropped tensor's weight grad is zeros below.
    for (size_t i = 0; i < n; ++i)
      partial.push_back(on_cuda ? at::empty({std::max<int64_t>(rows, 1), D}, xs[0].options().dtype(acc))
                                : at::zeros({std::max<int64_t>(rows, 1), D}, xs[0].options().dtype(acc)));
    for (int j = 0; j < np.rope.num_tensors; ++j) np.dweight_partial[j] = partial[kept[j]].data_ptr();
    np.dweight_rows = rows;
  }
  if (nimpl == NormRopeImpl::kTile && on_cuda) {
#ifdef ROPE_EXT_WITH_CUDA
    std::string why;
    TORCH_CHECK_VALUE(norm_rope_tile_eligible(np, xs[0].element_size(), &why),
                      msg("rope_ext: impl='tile' needs 16-byte vector access, but ", why, "; use impl='auto'"));
#endif
  }
  for (const auto& t : outs) maybe_poison(t);
  // (CUDA partial rows are empty: poisoned too, so a row no block wrote shows as NaN.)
  if (bwd && on_cuda)
    for (const auto& t : partial) maybe_poison(t);
  if (!empty) {
    if (on_cuda) {
#ifdef ROPE_EXT_WITH_CUDA
      run_norm_rope_cuda(np, nimpl, xs[0].scalar_type(), xs[0].device());
#else
      TORCH_CHECK(false, "rope_ext was built without CUDA; rebuild with nvcc available (see README)");
#endif
    } else {
      run_norm_rope_cpu(np, xs[0].scalar_type());
    }
  }
  if (bwd && on_cuda) {
#ifdef ROPE_EXT_WITH_CUDA
    // The weight grads: one launch sums the kept tensors' partial rows in fp32 and
    // stores each in its weight's dtype (zeros + two sums + two casts were 6 launches,
    // ~15 us of a small call in a CUDA graph; bench/NOTES.md, tenth session).
    std::vector<at::Tensor> dw(n);
    NormRopeDwSum a;
    a.rows = rows;
    a.D = D;
    a.num_tensors = empty ? 0 : np.rope.num_tensors;
    for (int j = 0; j < a.num_tensors; ++j) {
      const int i = kept[j];
      dw[i] = at::empty({D}, weights[i].options());
      a.partial[j] = static_cast<const float*>(partial[i].data_ptr());
      a.out[j] = dw[i].data_ptr();
      a.out_dtype[j] = np.weight_dtype[j];
    }
    for (size_t i = 0; i < n; ++i)
      if (!dw[i].defined()) dw[i] = at::zeros({D}, weights[i].options());
    if (a.num_tensors) run_norm_rope_dw_sum_cuda(a, xs[0].device());
    outs.insert(outs.end(), dw.begin(), dw.end());
#endif
  } else if (bwd) {
    for (size_t i = 0; i < n; ++i) outs.push_back(partial[i].sum(0).to(weights[i].scalar_type()));
  }
  return outs;
}

std::vector<at::Tensor> norm_rope(at::TensorList xs, at::TensorList weights, double eps, double weight_offset ROPE_PARAMS) {
  return run_norm_rope(nullptr, xs.vec(), weights.vec(), eps, weight_offset ROPE_FORWARD);
}

std::vector<at::Tensor> norm_rope_backward(at::TensorList grads, at::TensorList xs, at::TensorList weights, double eps,
                                           double weight_offset ROPE_PARAMS) {
  const std::vector<at::Tensor> g = grads.vec();
  TORCH_CHECK_VALUE(g.size() == xs.size(), msg("rope_ext: norm_rope_backward needs one gradient per tensor, got ",
                    g.size(), " for ", xs.size()));
  return run_norm_rope(&g, xs.vec(), weights.vec(), eps, weight_offset ROPE_FORWARD);
}

}  // namespace

// The eager path without the dispatcher (rope_ext/norm_rope.py): the same functions. The
// [B, S, H, D] forms of xs and the outputs' forms in the caller's layout are made here
// without view ops (layout_alias: ~1-2 us of host each through the dispatcher).
std::vector<at::Tensor> norm_rope_direct(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& weights,
                                         double eps, double weight_offset, int64_t layout ROPE_PARAMS) {
  std::vector<at::Tensor> x4;  // (layout_alias checks the code)
  for (const auto& t : xs) x4.push_back(layout_alias(t, layout, true));
  std::vector<at::Tensor> outs = norm_rope(x4, weights, eps, weight_offset ROPE_FORWARD);
  for (auto& t : outs) t = layout_alias(t, layout, false);
  return outs;
}

std::vector<at::Tensor> norm_rope_backward_direct(const std::vector<at::Tensor>& grads, const std::vector<at::Tensor>& xs,
                                                  const std::vector<at::Tensor>& weights, double eps,
                                                  double weight_offset ROPE_PARAMS) {
  return norm_rope_backward(grads, xs, weights, eps, weight_offset ROPE_FORWARD);
}

TORCH_LIBRARY_IMPL(rope_ext, CPU, m) {
  m.impl("norm_rope", &norm_rope);
  m.impl("norm_rope_backward", &norm_rope_backward);
}

TORCH_LIBRARY_IMPL(rope_ext, CUDA, m) {
  m.impl("norm_rope", &norm_rope);
  m.impl("norm_rope_backward", &norm_rope_backward);
}

// norm_rope_backward has no derivative (a double backward of norm_rope): this Autograd
// kernel makes backpropagating through it an error. Without it PyTorch's fallback only
// warns and treats the op as constant: silently wrong second derivatives.
TORCH_LIBRARY_IMPL(rope_ext, Autograd, m) {
  m.impl("norm_rope_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace rope_ext
