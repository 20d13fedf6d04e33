// CPU implementation of the attention family: the reference path of the CUDA kernels
// (csrc/cuda/attention_variants.cuh), with the same index helpers (attention_math.h)
// and the same arithmetic: sin/cos from rope_math.h, fp32 rotation, fp32 scores,
// softmax and P.V accumulation, one rounding at the store.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <c10/util/Float8_e4m3fn.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../attention.h"
#include "../attention_math.h"

namespace rope_ext {
namespace {

// Rotates one row of D features (strides in elements) from `in` to `out` (may alias:
// both elements of a pair are read before either is written); features [R, D) are
// copied when copy_tail. sn/cs: the R/2 sines and cosines of the row's position.
template <typename T>
void rotate_row(const RopeParams& r, const T* in, int64_t in_sd, T* out, int64_t out_sd, const float* sn,
                const float* cs, bool copy_tail) {
  for (int i = 0; i < r.R / 2; ++i) {
    int d0, d1;
    pair_dims(r, i, &d0, &d1);
    const float x0 = static_cast<float>(in[d0 * in_sd]), x1 = static_cast<float>(in[d1 * in_sd]);
    out[d0 * out_sd] = static_cast<T>(x0 * cs[i] - x1 * sn[i]);
    out[d1 * out_sd] = static_cast<T>(x1 * cs[i] + x0 * sn[i]);
  }
  if (copy_tail)
    for (int d = r.R; d < r.D; ++d) out[d * out_sd] = in[d * in_sd];
}

// fp32 copy of a row, rotated in fp32 (no intermediate rounding) when sn is given.
template <typename T>
void load_row_f32(const RopeParams& r, const T* in, int64_t in_sd, float* out, const float* sn, const float* cs) {
  for (int d = 0; d < r.D; ++d) out[d] = static_cast<float>(in[d * in_sd]);
  if (!sn) return;
  for (int i = 0; i < r.R / 2; ++i) {
    int d0, d1;
    pair_dims(r, i, &d0, &d1);
    const float x0 = out[d0], x1 = out[d1];
    out[d0] = x0 * cs[i] - x1 * sn[i];
    out[d1] = x1 * cs[i] + x0 * sn[i];
  }
}

void row_sincos(const RopeParams& r, const std::vector<float>& freq, int64_t pos, float* sn, float* cs) {
  for (int i = 0; i < r.R / 2; ++i) pair_sincos(r, pos, i, freq[i], &sn[i], &cs[i]);
}

// FP8 caches: x / scale saturated to the finite range and rounded once (c10's
// conversion, torch's x.to(torch.float8_e4m3fn): round to nearest even).
using Fp8 = c10::Float8_e4m3fn;
inline Fp8 quantize(float x, float scale) { return Fp8(std::clamp(x / scale, -448.f, 448.f)); }

std::vector<float> freq_table(const RopeParams& r) {
  std::vector<float> f(r.R / 2);
  for (int i = 0; i < r.R / 2; ++i) f[i] = inv_freq_of(r, i);
  return f;
}

template <typename T>
void append_cpu_impl(const AppendParams& p) {
  const RopeParams& r = p.rope;
  const KVCacheView& c = p.cache;
  const std::vector<float> freq = freq_table(r);
  const int64_t heads = p.Hq + 2 * p.cache.Hk;
  at::parallel_for(0, p.num_tokens, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, heads * r.D)),
                   [&](int64_t t0, int64_t t1) {
    std::vector<float> sn(r.R / 2), cs(r.R / 2), kf(c.fp8 ? r.D : 0);
    for (int64_t t = t0; t < t1; ++t) {
      const AppendToken a = append_token(p, t);
      const int64_t idx = cache_len(p.cache, a.b) + a.j;
      row_sincos(r, freq, attn_position(r, a.row_b, a.row_t, a.b, idx), sn.data(), cs.data());
      if (p.q) {
        T* q = static_cast<T*>(p.q) + a.row_b * p.q_stride[0] + a.row_t * p.q_stride[1];
        for (int64_t h = 0; h < p.Hq; ++h) {
          T* row = q + h * p.q_stride[2];
          rotate_row<T>(r, row, p.q_stride[3], row, p.q_stride[3], sn.data(), cs.data(), false);
        }
      }
      int64_t ko, vo;
      if (!cache_slot(p.cache, a.b, idx, &ko, &vo)) continue;  // dropped: no such slot
      const T* k = static_cast<const T*>(p.k) + a.row_b * p.k_stride[0] + a.row_t * p.k_stride[1];
      const T* v = static_cast<const T*>(p.v) + a.row_b * p.v_stride[0] + a.row_t * p.v_stride[1];
      for (int64_t h = 0; h < c.Hk; ++h) {
        const T* krow = k + h * p.k_stride[2];
        const T* vrow = v + h * p.v_stride[2];
        if (c.fp8) {  // K rotated in fp32, then scaled and rounded once
          Fp8* kout = static_cast<Fp8*>(c.k) + ko + h * c.k_stride[2];
          Fp8* vout = static_cast<Fp8*>(c.v) + vo + h * c.v_stride[2];
          const float ks = c.k_scale[h * c.k_scale_stride], vs = c.v_scale[h * c.v_scale_stride];
          load_row_f32<T>(r, krow, p.k_stride[3], kf.data(), p.rotate_k ? sn.data() : nullptr, cs.data());
          for (int d = 0; d < r.D; ++d) kout[d] = quantize(kf[d], ks);
          for (int64_t d = 0; d < p.Dv; ++d) vout[d] = quantize(static_cast<float>(vrow[d * p.v_stride[3]]), vs);
          continue;
        }
        T* kout = static_cast<T*>(c.k) + ko + h * c.k_stride[2];
        T* vout = static_cast<T*>(c.v) + vo + h * c.v_stride[2];
        if (p.rotate_k) {
          rotate_row<T>(r, krow, p.k_stride[3], kout, 1, sn.data(), cs.data(), true);
        } else {
          for (int d = 0; d < r.D; ++d) kout[d] = krow[d * p.k_stride[3]];
        }
        for (int64_t d = 0; d < p.Dv; ++d) vout[d] = vrow[d * p.v_stride[3]];
      }
    }
  });
}

// Row `off` (element offset of slot and head hk) of the K or V cache as fp32 (fp8: times
// its scale).
template <typename T>
void load_cache_row(const KVCacheView& c, bool is_v, int64_t off, int64_t hk, int D, float* out) {
  const void* base = is_v ? c.v : c.k;
  if (c.fp8) {
    const Fp8* x = static_cast<const Fp8*>(base) + off;
    const float s = is_v ? c.v_scale[hk * c.v_scale_stride] : c.k_scale[hk * c.k_scale_stride];
    for (int d = 0; d < D; ++d) out[d] = static_cast<float>(x[d]) * s;
  } else {
    const T* x = static_cast<const T*>(base) + off;
    for (int d = 0; d < D; ++d) out[d] = static_cast<float>(x[d]);
  }
}

template <typename T>
void decode_cpu_impl(const DecodeParams& p, bool full_fusion) {
  const RopeParams& r = p.rope;
  const int D = r.D, half = r.R / 2;
  const std::vector<float> freq = freq_table(r);
  const int64_t rows = p.B * p.q_len * p.Hq;
  const float ninf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> sn(half), cs(half), qf(D), kf(D), vf(D), acc(D), scores;
    for (int64_t row = r0; row < r1; ++row) {
      // Output order [B, q_len, Hq]: row = (b * q_len + j) * Hq + hq.
      const int64_t hq = row % p.Hq, j = (row / p.Hq) % p.q_len, b = row / (p.Hq * p.q_len);
      const int64_t hk = hq / p.G;
      T* o = static_cast<T*>(p.o) + row * D;
      const int64_t seqlen = decode_seqlen(p, b);
      const int64_t n = decode_key_limit(p, seqlen, j);
      // The query, rotated in fp32, the softmax scale folded in.
      row_sincos(r, freq, attn_position(r, b, j, b, seqlen - p.q_len + j), sn.data(), cs.data());
      const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + j * p.q_stride[1] + hq * p.q_stride[2];
      load_row_f32<T>(r, q, p.q_stride[3], qf.data(), sn.data(), cs.data());
      for (int d = 0; d < D; ++d) qf[d] *= p.softmax_scale;
      scores.assign(std::max<int64_t>(n, 0), ninf);
      float m = ninf;
      bool nan = false;  // a NaN score: the row is NaN, not empty
      for (int64_t i = 0; i < n; ++i) {
        int64_t ko, vo;
        if (!cache_slot(p.cache, b, i, &ko, &vo)) continue;  // no such block: the key is skipped
        if (full_fusion) {
          // The cache holds un-rotated keys: rotate by position index + offsets.
          const T* k = static_cast<const T*>(p.cache.k) + ko + hk * p.cache.k_stride[2];
          row_sincos(r, freq, attn_position(r, 0, 0, b, i), sn.data(), cs.data());
          load_row_f32<T>(r, k, 1, kf.data(), sn.data(), cs.data());
        } else {
          load_cache_row<T>(p.cache, false, ko + hk * p.cache.k_stride[2], hk, D, kf.data());
        }
        float s = 0.f;
        for (int d = 0; d < D; ++d) s += qf[d] * kf[d];
        scores[i] = s;
        m = std::max(m, s);
        nan |= std::isnan(s);
      }
      if (nan) m = std::numeric_limits<float>::quiet_NaN();  // std::max dropped it: NaN weights, NaN row
      float* lse = p.lse + row;
      if (m == ninf) {  // no key (or every score -inf, as the GPU kernels): zeros, lse = -inf
        for (int d = 0; d < D; ++d) o[d] = static_cast<T>(0.f);
        *lse = ninf;
        continue;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      float l = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        if (scores[i] == ninf) continue;
        int64_t ko = 0, vo = 0;
        cache_slot(p.cache, b, i, &ko, &vo);  // valid: its score is finite
        load_cache_row<T>(p.cache, true, vo + hk * p.cache.v_stride[2], hk, D, vf.data());
        const float e = std::exp(scores[i] - m);
        l += e;
        for (int d = 0; d < D; ++d) acc[d] += e * vf[d];
      }
      for (int d = 0; d < D; ++d) o[d] = static_cast<T>(acc[d] / l);
      *lse = m + std::log(l);
    }
  });
}

}  // namespace

void append_kv_cpu(const AppendParams& p, at::ScalarType dtype) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_ext_append_kv_cpu",
                                  [&] { append_cpu_impl<scalar_t>(p); });
}

void attention_decode_cpu(const DecodeParams& p, at::ScalarType dtype, bool full_fusion) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_ext_attention_decode_cpu",
                                  [&] { decode_cpu_impl<scalar_t>(p, full_fusion); });
}

}  // namespace rope_ext
