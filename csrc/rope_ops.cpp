// The rope ops: argument validation, the translation of tensors into RopeParams, the
// per-backend implementations (TORCH_LIBRARY_IMPL) and the eager fast path. The
// schemas and the pybind11 module are in registration.cpp.
//
// Every check runs on the host before any kernel. Shapes, dtypes, devices, strides
// and overlap need no device memory (no synchronization, CUDA-graph safe). Checks of
// index *values* (check_values) run for CPU tensors always and for CUDA tensors after
// rope_ext.set_value_checks(True); the kernels never read out of bounds either way.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <limits>
#include <sstream>

#ifdef ROPE_EXT_WITH_CUDA
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include "dispatch.h"
#include "op_utils.h"
#include "rope_ops.h"
#include "rope_math.h"

namespace rope_ext {
namespace {

Impl parse_impl(const std::string& name) {
  const auto& names = impl_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<Impl>(i);
  if (name == "auto") return Impl::kAuto;
  std::string m = "rope_ext: impl must be 'auto'";
  for (const auto& n : names) m += ", '" + n + "'";
  TORCH_CHECK_VALUE(false, m + "; got '" + name + "'");
}



// Checks of index *values* (op_utils.h says when they run): positions >= 0 and inside
// the cache, cu_seqlens monotone from 0 to T (times cp_size, each length a multiple of
// 2 * cp_size under context parallelism).
void check_values(const RopeParams& p, const Options& o) {
  // The last default index of each sequence (its global length - 1; positions start at
  // its offset).
  at::Tensor last = at::full({1}, p.S * p.cp_size - 1, at::kLong);
  if (o.cu_seqlens) {
    const at::Tensor cu = host_long(*o.cu_seqlens);
    last = cu.slice(0, 1) - cu.slice(0, 0, -1) - 1;
    const int64_t n = cu.numel(), cp = p.cp_size;
    const int64_t* c = cu.data_ptr<int64_t>();
    TORCH_CHECK_VALUE(c[0] == 0, msg("rope_ext: cu_seqlens must start at 0, got ", c[0]));
    if (cp == 1) {
      TORCH_CHECK_VALUE(c[n - 1] == p.S, msg("rope_ext: cu_seqlens must end at T = ", p.S,
                        " (the number of tokens), got ", c[n - 1]));
    } else {
      TORCH_CHECK_VALUE(c[n - 1] == p.S * cp, msg("rope_ext: with cp_size = ", cp, " cu_seqlens are the global "
                        "(padded) lengths and must end at T * cp_size = ", p.S * cp, ", got ", c[n - 1]));
    }
    for (int64_t i = 1; i < n; ++i) {
      TORCH_CHECK_VALUE(c[i] >= c[i - 1], msg("rope_ext: cu_seqlens must be non-decreasing, got ",
                        c[i - 1], " then ", c[i], " at index ", i));
      TORCH_CHECK_VALUE((c[i] - c[i - 1]) % (2 * cp) == 0 || cp == 1, msg("rope_ext: with cp_size = ", cp,
                        " every sequence length must be a multiple of 2 * cp_size = ", 2 * cp, ", got ",
                        c[i] - c[i - 1], " for sequence ", i - 1));
    }
  }
  if (p.S == 0) return;
  check_position_values(p, o.positions, o.offsets, o.offset, last);
}

// q and k (4-D [B, S, H, D]) share no element. Beyond separate buffers, this accepts
// disjoint head ranges of one buffer with the same strides (q and k sliced out of a
// fused qkv projection): then the union of both head ranges must itself be a
// non-overlapping view.
bool disjoint_heads(const at::Tensor& q, const at::Tensor& k) {
  // Separate storages never share an element. (get_overlap_status answers TooHard, not
  // No, for any view that is not dense, e.g. head slices of two different buffers.)
  if (!q.is_alias_of(k)) return true;
  const auto status = at::get_overlap_status(q, k);
  if (status == at::MemOverlapStatus::No) return true;
  if (status == at::MemOverlapStatus::Full || q.strides() != k.strides() || q.stride(2) == 0) return false;
  const int64_t delta = k.storage_offset() - q.storage_offset(), sh = q.stride(2);
  if (delta % sh) return false;
  const int64_t j = delta / sh, Hq = q.size(2), Hk = k.size(2);
  if (!(j >= Hq || j + Hk <= 0)) return false;
  const int64_t lo = std::min<int64_t>(0, j), hi = std::max<int64_t>(Hq, j + Hk);
  return non_overlapping({q.size(0), q.size(1), hi - lo, q.size(3)}, q.strides());
}

}  // namespace

// Validates everything and fills the params. outs[i] may be ins[i] (in place).
RopeParams make_params(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
                       const Options& o, bool inplace, Impl* impl_out) {
  const Impl impl = parse_impl(o.impl);
  const at::Tensor& x = ins[0];
  const char* names[2] = {ins.size() > 1 ? "q" : "x", "k"};
  for (size_t i = 0; i < ins.size(); ++i) {
    const at::Tensor& t = ins[i];
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf ||
                         t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kDouble, msg("rope_ext: ", names[i], " must be float32, float16, bfloat16 or float64, got ",
                     t.scalar_type()));
    TORCH_CHECK_VALUE(t.dim() == 4, msg("rope_ext: ", names[i],
                      " must be 4-D [B, S, H, D] after the layout transform, got shape ", shape_str(t)));
    if (i > 0) {
      TORCH_CHECK_VALUE(t.device() == x.device(), msg("rope_ext: q and k must be on the same device, got ",
                        x.device(), " and ", t.device()));
      TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), msg("rope_ext: q and k must have the same dtype, got ",
                       x.scalar_type(), " and ", t.scalar_type()));
      TORCH_CHECK_VALUE(t.size(0) == x.size(0) && t.size(1) == x.size(1) && t.size(3) == x.size(3), msg("rope_ext: q and k must agree in every dimension but heads, got q ",
                        shape_str(x), " and k ", shape_str(t)));
    }
    TORCH_CHECK_VALUE(x.is_cpu() || x.is_cuda(), msg("rope_ext: x must be a CPU or CUDA tensor, got ", x.device()));
  }
  RopeParams p;
  p.num_tensors = static_cast<int>(ins.size());
  p.B = x.size(0);
  p.S = x.size(1);
  fill_rotary(p, x, x.size(3), o.rotary_dim, o.interleaved, o.inv_freq, o.cos_sin_cache, o.base, o.scale,
              /*base_as_tensor=*/true);
  const int64_t R = p.R;
  p.copy_tail = !inplace;
  p.sign = o.inverse ? -1.f : 1.f;
  for (size_t i = 0; i < ins.size(); ++i) {
    TensorView& v = p.t[i];
    v.in = ins[i].data_ptr();
    v.out = outs[i].data_ptr();
    v.H = ins[i].size(2);
    for (int d = 0; d < 4; ++d) {
      v.in_stride[d] = ins[i].stride(d);
      v.out_stride[d] = outs[i].stride(d);
    }
  }


  // Position axes (M-RoPE, axial): sections = pairs per axis, summing to R/2.
  const int64_t A = static_cast<int64_t>(o.sections.size());
  if (A > 0) {
    TORCH_CHECK_VALUE(A <= kMaxAxes, msg("rope_ext: at most ", kMaxAxes, " position axes (sections), got ", A));
    int64_t sum = 0;
    for (int64_t a = 0; a < A; ++a) {
      TORCH_CHECK_VALUE(o.sections[a] >= 0, msg("rope_ext: sections must be >= 0, got ", fmt_one(o.sections)));
      sum += o.sections[a];
      p.section[a] = static_cast<int32_t>(o.sections[a]);
    }
    TORCH_CHECK_VALUE(sum == R / 2, msg("rope_ext: sections must sum to rotary_dim / 2 = ", R / 2,
                      " (pairs per position axis), got ", fmt_one(o.sections), " (sum ", sum, ")"));
    TORCH_CHECK_VALUE(!o.sections_interleaved || A == 3, msg("rope_ext: interleaved sections (Qwen3-VL M-RoPE) "
                      "need 3 axes [t, h, w], got ", fmt_one(o.sections)));
    TORCH_CHECK_VALUE(o.positions.has_value(), "rope_ext: sections (M-RoPE / axial) need positions of shape [axes, B, S] or [axes, S]");
    p.num_axes = static_cast<int32_t>(A);
    p.axes_interleaved = o.sections_interleaved;
  }

  // Positions.
  TORCH_CHECK_VALUE(!(o.positions && o.cu_seqlens),
                    "rope_ext: give positions or cu_seqlens, not both");
  if (o.positions) {
    const at::Tensor& pt = *o.positions;
    check_index(pt, "positions", x);
    // With axes the first dimension indexes them: [A, B, S] or [A, S].
    const int64_t lead = A > 0 ? 1 : 0;
    const int64_t pd = pt.dim() - lead;
    const bool axes_ok = A == 0 || (pt.dim() >= 1 && pt.size(0) == A);
    const bool ok = axes_ok && ((pd == 1 && pt.size(lead) == p.S) ||
                                (pd == 2 && (pt.size(lead) == p.B || pt.size(lead) == 1) && pt.size(lead + 1) == p.S));
    if (A > 0) {
      TORCH_CHECK_VALUE(ok, msg("rope_ext: positions must have shape [axes, B, S] = [", A, ", ", p.B, ", ", p.S,
                        "] or [axes, S] = [", A, ", ", p.S, "] (one row per section), got ", shape_str(pt)));
    } else {
      TORCH_CHECK_VALUE(ok, msg("rope_ext: positions must have shape [B, S] = [", p.B, ", ", p.S, "] or [S] = [",
                        p.S, "], got ", shape_str(pt)));
    }
    p.positions = index_array(pt, pt.stride(-1));
    p.pos_stride_b = (pd == 2 && pt.size(lead) == p.B) ? pt.stride(lead) : 0;
    p.pos_stride_axis = A > 0 ? pt.stride(0) : 0;
  }
  if (o.cu_seqlens) {
    const at::Tensor& cu = *o.cu_seqlens;
    check_index(cu, "cu_seqlens", x);
    TORCH_CHECK_VALUE(cu.dim() == 1 && cu.size(0) >= 2, msg("rope_ext: cu_seqlens must be 1-D [N + 1] with N >= 1 sequences, got shape ", shape_str(cu)));
    TORCH_CHECK_VALUE(p.B == 1, msg("rope_ext: cu_seqlens needs packed tokens (layout 'thd'), got B = ", p.B));
    p.cu_seqlens = index_array(cu, cu.stride(0));
    p.num_seqs = cu.size(0) - 1;
  }
  fill_offsets(p, o.positions.has_value(), o.offsets, o.offset, o.cu_seqlens ? p.num_seqs : p.B,
               o.cu_seqlens ? "sequence of cu_seqlens" : "batch entry", x, "x");

  // Context parallelism: the kernel maps local indices to global positions.
  TORCH_CHECK_VALUE(o.cp_size >= 1 && o.cp_size < (int64_t(1) << 20), msg("rope_ext: cp_size must be >= 1, got ", o.cp_size));
  TORCH_CHECK_VALUE(o.cp_rank >= 0 && o.cp_rank < o.cp_size, msg("rope_ext: cp_rank must be in [0, cp_size = ",
                    o.cp_size, "), got ", o.cp_rank));
  if (o.cp_size > 1) {
    TORCH_CHECK_VALUE(!o.positions, "rope_ext: give positions or cp_size/cp_rank, not both (positions are already "
                      "global; rope_ext.context_parallel_positions builds them)");
    TORCH_CHECK_VALUE(o.cu_seqlens || p.S % 2 == 0, msg("rope_ext: with cp_size = ", o.cp_size, " the local sequence "
                      "holds two chunks, so its length must be even, got S = ", p.S));
    p.cp_size = static_cast<int32_t>(o.cp_size);
    p.cp_rank = static_cast<int32_t>(o.cp_rank);
  }
  p.pos_shared_b = p.B == 1 || (o.positions ? p.pos_stride_b == 0 : !o.offsets);
  // Rows of one group (NB batches x heads of q and k) are indexed in 32 bits.
  const int64_t heads = heads_total(p);
  TORCH_CHECK_VALUE(heads < (int64_t(1) << 31), msg("rope_ext: at most 2^31 - 1 heads, got ", heads));
  if (p.B * heads >= (int64_t(1) << 31)) p.pos_shared_b = false;

  // In place: every output element must have its own memory, or rows would race.
  if (inplace) {
    for (size_t i = 0; i < ins.size(); ++i)
      TORCH_CHECK_VALUE(non_overlapping(ins[i].sizes(), ins[i].strides()), msg("rope_ext: in-place needs ", names[i],
                        " with non-overlapping memory (not an expand()ed view), got a view whose [B, S, H, D] form "
                        "has shape ", shape_str(ins[i]), " and strides ", ins[i].strides()));
    if (ins.size() > 1)
      TORCH_CHECK_VALUE(disjoint_heads(ins[0], ins[1]),
                        "rope_ext: in-place q and k must not share memory (disjoint head slices of one buffer are fine)");
    TORCH_CHECK_VALUE(impl != Impl::kNaive,
                      "rope_ext: impl='naive' cannot run in place (each thread reads its partner element, "
                      "which another thread may already have written); use 'fp32', 'fp32x4' or 'auto'");
  }
  if (impl == Impl::kFp32x4 || impl == Impl::kFp32x4Tile || impl == Impl::kFlat) {
    std::string why;
    TORCH_CHECK_VALUE(vector_eligible(p, x.element_size(), &why), msg("rope_ext: impl='", o.impl, "' needs 16-byte vector access, but ", why,
                      "; use impl='auto' (falls back to the scalar kernel) or make x contiguous"));
  }
  if (check_values_of(x)) check_values(p, o);
  *impl_out = impl;
  return p;
}

namespace {

void run(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs, const Options& o, bool inplace) {
  Impl impl;
  RopeParams p = make_params(ins, outs, o, inplace, &impl);
  if (!inplace)
    for (const auto& t : outs) maybe_poison(t);
  // Nothing to do only when every input is empty: q with 0 heads still leaves k to
  // rotate (and the other way round). The empty one is dropped from the params, so
  // the backends only ever see tensors with rows.
  bool all_empty = true;
  for (const auto& t : ins) all_empty = all_empty && t.numel() == 0;
  if (all_empty) return;
  int kept[kMaxTensors];
  drop_empty_tensors(p, kept);
  if (ins[0].is_cuda()) {
#ifdef ROPE_EXT_WITH_CUDA
    run_cuda(p, impl, ins[0].scalar_type(), ins[0].device());
#else
    TORCH_CHECK(false, "rope_ext was built without CUDA; rebuild with nvcc available (see README)");
#endif
  } else {
    run_cpu(p, impl, ins[0].scalar_type());
  }
}

at::Tensor rope(const at::Tensor& x ROPE_PARAMS) {
  at::Tensor out = at::empty_like(x);
  run({x}, {out}, ROPE_OPTIONS, false);
  return out;
}

void rope_(const at::Tensor& x ROPE_PARAMS) { run({x}, {x}, ROPE_OPTIONS, true); }

std::tuple<at::Tensor, at::Tensor> rope_qk(const at::Tensor& q, const at::Tensor& k ROPE_PARAMS) {
  at::Tensor qo = at::empty_like(q), ko = at::empty_like(k);
  run({q, k}, {qo, ko}, ROPE_OPTIONS, false);
  return {qo, ko};
}

void rope_qk_(const at::Tensor& q, const at::Tensor& k ROPE_PARAMS) {
  run({q, k}, {q, k}, ROPE_OPTIONS, true);
}

// The eager entries' layout code (an index of kLayouts), checked once here.
const LayoutInfo& layout_info(int64_t layout) {
  TORCH_CHECK_VALUE(layout >= 0 && layout < kNumLayouts, msg("rope_ext: layout code must be in [0, ", kNumLayouts,
                    "), got ", layout));
  return kLayouts[layout];
}

}  // namespace

// x's [B, S, H, D] form (to_bshd) or, from that form, the caller's layout: the sizes and
// strides unsqueeze(0) / squeeze(0) / permute give, on a new tensor of x's storage made
// without the dispatcher (a view op through it cost ~1-2 us of host each: rope_direct
// out of place on thd took ~8 us more than in place, its two views a tensor, run 1 of the
// twenty-fifth session, bench/overhead.py). Autograd does not see it as a view of x: only
// for the eager entries' own forms of their inputs and for their fresh outputs
// (rope_direct, norm_rope_direct).
at::Tensor layout_alias(const at::Tensor& x, int64_t layout, bool to_bshd) {
  const LayoutInfo& l = layout_info(layout);
  const bool thd = layout == kLayoutTHD;
  if (!thd && !l.permuted) return x;
  const int64_t rank = thd ? (to_bshd ? 3 : 4) : 4;
  TORCH_CHECK_VALUE(x.dim() == rank && x.layout() == at::kStrided,
                    msg("rope_ext: layout '", l.name, "' needs a ", rank, "-D strided tensor, got shape ", shape_str(x)));
  // The alias keeps x's dispatch keys: a quantized tensor's would send empty_like to the
  // quantized kernels with a plain TensorImpl (a crash); negated / conjugated views carry a
  // bit the raw memory does not (the Python side takes the ops for these).
  TORCH_CHECK_TYPE(!x.is_quantized() && !x.is_neg() && !x.is_conj() && !x._is_zerotensor(),
                   "rope_ext: the eager entry takes plain float tensors (not quantized, negated, conjugated or "
                   "zero views); call .clone() or .resolve_neg() first");
  TORCH_CHECK(!thd || to_bshd || x.size(0) == 1, "rope_ext: internal error: thd output form of batch ", x.size(0));
  int64_t size[4], stride[4];
  if (thd && to_bshd) {  // unsqueeze(0): the new dim's stride is size(0) * stride(0)
    size[0] = 1;
    stride[0] = x.size(0) * x.stride(0);
    for (int d = 0; d < 3; ++d) size[d + 1] = x.size(d), stride[d + 1] = x.stride(d);
  } else if (thd) {  // squeeze(0) of the size-1 batch
    for (int d = 0; d < 3; ++d) size[d] = x.size(d + 1), stride[d] = x.stride(d + 1);
  } else {  // permute (each permutation is its own inverse)
    for (int d = 0; d < 4; ++d) size[d] = x.size(l.perm[d]), stride[d] = x.stride(l.perm[d]);
  }
  const int64_t n = thd && !to_bshd ? 3 : 4;
  at::Tensor a = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(x.storage()), x.key_set(), x.dtype());
  a.unsafeGetTensorImpl()->set_sizes_and_strides(c10::IntArrayRef(size, n), c10::IntArrayRef(stride, n),
                                                  x.storage_offset());
  return a;
}

// The eager fast path (rope_ext/api.py calls it when nothing needs the dispatcher: no
// autograd, no torch.compile, no tensor subclass or mode): the same run() as the ops,
// without the boxed dispatcher hops and the Python-side views, which cost most of a
// decode-sized call (bench/overhead.py). layout: an index of kLayouts (rope_ops.h; ranks
// checked by the caller; the op path applies the same permutations in Python, from
// _C.layouts(), so that autograd and torch.compile see the views). In place: bumps the
// version counters as the ADInplaceOrView kernel below does for the ops.
std::vector<at::Tensor> rope_direct(const std::vector<at::Tensor>& xs, int64_t layout, bool inplace ROPE_PARAMS) {
  TORCH_CHECK_VALUE(xs.size() == 1 || xs.size() == 2, "rope_ext: one or two tensors");
  const LayoutInfo& l = layout_info(layout);
  if (xs.size() == 2 && xs[0].dim() == xs[1].dim()) {
    // Reported in the caller's layout (make_params sees the [B, S, H, D] views); the
    // same check and message as rope_ext/_args.py's _check_qk_shapes on the op path.
    bool ok = true;
    for (int64_t d = 0; d < xs[0].dim(); ++d)
      if (d != l.head_dim && xs[0].size(d) != xs[1].size(d)) ok = false;
    TORCH_CHECK_VALUE(ok, msg("rope_ext: q and k must agree in every dimension but heads (layout '", l.name, "' ",
                              l.dims, "), got q ", shape_str(xs[0]), " and k ", shape_str(xs[1])));
  }
  std::vector<at::Tensor> x4;
  for (const auto& t : xs) x4.push_back(layout_alias(t, layout, true));
  if (inplace) {
    for (size_t i = 0; i < xs.size(); ++i) check_writable(xs[i], xs.size() == 1 ? "x" : i == 0 ? "q" : "k");
    run(x4, x4, ROPE_OPTIONS, true);
    for (const auto& t : xs) torch::autograd::impl::bump_version(t);  // (inference tensors: no-op in inference mode)
    return {};
  }
  // The outputs as the op path makes them (empty_like of the [B, S, H, D] form), returned
  // in the caller's layout.
  std::vector<at::Tensor> outs;
  for (const auto& t : x4) outs.push_back(at::empty_like(t));
  run(x4, outs, ROPE_OPTIONS, false);
  for (auto& t : outs) t = layout_alias(t, layout, false);
  return outs;
}

// HF's float32 default frequencies, with the ATen ops transformers writes, on the CPU:
//   1.0 / (base ** (torch.arange(0, R, 2, dtype=torch.int64).to(torch.float) / R))
// (Python's `1.0 / t` is t.reciprocal() * 1.0 and `base ** t` is pow(Scalar, Tensor)).
// Cached per (base, R): one lookup per call after the first.
const std::vector<float>& hf_default_freqs(double base, int64_t R) {
  thread_local double last_base = -1.0;
  thread_local int64_t last_R = -1;
  thread_local const std::vector<float>* last = nullptr;
  if (last && last_base == base && last_R == R) return *last;
  static std::mutex mu;
  static auto* tables = new std::map<std::pair<double, int64_t>, std::vector<float>>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  auto it = tables->find({base, R});
  if (it == tables->end()) {
    // Plain CPU tensors: no autograd, no Python mode or tracer may see these ops.
    c10::impl::ExcludeDispatchKeyGuard no_python(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const at::Tensor e = at::arange(0, R, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat).div(R);
    const at::Tensor f = at::pow(at::Scalar(base), e).reciprocal().mul(at::Scalar(1.0)).contiguous();
    it = tables->emplace(std::make_pair(base, R), std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel())).first;
  }
  last_base = base;
  last_R = R;
  last = &it->second;
  return it->second;
}

// The same table as a tensor on `device` (cached per base, R and device; never freed,
// so the pointers stay valid). Creating it copies from the host, which a stream being
// captured into a CUDA graph may not do: with create = false a missing table gives
// nullptr. A per-thread last hit keeps the eager call off the mutex and the map.
const at::Tensor* hf_default_freqs_tensor(double base, int64_t R, c10::Device device, bool create) {
  using Key = std::tuple<double, int64_t, int, int>;  // base, R, device type, device index
  const Key key{base, R, static_cast<int>(device.type()), device.index()};
  thread_local Key last_key{0.0, -1, -1, -1};
  thread_local const at::Tensor* last = nullptr;
  if (last && key == last_key) return last;
  static std::mutex mu;
  static auto* tensors = new std::map<Key, at::Tensor>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = tensors->find(key);
  if (it == tensors->end()) {
    if (!create) return nullptr;
    const std::vector<float>& host = hf_default_freqs(base, R);
    c10::impl::ExcludeDispatchKeyGuard no_python(
        c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor t = at::from_blob(const_cast<float*>(host.data()), {static_cast<int64_t>(host.size())},
                                 at::TensorOptions().dtype(at::kFloat)).clone().to(device);
    it = tensors->emplace(key, t).first;
  }
  last_key = key;
  last = &it->second;
  return last;
}

namespace {
// Is the current stream of `device` being captured into a CUDA graph?
bool capturing(c10::Device device) {
#ifdef ROPE_EXT_WITH_CUDA
  if (device.is_cuda()) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const c10::cuda::CUDAGuard guard(device);
    C10_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()).stream(), &status));
    return status != cudaStreamCaptureStatusNone;
  }
#endif
  (void)device;
  return false;
}
}  // namespace

// Where the rope kernels read kBase frequencies from (issue 19, bench/NOTES.md run 8):
// the params' table (constant memory: 32 lanes reading 32 words is a divergent,
// replayed constant access) or the cached device tensor (one coalesced global load in
// flight with the x loads; and variant 6, lean, reads only tensors). Measured: the
// tensor 0.1-0.3 us faster up to 2 MB, equal above. ROPE_EXT_FREQ_TABLE=params|tensor
// (default tensor) at import, for such A/B runs.
const bool kFreqsFromTensor = [] {
  const char* e = std::getenv("ROPE_EXT_FREQ_TABLE");
  return !(e && std::string(e) == "params");
}();

void fill_frequencies(RopeParams& p, const at::Tensor& x, const std::optional<at::Tensor>& inv_freq,
                      const std::optional<at::Tensor>& cos_sin_cache, double base, bool base_as_tensor) {
  const int64_t R = p.R;
  TORCH_CHECK_VALUE(!(inv_freq && cos_sin_cache),
                    "rope_ext: give one frequency source: base, inv_freq or cos_sin_cache");
  if (inv_freq) {
    const at::Tensor& f = *inv_freq;
    TORCH_CHECK_TYPE(f.scalar_type() == at::kFloat, msg("rope_ext: inv_freq must be float32, got ", f.scalar_type()));
    check_device(f, "inv_freq", x);
    TORCH_CHECK_VALUE(f.dim() == 1 && f.size(0) == R / 2, msg("rope_ext: inv_freq must have shape [rotary_dim / 2] = [",
                      R / 2, "], got ", shape_str(f)));
    p.freq = FreqSource::kInvFreq;
    p.inv_freq = f.data_ptr<float>();
    p.inv_freq_stride = f.stride(0);
  } else if (cos_sin_cache) {
    const at::Tensor& c = *cos_sin_cache;
    TORCH_CHECK_TYPE(c.scalar_type() == at::kFloat || c.scalar_type() == at::kHalf || c.scalar_type() == at::kBFloat16, msg("rope_ext: cos_sin_cache must be float32, float16 or bfloat16, got ", c.scalar_type()));
    check_device(c, "cos_sin_cache", x);
    TORCH_CHECK_VALUE(c.dim() == 2 && c.size(1) == R, msg("rope_ext: cos_sin_cache must have shape [max_position, rotary_dim = ",
                      R, "] (cos in the first rotary_dim/2 columns, sin in the rest), got ", shape_str(c)));
    // An empty table holds no position; a kernel's guarded read of row 0 (lean's) would
    // go through a null pointer.
    TORCH_CHECK_VALUE(c.size(0) > 0, msg("rope_ext: cos_sin_cache has no rows (shape ", shape_str(c),
                      "): every position would be outside it"));
    p.freq = FreqSource::kCosSinCache;
    p.cache = c.data_ptr();
    p.cache_dtype = to_dtype(c.scalar_type());
    p.cache_rows = c.size(0);
    p.cache_stride_row = c.stride(0);
    p.cache_stride_col = c.stride(1);
  } else {
    TORCH_CHECK_VALUE(base > 0 && std::isfinite(base), msg("rope_ext: base must be a positive finite number, got ", base));
    // A table too large for the params must be a tensor (the first use on a device
    // creates it: warm up before capturing a graph); with base_as_tensor a small one is
    // read from the tensor on CUDA when it exists or can be made now (not while the
    // stream is captured), else from the params (the same values: the same bits).
    const bool fits = R / 2 <= RopeParams::kParamFreqs;
    const at::Tensor* f = nullptr;
    if (!fits || (base_as_tensor && x.is_cuda() && kFreqsFromTensor)) {
      f = hf_default_freqs_tensor(base, R, x.device(), /*create=*/false);
      if (!f && (!fits || !capturing(x.device()))) f = hf_default_freqs_tensor(base, R, x.device(), /*create=*/true);
    }
    if (f) {
      p.freq = FreqSource::kInvFreq;
      p.inv_freq = f->data_ptr<float>();
      p.inv_freq_stride = 1;
    } else {
      const std::vector<float>& h = hf_default_freqs(base, R);
      std::copy(h.begin(), h.end(), p.base_freqs);
      p.freq = FreqSource::kBase;
    }
  }
}

// ---------------------------------------------------------------------------- the shared rotary options
// One validation of the options every family takes (rope and norm+rope through
// make_params, the attention family directly).

void fill_rotary(RopeParams& p, const at::Tensor& x, int64_t D, int64_t rotary_dim, bool interleaved,
                 const std::optional<at::Tensor>& inv_freq, const std::optional<at::Tensor>& cos_sin_cache, double base,
                 double attention_factor, bool base_as_tensor) {
  TORCH_CHECK_VALUE(D % 2 == 0 && D > 0, msg("rope_ext: the head dim D must be even and > 0, got D = ", D));
  // The rope kernels keep [R/2] frequencies, sins and cosines in shared memory (48 KB).
  TORCH_CHECK_VALUE(D <= 8192, msg("rope_ext: the head dim D must be at most 8192, got ", D));
  const int64_t R = rotary_dim < 0 ? D : rotary_dim;
  TORCH_CHECK_VALUE(R > 0 && R % 2 == 0 && R <= D, msg("rope_ext: rotary_dim must be even and in (0, D = ", D, "], got ",
                    rotary_dim));
  p.D = static_cast<int32_t>(D);
  p.R = static_cast<int32_t>(R);
  p.interleaved = interleaved;
  p.copy_tail = true;
  fill_frequencies(p, x, inv_freq, cos_sin_cache, base, base_as_tensor);
  TORCH_CHECK_VALUE(std::isfinite(attention_factor), msg("rope_ext: attention_factor must be finite, got ",
                    attention_factor));
  p.scale = static_cast<float>(attention_factor);
}

void fill_offsets(RopeParams& p, bool has_positions, const std::optional<at::Tensor>& offsets, int64_t offset, int64_t n,
                  const char* per, const at::Tensor& x, const char* xname) {
  TORCH_CHECK_VALUE(!(has_positions && (offsets || offset != 0)),
                    "rope_ext: give positions or offsets, not both (positions are absolute)");
  if (offsets) {
    check_index(*offsets, "offsets", x, xname);
    TORCH_CHECK_VALUE(offsets->dim() == 1 && offsets->size(0) == n, msg("rope_ext: offsets must have shape [", n,
                      "] (one per ", per, "), got ", shape_str(*offsets)));
    p.offsets = index_array(*offsets, offsets->stride(0));
  }
  p.offset = offset;
}

void check_position_values(const RopeParams& p, const std::optional<at::Tensor>& positions,
                           const std::optional<at::Tensor>& offsets, int64_t offset, const at::Tensor& last_index) {
  int64_t lo = 0, hi = -1;
  if (positions) {
    if (positions->numel() == 0) return;
    const at::Tensor pt = host_long(*positions);
    lo = pt.min().item<int64_t>();
    hi = pt.max().item<int64_t>();
    TORCH_CHECK_VALUE(lo >= 0, msg("rope_ext: positions must be >= 0, got ", lo));
  } else {
    const at::Tensor off = offsets ? host_long(*offsets) : at::full({1}, offset, at::kLong);
    if (off.numel()) {
      lo = off.min().item<int64_t>();
      TORCH_CHECK_VALUE(lo >= 0, msg("rope_ext: offsets must be >= 0, got ", lo));
    }
    if (last_index.numel() && off.numel()) {
      // Both are >= 0 where it matters (empty sequences carry a large negative sentinel),
      // so a sum below its index wrapped past int64: a position no kernel can represent.
      const at::Tensor sum = last_index + off;
      TORCH_CHECK_VALUE(!((sum < last_index) & (off > 0)).any().item<bool>(),
                        msg("rope_ext: offsets too large: a position (offset + index) overflows int64"));
      hi = sum.max().item<int64_t>();
    }
  }
  if (p.freq == FreqSource::kCosSinCache && hi >= 0)
    TORCH_CHECK_VALUE(hi < p.cache_rows, msg("rope_ext: positions must be < ", p.cache_rows,
                      " (the rows of cos_sin_cache), got ", hi));
}

int drop_empty_tensors(RopeParams& p, int kept[kMaxTensors]) {
  int n = 0;
  for (int t = 0; t < p.num_tensors; ++t) {
    if (p.t[t].H == 0) continue;
    if (n != t) p.t[n] = p.t[t];
    kept[n++] = t;
  }
  p.num_tensors = n;
  return n;
}

std::atomic<bool>& device_value_checks() {
  static std::atomic<bool> on{false};
  return on;
}
std::atomic<bool>& poison_outputs() {
  static std::atomic<bool> on{false};
  return on;
}

bool vector_eligible(const RopeParams& p, int64_t elem_size, std::string* why) {
  const int64_t V = 16 / elem_size;
  auto fail = [&](const std::string& m) {
    if (why) *why = m;
    return false;
  };
  if (p.interleaved ? p.R % V : (p.R / 2) % V)
    return fail("rotary_dim " + std::to_string(p.R) + " does not split into 16-byte chunks of each half");
  if (p.copy_tail && (p.D - p.R) % V)
    return fail("the pass-through features D - rotary_dim = " + std::to_string(p.D - p.R) +
                " do not split into 16-byte chunks");
  const int64_t sizes[3] = {p.B, p.S, 0};
  for (int t = 0; t < p.num_tensors; ++t) {
    const TensorView& v = p.t[t];
    if (v.H == 0) continue;  // no rows: nothing is read or written (run() drops it)
    const int64_t dims[3] = {sizes[0], sizes[1], v.H};
    if (v.in_stride[3] != 1 || v.out_stride[3] != 1) return fail("the feature (last) stride is not 1");
    if (reinterpret_cast<uintptr_t>(v.in) % 16 || reinterpret_cast<uintptr_t>(v.out) % 16)
      return fail("the data pointer is not 16-byte aligned");
    for (int d = 0; d < 3; ++d)
      if (dims[d] > 1 && (v.in_stride[d] % V || v.out_stride[d] % V))
        return fail("a stride is not a multiple of " + std::to_string(V) + " elements");
  }
  return true;
}

// The in-place ops bump the version counter of what they write, so autograd notices
// a tensor it saved being overwritten (a stale counter silently corrupts gradients).
void bump_written(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size(), first = stack->size() - n;
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < n; ++i)
    if (args[i].alias_info() && args[i].alias_info()->isWrite()) written.push_back((*stack)[first + i].toTensor());
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const auto& t : written) torch::autograd::impl::bump_version(t);
}

}  // namespace rope_ext

// One implementation per backend key: the op functions branch to run_cpu / run_cuda.
TORCH_LIBRARY_IMPL(rope_ext, CPU, m) {
  m.impl("rope", &rope_ext::rope);
  m.impl("rope_", &rope_ext::rope_);
  m.impl("rope_qk", &rope_ext::rope_qk);
  m.impl("rope_qk_", &rope_ext::rope_qk_);
}

TORCH_LIBRARY_IMPL(rope_ext, ADInplaceOrView, m) {
  m.impl("rope_", torch::CppFunction::makeFromBoxedFunction<&rope_ext::bump_written>());
  m.impl("rope_qk_", torch::CppFunction::makeFromBoxedFunction<&rope_ext::bump_written>());
}

#ifdef ROPE_EXT_WITH_CUDA
TORCH_LIBRARY_IMPL(rope_ext, CUDA, m) {
  m.impl("rope", &rope_ext::rope);
  m.impl("rope_", &rope_ext::rope_);
  m.impl("rope_qk", &rope_ext::rope_qk);
  m.impl("rope_qk_", &rope_ext::rope_qk_);
}
#endif
