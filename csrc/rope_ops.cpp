// The torch op registration: schemas (TORCH_LIBRARY), argument validation, the
// translation of tensors into RopeParams, the per-backend implementations
// (TORCH_LIBRARY_IMPL) and the pybind11 module.
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
#include <limits>
#include <sstream>

#include "dispatch.h"
#include "rope_math.h"

namespace rope_ext {
namespace {

// Error messages are assembled here with std::to_string and passed to TORCH_CHECK as
// one string: c10::str's ostringstream formatting of numbers was seen to segfault
// inside this extension on one PyTorch image (torch 2.11 on the H100 box), while a
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

std::string shape_str(const at::Tensor& t) { return fmt_one(t.sizes()); }

Impl parse_impl(const std::string& name) {
  const auto& names = impl_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<Impl>(i);
  if (name == "auto") return Impl::kAuto;
  std::string m = "rope_ext: impl must be 'auto'";
  for (const auto& n : names) m += ", '" + n + "'";
  TORCH_CHECK_VALUE(false, m + "; got '" + name + "'");
}

DType to_dtype(at::ScalarType s) {
  return s == at::kHalf ? DType::kFloat16 : s == at::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
}

void check_device(const at::Tensor& t, const char* name, const at::Tensor& x) {
  TORCH_CHECK_VALUE(t.device() == x.device(), msg("rope_ext: ", name, " must be on ", x.device(),
                    " (the device of x), got ", t.device()));
}

void check_index(const at::Tensor& t, const char* name, const at::Tensor& x) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, msg("rope_ext: ", name,
                   " must be an int32 or int64 tensor, got ", t.scalar_type()));
  check_device(t, name, x);
}

IndexArray index_array(const at::Tensor& t, int64_t stride) {
  IndexArray a;
  a.ptr = t.data_ptr();
  a.stride = stride;
  a.is64 = t.scalar_type() == at::kLong;
  return a;
}

struct Options {
  const std::optional<at::Tensor>& positions;
  const std::optional<at::Tensor>& offsets;
  const std::optional<at::Tensor>& cu_seqlens;
  const std::optional<at::Tensor>& inv_freq;
  const std::optional<at::Tensor>& cos_sin_cache;
  int64_t offset;
  double base;
  int64_t rotary_dim;
  bool interleaved;
  bool inverse;
  const std::string& impl;
};

// Checks of index *values*: positions >= 0 and inside the cache, cu_seqlens monotone
// from 0 to T. Free for CPU tensors, so always run there. For CUDA tensors they need a
// device->host copy (a synchronization, which CUDA-graph capture forbids), so they run
// only after rope_ext.set_value_checks(True); the kernels never read out of bounds
// either way (a cache position outside the table gives NaN rows).
std::atomic<bool> g_check_device_values{false};

void check_values(const RopeParams& p, const Options& o) {
  auto host = [](const at::Tensor& t) { return t.to(at::kCPU, at::kLong); };
  if (o.cu_seqlens) {
    const at::Tensor cu = host(*o.cu_seqlens).contiguous();
    const int64_t n = cu.numel();
    const int64_t* c = cu.data_ptr<int64_t>();
    TORCH_CHECK_VALUE(c[0] == 0, msg("rope_ext: cu_seqlens must start at 0, got ", c[0]));
    TORCH_CHECK_VALUE(c[n - 1] == p.S, msg("rope_ext: cu_seqlens must end at T = ", p.S,
                      " (the number of tokens), got ", c[n - 1]));
    for (int64_t i = 1; i < n; ++i)
      TORCH_CHECK_VALUE(c[i] >= c[i - 1], msg("rope_ext: cu_seqlens must be non-decreasing, got ",
                        c[i - 1], " then ", c[i], " at index ", i));
  }
  if (p.S == 0) return;
  // Smallest and largest position actually used.
  int64_t lo = 0, hi = 0;
  if (o.positions) {
    if (o.positions->numel() == 0) return;
    const at::Tensor pt = host(*o.positions);
    lo = pt.min().item<int64_t>();
    hi = pt.max().item<int64_t>();
    TORCH_CHECK_VALUE(lo >= 0, msg("rope_ext: positions must be >= 0, got ", lo));
  } else {
    at::Tensor start = o.offsets ? host(*o.offsets) : at::full({1}, o.offset, at::kLong);
    lo = start.min().item<int64_t>();
    TORCH_CHECK_VALUE(lo >= 0, msg("rope_ext: offsets must be >= 0, got ", lo));
    at::Tensor len = at::full({1}, p.S, at::kLong);
    if (o.cu_seqlens) {
      const at::Tensor cu = host(*o.cu_seqlens);
      len = cu.slice(0, 1) - cu.slice(0, 0, -1);
    }
    hi = (start + len - 1).max().item<int64_t>();  // last position of each sequence
  }
  if (p.freq == FreqSource::kCosSinCache)
    TORCH_CHECK_VALUE(hi < p.cache_rows, msg("rope_ext: positions must be < ", p.cache_rows,
                      " (the rows of cos_sin_cache), got ", hi));
}

// A strided view whose elements are all distinct: sorted by stride, each dimension
// steps over everything the smaller ones span (sufficient, and true of every slice,
// permutation or transpose of a dense buffer).
bool non_overlapping(at::IntArrayRef sizes, at::IntArrayRef strides) {
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

// q and k (4-D [B, S, H, D]) share no element. Beyond separate buffers, this accepts
// disjoint head ranges of one buffer with the same strides (q and k sliced out of a
// fused qkv projection): then the union of both head ranges must itself be a
// non-overlapping view.
bool disjoint_heads(const at::Tensor& q, const at::Tensor& k) {
  const auto status = at::get_overlap_status(q, k);
  if (status == at::MemOverlapStatus::No) return true;
  if (status == at::MemOverlapStatus::Full || q.strides() != k.strides() || q.stride(2) == 0) return false;
  if (!q.is_alias_of(k)) return false;
  const int64_t delta = k.storage_offset() - q.storage_offset(), sh = q.stride(2);
  if (delta % sh) return false;
  const int64_t j = delta / sh, Hq = q.size(2), Hk = k.size(2);
  if (!(j >= Hq || j + Hk <= 0)) return false;
  const int64_t lo = std::min<int64_t>(0, j), hi = std::max<int64_t>(Hq, j + Hk);
  return non_overlapping({q.size(0), q.size(1), hi - lo, q.size(3)}, q.strides());
}

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
  const int64_t D = x.size(3);
  TORCH_CHECK_VALUE(D % 2 == 0, msg("rope_ext: the head dim D must be even, got D = ", D));
  // The kernels keep [R/2] frequencies, sins and cosines in shared memory (48 KB).
  TORCH_CHECK_VALUE(D <= 8192, msg("rope_ext: the head dim D must be at most 8192, got ", D));
  const int64_t R = o.rotary_dim < 0 ? D : o.rotary_dim;
  TORCH_CHECK_VALUE(R > 0 && R % 2 == 0 && R <= D, msg("rope_ext: rotary_dim must be even and in (0, D = ", D, "], got ", o.rotary_dim));
  p.D = static_cast<int32_t>(D);
  p.R = static_cast<int32_t>(R);
  p.interleaved = o.interleaved;
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

  // Positions.
  TORCH_CHECK_VALUE(!(o.positions && o.cu_seqlens),
                    "rope_ext: give positions or cu_seqlens, not both");
  if (o.positions) {
    const at::Tensor& pt = *o.positions;
    check_index(pt, "positions", x);
    const bool ok = (pt.dim() == 1 && pt.size(0) == p.S) ||
                    (pt.dim() == 2 && (pt.size(0) == p.B || pt.size(0) == 1) && pt.size(1) == p.S);
    TORCH_CHECK_VALUE(ok, msg("rope_ext: positions must have shape [B, S] = [", p.B, ", ", p.S, "] or [S] = [",
                      p.S, "], got ", shape_str(pt)));
    p.positions = index_array(pt, pt.stride(-1));
    p.pos_stride_b = (pt.dim() == 2 && pt.size(0) == p.B) ? pt.stride(0) : 0;
  }
  if (o.cu_seqlens) {
    const at::Tensor& cu = *o.cu_seqlens;
    check_index(cu, "cu_seqlens", x);
    TORCH_CHECK_VALUE(cu.dim() == 1 && cu.size(0) >= 2, msg("rope_ext: cu_seqlens must be 1-D [N + 1] with N >= 1 sequences, got shape ", shape_str(cu)));
    TORCH_CHECK_VALUE(p.B == 1, msg("rope_ext: cu_seqlens needs packed tokens (layout 'thd'), got B = ", p.B));
    p.cu_seqlens = index_array(cu, cu.stride(0));
    p.num_seqs = cu.size(0) - 1;
  }
  if (o.offsets) {
    const at::Tensor& off = *o.offsets;
    check_index(off, "offsets", x);
    TORCH_CHECK_VALUE(!o.positions, "rope_ext: give positions or offsets, not both (positions are absolute)");
    const int64_t want = o.cu_seqlens ? p.num_seqs : p.B;
    TORCH_CHECK_VALUE(off.dim() == 1 && off.size(0) == want, msg("rope_ext: offsets must have shape [",
                      want, "] (one per ", o.cu_seqlens ? "sequence of cu_seqlens" : "batch entry",
                      "), got ", shape_str(off)));
    p.offsets = index_array(off, off.stride(0));
  }
  p.offset = o.offset;
  p.pos_shared_b = p.B == 1 || (o.positions ? p.pos_stride_b == 0 : !o.offsets);
  // Rows of one group (NB batches x heads of q and k) are indexed in 32 bits.
  const int64_t heads = heads_total(p);
  TORCH_CHECK_VALUE(heads < (int64_t(1) << 31), msg("rope_ext: at most 2^31 - 1 heads, got ", heads));
  if (p.B * heads >= (int64_t(1) << 31)) p.pos_shared_b = false;

  // Frequencies.
  TORCH_CHECK_VALUE(!(o.inv_freq && o.cos_sin_cache),
                    "rope_ext: give one frequency source: base, inv_freq or cos_sin_cache");
  p.base = o.base;
  if (o.inv_freq) {
    const at::Tensor& f = *o.inv_freq;
    TORCH_CHECK_TYPE(f.scalar_type() == at::kFloat, msg("rope_ext: inv_freq must be float32, got ", f.scalar_type()));
    check_device(f, "inv_freq", x);
    TORCH_CHECK_VALUE(f.dim() == 1 && f.size(0) == R / 2, msg("rope_ext: inv_freq must have shape [rotary_dim / 2] = [",
                      R / 2, "], got ", shape_str(f)));
    p.freq = FreqSource::kInvFreq;
    p.inv_freq = f.data_ptr<float>();
    p.inv_freq_stride = f.stride(0);
  } else if (o.cos_sin_cache) {
    const at::Tensor& c = *o.cos_sin_cache;
    TORCH_CHECK_TYPE(c.scalar_type() == at::kFloat || c.scalar_type() == at::kHalf || c.scalar_type() == at::kBFloat16, msg("rope_ext: cos_sin_cache must be float32, float16 or bfloat16, got ", c.scalar_type()));
    check_device(c, "cos_sin_cache", x);
    TORCH_CHECK_VALUE(c.dim() == 2 && c.size(1) == R, msg("rope_ext: cos_sin_cache must have shape [max_position, rotary_dim = ",
                      R, "] (cos in the first rotary_dim/2 columns, sin in the rest), got ", shape_str(c)));
    p.freq = FreqSource::kCosSinCache;
    p.cache = c.data_ptr();
    p.cache_dtype = to_dtype(c.scalar_type());
    p.cache_rows = c.size(0);
    p.cache_stride_row = c.stride(0);
    p.cache_stride_col = c.stride(1);
  } else {
    TORCH_CHECK_VALUE(o.base > 0 && std::isfinite(o.base), msg("rope_ext: base must be a positive finite number, got ", o.base));
    if (R / 2 <= RopeParams::kParamFreqs) {
      // Cached: 64 double pows would cost more host time than the rest of the call.
      static thread_local double cached_base = 0;
      static thread_local int64_t cached_R = 0;
      static thread_local float cached[RopeParams::kParamFreqs];
      if (cached_base != o.base || cached_R != R) {
        for (int i = 0; i < R / 2; ++i) cached[i] = base_inv_freq(o.base, i, static_cast<int>(R));
        cached_base = o.base;
        cached_R = R;
      }
      std::copy(cached, cached + R / 2, p.base_freqs);
      p.base_freqs_set = true;
    }
  }

  // In place: every output element must have its own memory, or rows would race.
  if (inplace) {
    for (size_t i = 0; i < ins.size(); ++i)
      TORCH_CHECK_VALUE(non_overlapping(ins[i].sizes(), ins[i].strides()), msg("rope_ext: in-place needs ", names[i],
                        " with non-overlapping memory (not an expand()ed view), got shape ", shape_str(ins[i]),
                        " strides ", ins[i].strides()));
    if (ins.size() > 1)
      TORCH_CHECK_VALUE(disjoint_heads(ins[0], ins[1]),
                        "rope_ext: in-place q and k must not share memory (disjoint head slices of one buffer are fine)");
    TORCH_CHECK_VALUE(impl != Impl::kNaive,
                      "rope_ext: impl='naive' cannot run in place (each thread reads its partner element, "
                      "which another thread may already have written); use 'fp32', 'fp32x4' or 'auto'");
  }
  if (impl == Impl::kFp32x4 || impl == Impl::kFp32x4Tile) {
    std::string why;
    TORCH_CHECK_VALUE(vector_eligible(p, x.element_size(), &why), msg("rope_ext: impl='", o.impl, "' needs 16-byte vector access, but ", why,
                      "; use impl='auto' (falls back to the scalar kernel) or make x contiguous"));
  }
  if (x.is_cpu() || g_check_device_values.load(std::memory_order_relaxed)) check_values(p, o);
  *impl_out = impl;
  return p;
}

// Test hook: fill every output with NaN before the kernel runs, so that an element a
// kernel fails to write cannot pass a comparison (rope_ext._C.set_poison).
std::atomic<bool> g_poison{false};

void run(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs, const Options& o, bool inplace) {
  Impl impl;
  const RopeParams p = make_params(ins, outs, o, inplace, &impl);
  if (!inplace && g_poison.load(std::memory_order_relaxed))
    for (const auto& t : outs) t.fill_(std::numeric_limits<double>::quiet_NaN());
  for (const auto& t : ins)
    if (t.numel() == 0) return;
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

#define ROPE_ARGS                                                                              \
  const std::optional<at::Tensor>&positions, const std::optional<at::Tensor>&offsets,         \
      const std::optional<at::Tensor>&cu_seqlens, const std::optional<at::Tensor>&inv_freq,   \
      const std::optional<at::Tensor>&cos_sin_cache, int64_t offset, double base, int64_t rotary_dim, \
      bool interleaved, bool inverse, const std::string &impl
#define ROPE_OPTIONS \
  Options { positions, offsets, cu_seqlens, inv_freq, cos_sin_cache, offset, base, rotary_dim, interleaved, inverse, impl }

at::Tensor new_output(const at::Tensor& x) {
  return at::empty_like(x);
}

at::Tensor rope(const at::Tensor& x, ROPE_ARGS) {
  at::Tensor out = new_output(x);
  run({x}, {out}, ROPE_OPTIONS, false);
  return out;
}

void rope_(const at::Tensor& x, ROPE_ARGS) { run({x}, {x}, ROPE_OPTIONS, true); }

std::tuple<at::Tensor, at::Tensor> rope_qk(const at::Tensor& q, const at::Tensor& k, ROPE_ARGS) {
  at::Tensor qo = new_output(q), ko = new_output(k);
  run({q, k}, {qo, ko}, ROPE_OPTIONS, false);
  return {qo, ko};
}

void rope_qk_(const at::Tensor& q, const at::Tensor& k, ROPE_ARGS) {
  run({q, k}, {q, k}, ROPE_OPTIONS, true);
}

// The eager fast path (rope_ext/api.py calls it when nothing needs the dispatcher: no
// autograd, no torch.compile, no tensor subclass or mode): the same run() as the ops,
// without the boxed dispatcher hops and the Python-side views, which cost most of a
// decode-sized call (bench/overhead.py). layout: 0 bshd, 1 sbhd, 2 bhsd, 3 thd (ranks
// checked by the caller; the permutations are rope_ext/api.py's _PERM, which the op
// path keeps in Python so that autograd and torch.compile see the views). In place:
// bumps the version counters as the ADInplaceOrView kernel below does for the ops.
at::Tensor layout_view(const at::Tensor& x, int64_t layout, bool to_bshd) {
  switch (layout) {
    case 1: return x.permute({1, 0, 2, 3});
    case 2: return x.permute({0, 2, 1, 3});
    case 3: return to_bshd ? x.unsqueeze(0) : x.squeeze(0);
    default: return x;
  }
}

std::vector<at::Tensor> rope_direct(const std::vector<at::Tensor>& xs, int64_t layout, bool inplace, ROPE_ARGS) {
  TORCH_CHECK_VALUE(xs.size() == 1 || xs.size() == 2, "rope_ext: one or two tensors");
  std::vector<at::Tensor> x4;
  for (const auto& t : xs) x4.push_back(layout_view(t, layout, true));
  if (inplace) {
    run(x4, x4, ROPE_OPTIONS, true);
    for (const auto& t : xs)
      if (!t.is_inference()) torch::autograd::impl::bump_version(t);
    return {};
  }
  std::vector<at::Tensor> outs;
  for (const auto& t : x4) outs.push_back(new_output(t));
  run(x4, outs, ROPE_OPTIONS, false);
  for (auto& t : outs) t = layout_view(t, layout, false);
  return outs;
}

}  // namespace

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

}  // namespace rope_ext

// The options shared by the four ops (the tensors to rotate come first).
#define ROPE_SCHEMA_OPTS                                                                        \
  "Tensor? positions, Tensor? offsets, Tensor? cu_seqlens, Tensor? inv_freq, Tensor? cos_sin_cache, " \
  "int offset, float base, int rotary_dim, bool interleaved, bool inverse, str impl"

TORCH_LIBRARY(rope_ext, m) {
  m.def("rope(Tensor x, " ROPE_SCHEMA_OPTS ") -> Tensor");
  m.def("rope_(Tensor(a!) x, " ROPE_SCHEMA_OPTS ") -> ()");
  m.def("rope_qk(Tensor q, Tensor k, " ROPE_SCHEMA_OPTS ") -> (Tensor, Tensor)");
  m.def("rope_qk_(Tensor(a!) q, Tensor(b!) k, " ROPE_SCHEMA_OPTS ") -> ()");
}

// One implementation per backend key: the op functions branch to run_cpu / run_cuda.
TORCH_LIBRARY_IMPL(rope_ext, CPU, m) {
  m.impl("rope", &rope_ext::rope);
  m.impl("rope_", &rope_ext::rope_);
  m.impl("rope_qk", &rope_ext::rope_qk);
  m.impl("rope_qk_", &rope_ext::rope_qk_);
}

// The in-place ops bump the version counter of what they write, so autograd notices
// a tensor it saved being overwritten (a stale counter silently corrupts gradients).
namespace rope_ext {
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rope_ext: RoPE kernels (the ops live under torch.ops.rope_ext)";
  m.def("impl_names", &rope_ext::impl_names, "kernel variant names, in order");
  m.def("rope_direct", &rope_ext::rope_direct,
        "eager fast path of the ops (no dispatcher): xs, layout code, inplace, then the op options");
  m.def("set_poison", [](bool on) { rope_ext::g_poison = on; },
        "tests: fill outputs with NaN before each kernel so unwritten elements show");
  m.def("set_value_checks", [](bool on) { rope_ext::g_check_device_values = on; },
        "check positions/offsets/cu_seqlens values of CUDA tensors too (synchronizes)");
#ifdef ROPE_EXT_WITH_CUDA
  m.def("set_tile_rows_per_thread", &rope_ext::set_tile_rows_per_thread,
        "tuning: rows per thread of variant 4's tiles (0 = default)");
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
