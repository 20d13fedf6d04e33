// The attention ops (append_kv, attention_decode): argument validation, the
// translation of tensors into AppendParams / DecodeParams (attention_params.h), the
// per-backend implementations (TORCH_LIBRARY_IMPL) and the version-counter kernel of
// the mutating op. The schemas are in registration.cpp.
//
// As for the rope ops (rope_ops.cpp): every check runs before any kernel; shape, dtype,
// device and stride checks need no device memory (CUDA-graph safe); checks of index
// *values* (cache_seqlens, block tables, cu_seqlens, positions) run for CPU tensors
// always and for CUDA tensors after rope_ext.set_value_checks(True). The kernels drop a
// slot that does not exist (past the capacity, or a block id out of range) either way.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>
#include <limits>

#include "attention.h"
#include "attention_options.h"
#include "attention_math.h"
#include "op_utils.h"
#include "rope_ops.h"

namespace rope_ext {

// The split plan of this thread's last CUDA decode launch (tests: which merge ran).
DecodePlan& last_decode_plan() {
  static thread_local DecodePlan plan;
  return plan;
}

namespace {

// Whether a and b may share elements. Views of one storage with equal strides are
// proven disjoint in two ways: equal shapes, and the pair is itself a non-overlapping
// view (the two stacked along a new dimension whose stride is their offset difference:
// k_cache and v_cache as the halves of one [num_blocks, 2, block_size, Hk, D] buffer);
// or shapes that differ in one dimension only, offset by whole steps of it into a
// disjoint index range, the union a non-overlapping view (q, k, v as head slices of one
// fused projection). Anything else sharing a storage counts unless get_overlap_status
// proves it disjoint.
bool may_share(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || !a.is_alias_of(b)) return false;
  // The stride of a size-1 dimension is never used: equal strides ignore it (MLA's
  // latent and rope halves of one cache row, as [.., 1, L] and [.., 1, R] views).
  auto used_strides = [](const at::Tensor& t) {
    std::vector<int64_t> st(t.strides().begin(), t.strides().end());
    for (int64_t d = 0; d < t.dim(); ++d)
      if (t.size(d) == 1) st[d] = 0;
    return st;
  };
  const std::vector<int64_t> strides = used_strides(a);
  if (a.dim() == b.dim() && strides == used_strides(b)) {
    const int64_t delta = b.storage_offset() - a.storage_offset();
    std::vector<int64_t> sizes(a.sizes().begin(), a.sizes().end());
    if (a.sizes() == b.sizes()) {
      std::vector<int64_t> sz = sizes, st = strides;
      sz.push_back(2);
      st.push_back(delta);
      if (non_overlapping(sz, st)) return false;
    }
    for (int64_t d = 0; d < a.dim(); ++d) {
      bool others_equal = true;
      for (int64_t e = 0; e < a.dim(); ++e)
        if (e != d && a.size(e) != b.size(e)) others_equal = false;
      if (!others_equal || strides[d] == 0 || delta % strides[d]) continue;
      const int64_t j = delta / strides[d];
      if (!(j >= a.size(d) || j + b.size(d) <= 0)) continue;  // the index ranges overlap
      std::vector<int64_t> sz = sizes;
      sz[d] = std::max(a.size(d), j + b.size(d)) - std::min<int64_t>(0, j);
      if (non_overlapping(sz, strides)) return false;
    }
  }
  return at::get_overlap_status(a, b) != at::MemOverlapStatus::No;
}

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16,
                   msg("rope_ext: ", name, " must be float32, float16 or bfloat16, got ", t.scalar_type()));
}

// Equal in every dimension but the last (v may have its own head dim: MLA's latent).
bool same_but_last(const at::Tensor& a, const at::Tensor& b) {
  return a.dim() == b.dim() && a.dim() >= 1 && a.sizes().slice(0, a.dim() - 1) == b.sizes().slice(0, b.dim() - 1);
}

bool is_fp8(const at::Tensor& t) { return t.scalar_type() == at::kFloat8_e4m3fn; }

// One dequantization scale of an fp8 cache: float32, [] / [1] (per tensor) or [Hk] (per
// kv head); *stride 0 or 1 for the kernels. Values (finite, > 0) are checked where
// index values are (CPU always, CUDA under rope_ext.set_value_checks(True)).
const float* scale_arg(const at::Tensor& s, const char* name, int64_t Hk, const at::Tensor& x, const char* xname,
                       int64_t* stride) {
  check_device(s, name, x, xname);
  TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, msg("rope_ext: ", name, " must be float32, got ", s.scalar_type()));
  TORCH_CHECK_VALUE(s.dim() <= 1 && (s.numel() == 1 || s.numel() == Hk), msg("rope_ext: ", name, " must hold one scale "
                    "per tensor ([] or [1]) or one per kv head ([Hk] = [", Hk, "]), got shape ", shape_str(s)));
  *stride = s.numel() == 1 ? 0 : s.stride(0);
  if (check_values_of(x) && s.numel()) {
    const at::Tensor h = s.to(at::kCPU);
    TORCH_CHECK_VALUE(at::isfinite(h).all().item<bool>() && (h > 0).all().item<bool>(),
                      msg("rope_ext: ", name, " must be finite and > 0, got ", h.min().item<float>(), " .. ",
                          h.max().item<float>()));
  }
  return s.data_ptr<float>();
}

// The caches and their index tensors -> KVCacheView (shape, dtype, device, stride checks).
// x: the tensor whose device everything must share (k for append_kv, q for decode).
KVCacheView make_cache(const at::Tensor& kc, const at::Tensor& vc, const at::Tensor& seqlens,
                       const std::optional<at::Tensor>& block_table, int64_t B, const at::Tensor& x, const char* xname,
                       const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  TORCH_CHECK_VALUE(x.is_cpu() || x.is_cuda(), msg("rope_ext: ", xname, " must be a CPU or CUDA tensor, got ", x.device()));
  TORCH_CHECK_TYPE(is_fp8(kc) || kc.scalar_type() == at::kFloat || kc.scalar_type() == at::kHalf ||
                       kc.scalar_type() == at::kBFloat16,
                   msg("rope_ext: k_cache must be float32, float16, bfloat16 or float8_e4m3fn (fp8, with k_scale and "
                       "v_scale), got ", kc.scalar_type()));
  check_device(kc, "k_cache", x, xname);
  check_device(vc, "v_cache", x, xname);
  const bool paged = block_table.has_value();
  TORCH_CHECK_VALUE(kc.dim() == 4, msg("rope_ext: k_cache must be 4-D ", paged ? "[num_blocks, block_size, Hk, D] (paged)"
                    : "[B, max_len, Hk, D]", ", got shape ", shape_str(kc)));
  TORCH_CHECK_VALUE(same_but_last(vc, kc), msg("rope_ext: v_cache must have the shape of k_cache ", shape_str(kc),
                    " (but for the head dim), got ", shape_str(vc)));
  TORCH_CHECK_TYPE(vc.scalar_type() == kc.scalar_type(), msg("rope_ext: v_cache must have the dtype of k_cache (",
                   kc.scalar_type(), "), got ", vc.scalar_type()));
  TORCH_CHECK_VALUE(kc.stride(3) == 1 || kc.size(3) == 1, msg("rope_ext: k_cache must have a contiguous last (head dim) "
                    "dimension, stride 1; got stride ", kc.stride(3)));
  TORCH_CHECK_VALUE(vc.stride(3) == 1 || vc.size(3) == 1, msg("rope_ext: v_cache must have a contiguous last (head dim) "
                    "dimension, stride 1; got stride ", vc.stride(3)));
  check_index(seqlens, "cache_seqlens", x, xname);
  TORCH_CHECK_VALUE(seqlens.dim() == 1 && seqlens.size(0) == B, msg("rope_ext: cache_seqlens must have shape [B] = [", B,
                    "], got ", shape_str(seqlens)));
  KVCacheView c;
  c.k = kc.data_ptr();
  c.v = vc.data_ptr();
  for (int d = 0; d < 3; ++d) {
    c.k_stride[d] = kc.stride(d);
    c.v_stride[d] = vc.stride(d);
  }
  c.Hk = kc.size(2);
  c.seqlens = index_array(seqlens, seqlens.stride(0));
  c.fp8 = is_fp8(kc);
  if (c.fp8) {
    TORCH_CHECK_VALUE(k_scale && v_scale, "rope_ext: an fp8 (float8_e4m3fn) cache needs k_scale and v_scale (float32, "
                      "[1] per tensor or [Hk] per kv head: a cache element holds x / scale)");
    c.k_scale = scale_arg(*k_scale, "k_scale", c.Hk, x, xname, &c.k_scale_stride);
    c.v_scale = scale_arg(*v_scale, "v_scale", c.Hk, x, xname, &c.v_scale_stride);
  } else {
    TORCH_CHECK_VALUE(!k_scale && !v_scale, msg("rope_ext: k_scale and v_scale apply to fp8 (float8_e4m3fn) caches only; "
                      "k_cache is ", kc.scalar_type()));
  }
  if (paged) {
    const at::Tensor& bt = *block_table;
    check_index(bt, "block_table", x, xname);
    TORCH_CHECK_VALUE(bt.dim() == 2 && bt.size(0) == B, msg("rope_ext: block_table must have shape [B, max_blocks] with B = ",
                      B, ", got ", shape_str(bt)));
    TORCH_CHECK_VALUE(kc.size(1) >= 1, "rope_ext: a paged k_cache needs block_size (dim 1) >= 1");
    c.paged = true;
    c.block_size = kc.size(1);
    c.num_blocks = kc.size(0);
    c.capacity = bt.size(1) * c.block_size;
    c.block_table = index_array(bt, bt.stride(1));
    c.bt_stride_b = bt.stride(0);
  } else {
    TORCH_CHECK_VALUE(kc.size(0) == B, msg("rope_ext: k_cache must hold B = ", B, " sequences (dim 0 of [B, max_len, Hk, D]; "
                      "give block_table for a paged cache), got shape ", shape_str(kc)));
    c.capacity = kc.size(1);
  }
  return c;
}

// Positions of `n` tokens per sequence: [B, n] or [n] (batched), [n] (varlen / B == 1).
void fill_positions(RopeParams& r, const at::Tensor& pt, int64_t B, int64_t n, bool varlen, const at::Tensor& x,
                    const char* xname, const char* what) {
  check_index(pt, "positions", x, xname);
  if (varlen) {
    TORCH_CHECK_VALUE(pt.dim() == 1 && pt.size(0) == n, msg("rope_ext: positions must have shape [Ttot] = [", n,
                      "] (one per packed ", what, "), got ", shape_str(pt)));
  } else {
    TORCH_CHECK_VALUE((pt.dim() == 1 && pt.size(0) == n) || (pt.dim() == 2 && pt.size(0) == B && pt.size(1) == n),
                      msg("rope_ext: positions must have shape [B, ", what == std::string("query token") ? "q_len" : "T",
                          "] = [", B, ", ", n, "] or [", n, "], got ", shape_str(pt)));
  }
  r.positions = index_array(pt, pt.stride(-1));
  r.pos_stride_b = pt.dim() == 2 ? pt.stride(0) : 0;
}

// The blocks of sequence b that hold slots [lo, hi) must be valid block ids.
void check_blocks(const KVCacheView& c, const at::Tensor& bt_host, int64_t b, int64_t lo, int64_t hi) {
  if (!c.paged || hi <= lo) return;
  const int64_t* bt = bt_host.data_ptr<int64_t>();
  const int64_t cols = bt_host.size(1);
  for (int64_t n = lo / c.block_size; n <= (hi - 1) / c.block_size && n < cols; ++n) {
    const int64_t id = bt[b * cols + n];
    TORCH_CHECK_VALUE(id >= 0 && id < c.num_blocks, msg("rope_ext: block_table entries must be in [0, num_blocks = ",
                      c.num_blocks, "), got ", id, " at block_table[", b, ", ", n, "]"));
  }
}

// ---------------------------------------------------------------------------- append_kv
// append_kv's validation and params (the decode step validates its append with it too).
AppendParams append_setup(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& cache_seqlens,
                          const std::optional<at::Tensor>& cu_seqlens ATTN_INDEX_PARAMS,
                          const std::optional<at::Tensor>& q ATTN_ROTARY_PARAMS, bool rotate_k ATTN_SCALE_PARAMS) {
  const bool varlen = cu_seqlens.has_value();
  const int want = varlen ? 3 : 4;
  const char* shape_name = varlen ? "[Ttot, Hk, D] (varlen, with cu_seqlens)" : "[B, T, Hk, D]";
  TORCH_CHECK_VALUE(k.dim() == want, msg("rope_ext: k must be ", shape_name, ", got shape ", shape_str(k)));
  TORCH_CHECK_VALUE(same_but_last(v, k), msg("rope_ext: v must have the shape of k ", shape_str(k),
                    " (but for the head dim), got ", shape_str(v)));
  check_float(k, "k");
  check_device(v, "v", k, "k");
  TORCH_CHECK_TYPE(v.scalar_type() == k.scalar_type(), msg("rope_ext: v must have the dtype of k (", k.scalar_type(),
                   "), got ", v.scalar_type()));
  TORCH_CHECK_TYPE(k_cache.scalar_type() == k.scalar_type() || is_fp8(k_cache), msg("rope_ext: k_cache must have the "
                   "dtype of k, or be float8_e4m3fn (fp8, with k_scale and v_scale); got k ", k.scalar_type(),
                   " and k_cache ", k_cache.scalar_type()));
  // 4-D views [B or 1, T, H, D] of the inputs.
  const at::Tensor k4 = varlen ? k.unsqueeze(0) : k, v4 = varlen ? v.unsqueeze(0) : v;
  int64_t B = varlen ? cu_seqlens->numel() - 1 : k.size(0);
  if (varlen) {
    check_index(*cu_seqlens, "cu_seqlens", k, "k");
    TORCH_CHECK_VALUE(cu_seqlens->dim() == 1 && cu_seqlens->size(0) >= 2, msg("rope_ext: cu_seqlens must be 1-D [B + 1] "
                      "with B >= 1 sequences, got shape ", shape_str(*cu_seqlens)));
  }
  const KVCacheView cache = make_cache(k_cache, v_cache, cache_seqlens, block_table, B, k, "k", k_scale, v_scale);
  const int64_t Hk = k4.size(2), D = k4.size(3), Dv = v4.size(3);
  TORCH_CHECK_VALUE(cache.Hk == Hk, msg("rope_ext: k has ", Hk, " heads but k_cache has ", cache.Hk,
                    " (dim 2); they must match"));
  TORCH_CHECK_VALUE(k_cache.size(3) == D, msg("rope_ext: the head dim of k (", D, ") must equal k_cache's (",
                    k_cache.size(3), ")"));
  TORCH_CHECK_VALUE(v_cache.size(3) == Dv, msg("rope_ext: the head dim of v (", Dv, ") must equal v_cache's (",
                    v_cache.size(3), ")"));
  TORCH_CHECK_VALUE(!may_share(k_cache, v_cache),
                    "rope_ext: k_cache and v_cache must not share memory");
  TORCH_CHECK_VALUE(at::has_internal_overlap(k_cache) != at::MemOverlap::Yes &&
                        at::has_internal_overlap(v_cache) != at::MemOverlap::Yes,
                    "rope_ext: k_cache and v_cache must not be expand()ed views (slots would alias)");

  AppendParams p;
  // base's table as the cached device tensor on CUDA (the same bits as the params' copy):
  // the lean kernel (1c) reads frequencies from a tensor only.
  fill_rotary(p.rope, k, D, rotary_dim, interleaved, inv_freq, cos_sin_cache, base, attention_factor,
              /*base_as_tensor=*/true);
  p.cache = cache;
  p.Dv = Dv;
  p.k = k4.data_ptr();
  p.v = v4.data_ptr();
  for (int d = 0; d < 4; ++d) {
    p.k_stride[d] = k4.stride(d);
    p.v_stride[d] = v4.stride(d);
  }
  if (varlen) p.k_stride[0] = p.v_stride[0] = 0;
  p.B = B;
  p.T = k4.size(1);
  p.num_tokens = varlen ? k4.size(1) : B * k4.size(1);
  p.varlen = varlen;
  p.rotate_k = rotate_k;
  if (varlen) {
    p.rope.cu_seqlens = index_array(*cu_seqlens, cu_seqlens->stride(0));
    p.rope.num_seqs = B;
  }
  if (q) {
    const at::Tensor& qq = *q;
    TORCH_CHECK_VALUE(qq.dim() == want, msg("rope_ext: q must be ", varlen ? "[Ttot, Hq, D]" : "[B, T, Hq, D]",
                      " like k, got shape ", shape_str(qq)));
    check_device(qq, "q", k, "k");
    TORCH_CHECK_TYPE(qq.scalar_type() == k.scalar_type(), msg("rope_ext: q must have the dtype of k (", k.scalar_type(),
                     "), got ", qq.scalar_type()));
    const at::Tensor q4 = varlen ? qq.unsqueeze(0) : qq;
    TORCH_CHECK_VALUE(q4.size(0) == k4.size(0) && q4.size(1) == k4.size(1) && q4.size(3) == D,
                      msg("rope_ext: q must agree with k in every dimension but heads, got q ", shape_str(qq), " and k ",
                          shape_str(k)));
    TORCH_CHECK_VALUE(at::has_internal_overlap(qq) != at::MemOverlap::Yes,
                      "rope_ext: q is rotated in place and must not be an expand()ed view");
    for (const auto* t : {&k_cache, &v_cache})
      TORCH_CHECK_VALUE(!may_share(qq, *t),
                        "rope_ext: q must not share memory with the caches");
    for (const auto* t : {&k, &v})
      TORCH_CHECK_VALUE(!may_share(qq, *t), "rope_ext: q is rotated in place and must not share memory with k or v "
                        "(disjoint head slices of one projection are fine)");
    p.q = q4.data_ptr();
    for (int d = 0; d < 4; ++d) p.q_stride[d] = q4.stride(d);
    if (varlen) p.q_stride[0] = 0;
    p.Hq = q4.size(2);
  }
  for (const auto* t : {&k, &v})
    for (const auto* c : {&k_cache, &v_cache})
      TORCH_CHECK_VALUE(!may_share(*t, *c),
                        "rope_ext: k and v must not share memory with the caches");
  if (positions) fill_positions(p.rope, *positions, B, p.T, varlen, k, "k", "token");
  fill_offsets(p.rope, positions.has_value(), offsets, offset, B, "sequence", k, "k");

  if (check_values_of(k)) {
    const at::Tensor sl = host_long(cache_seqlens);
    at::Tensor lens;  // new tokens per sequence
    if (varlen) {
      const at::Tensor cu = host_long(*cu_seqlens);
      const int64_t* c = cu.data_ptr<int64_t>();
      TORCH_CHECK_VALUE(c[0] == 0, msg("rope_ext: cu_seqlens must start at 0, got ", c[0]));
      TORCH_CHECK_VALUE(c[B] == p.num_tokens, msg("rope_ext: cu_seqlens must end at Ttot = ", p.num_tokens,
                        " (the tokens of k), got ", c[B]));
      for (int64_t i = 1; i <= B; ++i)
        TORCH_CHECK_VALUE(c[i] >= c[i - 1], msg("rope_ext: cu_seqlens must be non-decreasing, got ", c[i - 1], " then ",
                          c[i], " at index ", i));
      lens = cu.slice(0, 1) - cu.slice(0, 0, -1);
    } else {
      lens = at::full({B}, p.T, at::kLong);
    }
    const int64_t* s = sl.data_ptr<int64_t>();
    const int64_t* n = lens.data_ptr<int64_t>();
    const at::Tensor bt = cache.paged ? host_long(*block_table) : at::Tensor();
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK_VALUE(s[b] >= 0, msg("rope_ext: cache_seqlens must be >= 0, got ", s[b], " for sequence ", b));
      TORCH_CHECK_VALUE(s[b] + n[b] <= cache.capacity, msg("rope_ext: the cache is too small for the new tokens: sequence ",
                        b, " holds cache_seqlens = ", s[b], " tokens and appends ", n[b], ", past the capacity of ",
                        cache.capacity, cache.paged ? " slots (max_blocks * block_size)" : " slots (max_len, dim 1 of k_cache)"));
      check_blocks(cache, bt, b, s[b], s[b] + n[b]);
    }
    // The largest default position per sequence before offsets (none for a sequence
    // without new tokens).
    const at::Tensor last = at::where(lens > 0, sl + lens - 1, at::full_like(sl, std::numeric_limits<int64_t>::min() / 4));
    check_position_values(p.rope, positions, offsets, offset, last);
  }
  return p;
}

void append_launch(const AppendParams& p, const at::Tensor& k) {
  // Nothing to write or rotate only without tokens, or without heads in both k and q
  // (Hk == 0 still rotates q; the kernels take either count as 0).
  if (p.num_tokens == 0 || (p.cache.Hk == 0 && p.Hq == 0)) return;
  if (k.is_cuda()) {
#ifdef ROPE_EXT_WITH_CUDA
    append_kv_cuda(p, k.scalar_type(), k.device());
#else
    TORCH_CHECK(false, "rope_ext was built without CUDA; rebuild with nvcc available (see README)");
#endif
  } else {
    append_kv_cpu(p, k.scalar_type());
  }
}

void append_kv(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& cu_seqlens ATTN_INDEX_PARAMS,
               const std::optional<at::Tensor>& q ATTN_ROTARY_PARAMS, bool rotate_k ATTN_SCALE_PARAMS) {
  append_launch(append_setup(k, v, k_cache, v_cache, cache_seqlens, cu_seqlens ATTN_INDEX_FORWARD, q
                             ATTN_ROTARY_FORWARD, rotate_k ATTN_SCALE_FORWARD),
                k);
}

// ---------------------------------------------------------------------------- attention_decode
DecodeImpl parse_decode_impl(const std::string& name) {
  const auto& names = decode_impl_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<DecodeImpl>(i);
  if (name == "auto") return DecodeImpl::kAuto;
  std::string m = "rope_ext: impl must be 'auto'";
  for (const auto& n : names) m += ", '" + n + "'";
  TORCH_CHECK_VALUE(false, m + "; got '" + name + "'");
}

// auto -> hybrid: K rotated once when written (append_kv) and Q rotated on load; the
// full fusion re-rotates every key on every read (variant 3, attention_variants.cuh).
DecodeImpl decode_impl_of(const std::string& impl) {
  const DecodeImpl which = parse_decode_impl(impl);
  return which == DecodeImpl::kAuto ? DecodeImpl::kHybrid : which;
}

void check_split_args(int64_t max_seqlen, int64_t num_splits) {
  TORCH_CHECK_VALUE(max_seqlen >= 0, msg("rope_ext: max_seqlen must be >= 0 (0: the cache capacity), got ", max_seqlen));
  TORCH_CHECK_VALUE(num_splits >= 0, msg("rope_ext: num_splits must be >= 0 (0: chosen from the shapes), got ", num_splits));
}

// attention_decode's validation and params. `appended`: new tokens this call adds at
// cache_seqlens[b] (the decode step), which every check and reader counts in.
DecodeParams decode_setup(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& cache_seqlens ATTN_INDEX_PARAMS ATTN_ROTARY_PARAMS ATTN_DECODE_PARAMS
                              ATTN_SCALE_PARAMS,
                          int64_t appended) {
  check_split_args(max_seqlen, num_splits);
  const DecodeImpl which = decode_impl_of(impl);
  const bool full_fusion = which == DecodeImpl::kFullFusion;
  TORCH_CHECK_VALUE(q.dim() == 4, msg("rope_ext: q must be 4-D [B, q_len, Hq, D], got shape ", shape_str(q)));
  check_float(q, "q");
  TORCH_CHECK_TYPE(k_cache.scalar_type() == q.scalar_type() || is_fp8(k_cache), msg("rope_ext: k_cache must have the "
                   "dtype of q, or be float8_e4m3fn (fp8, with k_scale and v_scale); got q ", q.scalar_type(),
                   " and k_cache ", k_cache.scalar_type()));
  const int64_t B = q.size(0), q_len = q.size(1), Hq = q.size(2), D = q.size(3);
  const KVCacheView cache = make_cache(k_cache, v_cache, cache_seqlens, block_table, B, q, "q", k_scale, v_scale);
  TORCH_CHECK_VALUE(k_cache.size(3) == D && v_cache.size(3) == D, msg("rope_ext: the head dim of q (", D,
                    ") must equal k_cache's and v_cache's (", k_cache.size(3), ", ", v_cache.size(3), ")"));
  TORCH_CHECK_VALUE(!cache.fp8 || which == DecodeImpl::kHybrid, msg("rope_ext: fp8 caches are read by impl='hybrid' "
                    "(and 'auto') only, got impl='", impl, "'"));
  TORCH_CHECK_VALUE(cache.Hk > 0 && Hq % cache.Hk == 0, msg("rope_ext: the query heads Hq = ", Hq,
                    " must be a multiple of the cache's kv heads Hk = ", cache.Hk, " (GQA)"));
  // Variant 5 (CUDA, impl hybrid / auto) maps a query row (token j, head g of the group) to
  // j by a float reciprocal of the group size, exact below 2^22 rows per kv head.
  TORCH_CHECK_VALUE(!q.is_cuda() || which != DecodeImpl::kHybrid || q_len * (Hq / cache.Hk) < (int64_t(1) << 22),
                    msg("rope_ext: attention_decode(impl='hybrid' or 'auto') on CUDA takes q_len * (Hq / Hk) below "
                        "2^22 query rows per kv head, got q_len = ", q_len, ", Hq / Hk = ", Hq / cache.Hk,
                        " (impl='hybrid_simt' has no such limit)"));
  DecodeParams p;
  fill_rotary(p.rope, q, D, rotary_dim, interleaved, inv_freq, cos_sin_cache, base, attention_factor);
  p.cache = cache;
  p.q = q.data_ptr();
  for (int d = 0; d < 4; ++d) p.q_stride[d] = q.stride(d);
  p.B = B;
  p.q_len = q_len;
  p.Hq = Hq;
  p.G = Hq / cache.Hk;
  p.causal = causal;
  p.appended = appended;
  const double scale = softmax_scale ? *softmax_scale : 1.0 / std::sqrt(static_cast<double>(D));
  TORCH_CHECK_VALUE(std::isfinite(scale), msg("rope_ext: softmax_scale must be finite, got ", scale));
  p.softmax_scale = static_cast<float>(scale);
  if (positions) fill_positions(p.rope, *positions, B, q_len, false, q, "q", "query token");
  fill_offsets(p.rope, positions.has_value(), offsets, offset, B, "sequence", q, "q");
  if (full_fusion)
    TORCH_CHECK_VALUE(!positions, "rope_ext: impl='full_fusion' rotates each key by its cache index + offsets, so the "
                      "query positions must follow the same rule: give offsets, not positions (or use impl='hybrid')");

  if (check_values_of(q)) {
    const at::Tensor sl = host_long(cache_seqlens) + appended;
    const int64_t* s = sl.data_ptr<int64_t>();
    const at::Tensor bt = cache.paged ? host_long(*block_table) : at::Tensor();
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK_VALUE(s[b] >= 0 && s[b] <= cache.capacity, msg("rope_ext: cache_seqlens must be in [0, capacity = ",
                        cache.capacity, "], got ", s[b], " for sequence ", b, " (seqlens past capacity)"));
      // Non-causal: a query token outside the cache would see every key at a negative
      // position (attention_math.h, decode_key_limit, gives it none where unchecked).
      TORCH_CHECK_VALUE(causal || s[b] == 0 || s[b] >= q_len, msg("rope_ext: attention_decode(causal=False) needs "
                        "cache_seqlens >= q_len = ", q_len, " (or 0: an empty sequence): query token j sits at cache index "
                        "cache_seqlens - q_len + j, so sequence ", b, " with cache_seqlens = ", s[b], " leaves its first ",
                        q_len - s[b], " query tokens outside the cache (append them with append_kv first)"));
      check_blocks(cache, bt, b, 0, s[b]);
    }
    // Keys (full fusion) and queries take positions up to seqlen - 1 + offset.
    check_position_values(p.rope, positions, offsets, offset, (sl - 1).clamp_min(0));
  }
  if (q.is_cuda()) {
#ifdef ROPE_EXT_WITH_CUDA
    TORCH_CHECK_VALUE(D == 64 || D == 128 || D == 256, msg("rope_ext: attention_decode on CUDA supports head dims 64, "
                      "128 and 256, got ", D));
    TORCH_CHECK_TYPE(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, msg("rope_ext: attention_decode "
                     "on CUDA supports float16 and bfloat16 (fp32 accumulation), got ", q.scalar_type()));
    std::string why;
    TORCH_CHECK_VALUE(decode_cache_aligned(cache, k_cache.element_size(), &why), msg("rope_ext: attention_decode reads "
                      "the caches in 16-byte vectors, but ", why));
    if (full_fusion) {
      const int32_t R = p.rope.R;
      TORCH_CHECK_VALUE(interleaved ? R % 8 == 0 : (R / 2) % 8 == 0, msg("rope_ext: impl='full_fusion' rotates keys in "
                        "8-feature chunks: rotary_dim must be a multiple of ", interleaved ? 8 : 16, ", got ", R));
    }
#else
    TORCH_CHECK(false, "rope_ext was built without CUDA; rebuild with nvcc available (see README)");
#endif
  }
  return p;
}

// Allocates o and lse (and the split workspace) and runs the decode kernels of `impl`.
std::tuple<at::Tensor, at::Tensor> decode_run(DecodeParams& p, const at::Tensor& q, const std::string& impl,
                                              int64_t max_seqlen, int64_t num_splits) {
  const DecodeImpl which = decode_impl_of(impl);
  const int64_t B = p.B, q_len = p.q_len, Hq = p.Hq, D = p.rope.D;
  at::Tensor o = at::empty({B, q_len, Hq, D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor lse = at::empty({B, q_len, Hq}, q.options().dtype(at::kFloat));
  maybe_poison(o);
  maybe_poison(lse);
  p.o = o.data_ptr();
  p.lse = lse.data_ptr<float>();
  if (o.numel() == 0) return {o, lse};
  const int64_t rows = p.G * q_len;
  if (q.is_cuda()) {
#ifdef ROPE_EXT_WITH_CUDA
    const int64_t cap = p.cache.capacity;
    const int64_t max_keys = max_seqlen > 0 ? std::min<int64_t>(max_seqlen + p.appended, cap) : cap;
    p.kv_per_cta = decode_kv_per_cta(p, max_keys, q.device(), q.scalar_type(), which);
    const int64_t cta_rows = rows * p.kv_per_cta;  // query rows of a CTA's kv heads
    const int kr = decode_rows_per_cta(cta_rows, which);
    p.rows_per_group = kr;
    p.row_groups = static_cast<int32_t>((cta_rows + kr - 1) / kr);
    const DecodePlan plan = decode_plan(p, max_keys, num_splits, q.device(), q.scalar_type(), which);
    p.num_splits = std::max(1, plan.num_splits);
    p.cluster_merge = plan.cluster_merge;
    p.split_chunk = which == DecodeImpl::kHybrid && p.num_splits > 1 ? decode_split_chunk() : 0;
    at::Tensor ws_o, ws_lse;
    if (p.num_splits > 1 && !p.cluster_merge) {  // the combine kernel merges, over a workspace
      const CombineShape cs = combine_shape(p.num_splits);
      p.combine_loads = cs.loads;
      p.combine_warps = cs.warps;
      ws_o = at::empty({B, Hq, q_len, p.num_splits, D}, q.options().dtype(at::kFloat));
      ws_lse = at::empty({B, Hq, q_len, p.num_splits}, q.options().dtype(at::kFloat));
      p.ws_o = ws_o.data_ptr<float>();
      p.ws_lse = ws_lse.data_ptr<float>();
    }
    last_decode_plan() =
        DecodePlan{p.num_splits, p.cluster_merge, p.kv_per_cta, p.combine_loads, p.combine_warps, p.split_chunk};
    attention_decode_cuda(p, q.scalar_type(), q.device(), which);
#else
    TORCH_CHECK(false, "rope_ext was built without CUDA; rebuild with nvcc available (see README)");
#endif
  } else {
    p.rows_per_group = static_cast<int32_t>(rows);
    attention_decode_cpu(p, q.scalar_type(), which == DecodeImpl::kFullFusion);
  }
  return {o, lse};
}

std::tuple<at::Tensor, at::Tensor> attention_decode(const at::Tensor& q, const at::Tensor& k_cache,
                                                    const at::Tensor& v_cache, const at::Tensor& cache_seqlens
                                                        ATTN_INDEX_PARAMS ATTN_ROTARY_PARAMS ATTN_DECODE_PARAMS
                                                            ATTN_SCALE_PARAMS) {
  DecodeParams p = decode_setup(q, k_cache, v_cache, cache_seqlens ATTN_INDEX_FORWARD ATTN_ROTARY_FORWARD
                                ATTN_DECODE_FORWARD ATTN_SCALE_FORWARD, 0);
  return decode_run(p, q, impl, max_seqlen, num_splits);
}

// ---------------------------------------------------------------------------- the decode step
// attention_decode with the step's new k, v: append them (K rotated; fp8: quantized) at
// cache_seqlens[b] + j, then attend over cache_seqlens[b] + q_len keys (cache_seqlens is
// not modified, as for append_kv). One launch where variant 5 runs (CUDA, impl hybrid /
// auto, q_len <= 8 with G * q_len <= 16, k and v rows 16-byte aligned with contiguous
// features): its last split builds the new keys' tile itself. Elsewhere append_kv's
// kernel, then the decode.
bool rows_16b_aligned(const at::Tensor& t) {
  if (t.stride(3) != 1 && t.size(3) != 1) return false;
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16) return false;
  for (int d = 0; d < 3; ++d)
    if ((t.stride(d) * t.element_size()) % 16 && t.size(d) > 1) return false;
  return true;
}

std::tuple<at::Tensor, at::Tensor> attention_decode_append(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                           const at::Tensor& k_cache, const at::Tensor& v_cache,
                                                           const at::Tensor& cache_seqlens ATTN_INDEX_PARAMS
                                                               ATTN_ROTARY_PARAMS ATTN_DECODE_PARAMS ATTN_SCALE_PARAMS) {
  TORCH_CHECK_VALUE(q.dim() == 4, msg("rope_ext: q must be 4-D [B, q_len, Hq, D], got shape ", shape_str(q)));
  TORCH_CHECK_VALUE(k.dim() == 4 && k.size(0) == q.size(0) && k.size(1) == q.size(1) && k.size(3) == q.size(3),
                    msg("rope_ext: k must be [B, q_len, Hk, D] = [", q.size(0), ", ", q.size(1), ", Hk, ", q.size(3),
                        "] (one new token per query token), got shape ", shape_str(k)));
  TORCH_CHECK_TYPE(k.scalar_type() == q.scalar_type(), msg("rope_ext: k must have the dtype of q (", q.scalar_type(),
                   "), got ", k.scalar_type()));
  const DecodeImpl which = decode_impl_of(impl);
  const bool full_fusion = which == DecodeImpl::kFullFusion;
  // The append's checks (shapes, dtypes, aliasing, capacity and block values), then the decode's.
  const AppendParams ap = append_setup(k, v, k_cache, v_cache, cache_seqlens, /*cu_seqlens=*/std::nullopt
                                       ATTN_INDEX_FORWARD, /*q=*/std::nullopt ATTN_ROTARY_FORWARD,
                                       /*rotate_k=*/!full_fusion ATTN_SCALE_FORWARD);
  for (const auto* c : {&k_cache, &v_cache})
    TORCH_CHECK_VALUE(!may_share(q, *c), "rope_ext: q must not share memory with the caches");
  const int64_t q_len = q.size(1);
  DecodeParams p = decode_setup(q, k_cache, v_cache, cache_seqlens ATTN_INDEX_FORWARD ATTN_ROTARY_FORWARD
                                ATTN_DECODE_FORWARD ATTN_SCALE_FORWARD, q_len);
  // (No query rows: no decode kernel runs, so the append runs on its own.)
  // (Variant 5 keeps the new rows in its Q sin/cos table's spare rows: at most 8 tokens,
  // one 16-row group of G * q_len query rows.)
  const bool one_launch = q.is_cuda() && q.numel() > 0 && which == DecodeImpl::kHybrid && q_len <= 8 &&
                          p.G * q_len <= 16 && rows_16b_aligned(k) && rows_16b_aligned(v);
  if (one_launch) {
    p.k_new = k.data_ptr();
    p.v_new = v.data_ptr();
    for (int d = 0; d < 3; ++d) {
      p.kn_stride[d] = k.stride(d);
      p.vn_stride[d] = v.stride(d);
    }
  } else {
    append_launch(ap, k);
  }
  return decode_run(p, q, impl, max_seqlen, num_splits);
}

// append_kv writes k_cache, v_cache and q (when given): bump their version counters, as
// rope_ops.cpp's bump_written does for the in-place rope ops (optional tensors may be None).
void bump_written_optional(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size(), first = stack->size() - n;
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& iv = (*stack)[first + i];
    if (args[i].alias_info() && args[i].alias_info()->isWrite() && iv.isTensor()) written.push_back(iv.toTensor());
  }
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(ks & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const auto& t : written) torch::autograd::impl::bump_version(t);
}

}  // namespace

// The eager entries without the dispatcher (rope_ext/attention.py takes them for plain
// tensors that need no grad, outside torch.compile, modes and functorch): the same
// functions; the written tensors' versions bumped as bump_written_optional does. The
// torch.ops call with keyword options cost ~5 us of host more (bench/overhead.py,
// twenty-fifth session).
void append_kv_direct(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& cu_seqlens ATTN_INDEX_PARAMS,
                      const std::optional<at::Tensor>& q ATTN_ROTARY_PARAMS, bool rotate_k ATTN_SCALE_PARAMS) {
  check_writable(k_cache, "k_cache");
  check_writable(v_cache, "v_cache");
  if (q) check_writable(*q, "q");
  append_kv(k, v, k_cache, v_cache, cache_seqlens, cu_seqlens ATTN_INDEX_FORWARD, q ATTN_ROTARY_FORWARD,
            rotate_k ATTN_SCALE_FORWARD);
  for (const at::Tensor* t : {&k_cache, &v_cache, q ? &*q : nullptr})
    if (t) torch::autograd::impl::bump_version(*t);
}

std::tuple<at::Tensor, at::Tensor> attention_decode_direct(const at::Tensor& q, const at::Tensor& k_cache,
                                                           const at::Tensor& v_cache, const at::Tensor& cache_seqlens
                                                               ATTN_INDEX_PARAMS ATTN_ROTARY_PARAMS ATTN_DECODE_PARAMS
                                                                   ATTN_SCALE_PARAMS) {
  return attention_decode(q, k_cache, v_cache, cache_seqlens ATTN_INDEX_FORWARD ATTN_ROTARY_FORWARD
                          ATTN_DECODE_FORWARD ATTN_SCALE_FORWARD);
}

std::tuple<at::Tensor, at::Tensor> attention_decode_append_direct(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
    const at::Tensor& v_cache, const at::Tensor& cache_seqlens ATTN_INDEX_PARAMS ATTN_ROTARY_PARAMS
        ATTN_DECODE_PARAMS ATTN_SCALE_PARAMS) {
  check_writable(k_cache, "k_cache");
  check_writable(v_cache, "v_cache");
  auto out = attention_decode_append(q, k, v, k_cache, v_cache, cache_seqlens ATTN_INDEX_FORWARD ATTN_ROTARY_FORWARD
                                     ATTN_DECODE_FORWARD ATTN_SCALE_FORWARD);
  for (const at::Tensor* t : {&k_cache, &v_cache}) torch::autograd::impl::bump_version(*t);
  return out;
}

}  // namespace rope_ext

TORCH_LIBRARY_IMPL(rope_ext, CPU, m) {
  m.impl("append_kv", &rope_ext::append_kv);
  m.impl("attention_decode", &rope_ext::attention_decode);
  m.impl("attention_decode_append", &rope_ext::attention_decode_append);
}

TORCH_LIBRARY_IMPL(rope_ext, ADInplaceOrView, m) {
  m.impl("append_kv", torch::CppFunction::makeFromBoxedFunction<&rope_ext::bump_written_optional>());
  m.impl("attention_decode_append", torch::CppFunction::makeFromBoxedFunction<&rope_ext::bump_written_optional>());
}

#ifdef ROPE_EXT_WITH_CUDA
TORCH_LIBRARY_IMPL(rope_ext, CUDA, m) {
  m.impl("append_kv", &rope_ext::append_kv);
  m.impl("attention_decode", &rope_ext::attention_decode);
  m.impl("attention_decode_append", &rope_ext::attention_decode_append);
}
#endif
