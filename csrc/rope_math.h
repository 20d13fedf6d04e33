// Host/device helpers shared by every implementation: the CUDA variants and the
// CPU path call these, so the index rules and the arithmetic exist once.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "rope_params.h"

#if defined(__CUDACC__)
#define ROPE_HD __host__ __device__ __forceinline__
#else
#define ROPE_HD inline
#endif

namespace rope_ext {

// Arithmetic type: fp32 for fp32/fp16/bf16 (one rounding, at the store); double for
// float64 inputs, so that gradcheck sees an exactly linear function of x.
template <typename T>
using acc_t = typename std::conditional<std::is_same<T, double>::value, double, float>::type;

// One pair's rotation, y0 = x0 c - x1 s and y1 = x1 c + x0 s, with one rounding order on
// the GPU: the second product rounded, then one fma. Left to itself nvcc contracts each
// expression into an fma one way or the other and may choose differently in two
// unrollings of the same source (the lean kernel at 8-byte accesses differed from the
// tiles in the last bit, bench/NOTES.md issue 19 run 10); every kernel rotates through
// these, so they give the same bits. The host keeps the plain expressions (no FMA unit
// assumed on x86-64).
template <typename A>
ROPE_HD A rot_y0(A x0, A x1, A c, A s) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<A, double>::value) return __fma_rn(x0, c, -__dmul_rn(x1, s));
  else return __fmaf_rn(x0, c, -__fmul_rn(x1, s));
#else
  return x0 * c - x1 * s;
#endif
}
template <typename A>
ROPE_HD A rot_y1(A x0, A x1, A c, A s) {
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<A, double>::value) return __fma_rn(x1, c, __dmul_rn(x0, s));
  else return __fmaf_rn(x1, c, __fmul_rn(x0, s));
#else
  return x1 * c + x0 * s;
#endif
}

ROPE_HD int64_t load_index(const IndexArray& a, int64_t elem_offset) {
  return a.is64 ? static_cast<const int64_t*>(a.ptr)[elem_offset]
                : static_cast<int64_t>(static_cast<const int32_t*>(a.ptr)[elem_offset]);
}

ROPE_HD float load_float(const void* ptr, DType dt, int64_t off) {
  switch (dt) {
    case DType::kFloat16: return static_cast<float>(static_cast<const c10::Half*>(ptr)[off]);
    case DType::kBFloat16: return static_cast<float>(static_cast<const c10::BFloat16*>(ptr)[off]);
    case DType::kFloat64: return static_cast<float>(static_cast<const double*>(ptr)[off]);
    default: return static_cast<const float*>(ptr)[off];
  }
}

// Context parallelism: local index j of a sequence held as two chunks of L/2 local
// tokens (chunks r and 2*cp_size-1-r of the global sequence) -> its global index.
ROPE_HD int64_t cp_global_index(const RopeParams& p, int64_t j, int64_t L) {
  if (p.cp_size == 1) return j;
  const int64_t c = L / 2;
  return j < c ? p.cp_rank * c + j : (2 * p.cp_size - 1 - p.cp_rank) * c + (j - c);
}

// Local start of packed sequence n (cu_seqlens are global under context parallelism).
ROPE_HD int64_t seq_start(const RopeParams& p, int64_t n) {
  return load_index(p.cu_seqlens, n * p.cu_seqlens.stride) / p.cp_size;
}

// The sequence holding packed token t: the last n with start(n) <= t.
// Clamped to [0, num_seqs), so malformed cu_seqlens can never index out of bounds.
ROPE_HD int64_t seq_of_token(const RopeParams& p, int64_t t) {
  int64_t lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (seq_start(p, mid) <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Position of token (b, s) on position axis `axis` (0 unless M-RoPE / axial).
ROPE_HD int64_t position_of(const RopeParams& p, int64_t b, int64_t s, int axis = 0) {
  if (p.positions.ptr)
    return load_index(p.positions, axis * p.pos_stride_axis + b * p.pos_stride_b + s * p.positions.stride);
  if (p.cu_seqlens.ptr) {
    const int64_t n = seq_of_token(p, s);
    const int64_t start = seq_start(p, n), len = seq_start(p, n + 1) - start;
    return cp_global_index(p, s - start, len) +
           (p.offsets.ptr ? load_index(p.offsets, n * p.offsets.stride) : p.offset);
  }
  return cp_global_index(p, s, p.S) + (p.offsets.ptr ? load_index(p.offsets, b * p.offsets.stride) : p.offset);
}

// The position axis that rotates pair i (rope_params.h, "Multi-axis positions").
ROPE_HD int axis_of_pair(const RopeParams& p, int i) {
  if (p.num_axes == 1) return 0;
  if (p.axes_interleaved) {
    const int m = i % 3;
    return (m > 0 && m < p.num_axes && i < 3 * p.section[m]) ? m : 0;
  }
  int end = 0;
  for (int a = 0; a < p.num_axes - 1; ++a) {
    end += p.section[a];
    if (i < end) return a;
  }
  return p.num_axes - 1;
}

ROPE_HD int64_t pair_position(const RopeParams& p, int64_t b, int64_t s, int i) {
  return position_of(p, b, s, axis_of_pair(p, i));
}

// The kernels never evaluate pow: kBase frequencies are HF's float32 table, built on
// the host (rope_ops.cpp) and carried in the params.
ROPE_HD float inv_freq_of(const RopeParams& p, int i) {
  if (p.freq == FreqSource::kInvFreq) return p.inv_freq[i * p.inv_freq_stride];
  if (p.freq == FreqSource::kBase) return p.base_freqs[i];
  return 0.f;  // cos/sin cache: no frequency needed
}

// sin/cos of the angle pos * f, accurate at any position.
// The fp32 product pos * f is off by up to ulp(pos * f) (~1 rad at pos = 2^24), and
// fast-math __sinf/__cosf lose accuracy on large arguments. So the angle is reduced
// exactly (or nearly) to one turn first, then an accurate (non-fast-math) sin/cos.
// The GPU path is chosen at compile time (setup.py's ROPE_EXT_ANGLE, one build each,
// so that one GPU run can compare them: scripts/gpu_latency.sh); the CPU always takes
// double. Errors below: bench/angle_emulation.py (CPU emulation, exact truth; the
// table is in bench/NOTES.md, issue 19); "angle error" is that of the argument the
// sin/cos routine evaluates (with the correction term where there is one).
//   double: the product in double (exact for |pos| < 2^29), reduced with a
//     double-double 2 pi, rounded to fp32 radians, sincosf. Angle error <= 1.2e-7 rad
//     below 2^29 (the one fp32 rounding), 2.4e-7 to 2^31.
//     (Measured on the H100: __sincosf on the reduced angle, abs error <= 2^-21.4 there,
//     made fp32 2-3e-7 * max|x| and bf16 up to 1.85 ulp on small outputs, and did not
//     speed up the bf16 W1 workload; so the accurate one stays.) sincosf inlines its
//     Payne-Hanek slow path (~100 instructions, a 32-byte stack frame) at every call
//     site although |r| <= pi never takes it: cold code for a ~5 us kernel (issue 11).
//   sincospif (-DROPE_EXT_SINCOSPIF, issue 11): a / pi in double reduced to half-turns,
//     sincospif (1 ulp, CUDA's documented bound; sincosf's is 2; no slow path).
//     9.5e-8 rad below 2^24, 1.7e-7 to 2^29, 4.1e-7 to 2^31.
//   turns (the default, -DROPE_EXT_ANGLE_TURNS, issue 19): no FP64 below |pos| 2^24. f in turns as an
//     fp32 pair hi + lo (f / 2 pi split in fp32 from f: no table, any frequency source),
//     p = pos hi, e = fma(pos, hi, -p) (exact), r = (p - rint(p)) + fma(pos, lo, e), and
//     that last sum's rounding d (Fast2Sum) added after sincospif(2 r) as a first-order
//     correction (without it r's fp32 rounding, up to 2^-25 turn when |r| passes 1/2,
//     reaches 2.4e-7 rad: worse than double). fp32 pos is exact only below 2^24, so
//     larger |pos| (and |pos hi| >= 2^22 turns, i.e. f > ~1.5 rad at 2^24) take the
//     double reduction, in turns, then the same sincospif. Angle error 5.8e-8 rad below
//     2^24 (fma(pos, lo, e)'s rounding), 1.2e-7 to 2^31 (the double product past 2^29).
//   fixed (-DROPE_EXT_ANGLE_FIXED, issue 19): no FP64, no branch on pos: f in turns as a
//     64-bit fixed-point fraction T (f's 24-bit significand times round(2^64 / 2 pi),
//     shifted), the turn count pos * T mod 2^64 an exact integer product for any int64
//     pos; its top 24 bits (exact in fp32) go to sincospif, the next 32 to the
//     correction. Angle error ~1e-9 rad at 2^31 (T's error, < 2 units of 2^-64 turn
//     for |f| < 2, times pos), far below the fp32 result's rounding at any position.
#if defined(__CUDA_ARCH__) && (defined(ROPE_EXT_ANGLE_TURNS) || defined(ROPE_EXT_ANGLE_FIXED))
// sin/cos of pi * h (h in half-turns, exact) + 2 pi d (d in turns, |d| < ~2^-24):
// sincospif, then the first-order correction (its square, < 1e-13, is dropped).
__device__ __forceinline__ void sincos_halfturns(float h, float d, float* s, float* c) {
  float s0, c0;
  ::sincospif(h, &s0, &c0);
  const float a = __fmul_rn(d, 6.28318548f);
  *s = __fmaf_rn(a, c0, s0);
  *c = __fmaf_rn(-a, s0, c0);
}
#endif
#if defined(__CUDA_ARCH__) && defined(ROPE_EXT_ANGLE_TURNS)
// The angle in turns, r + d (|r| <= ~0.5). The _rn intrinsics keep the compiler from
// contracting a product into a later add, which the exactness arguments rely on.
// f / 2 pi = hi + lo (about 2^-48 relative): 1 / 2 pi as two floats, the exact product
// error of the first, then hi + lo renormalised (|lo| <= ulp(hi) / 2).
__device__ __forceinline__ void turns_split(float f, float* hi, float* lo) {
  const float h0 = __fmul_rn(f, 0x1.45f306p-3f);
  const float l0 = __fmaf_rn(f, 0x1.b93910p-28f, __fmaf_rn(f, 0x1.45f306p-3f, -h0));
  *hi = __fadd_rn(h0, l0);
  *lo = __fsub_rn(l0, __fsub_rn(*hi, h0));
}
// The fp32 reduction, exact where fast_pos (|pos| < 2^24) and |x hi| < 2^22 turns; returns
// whether that holds. x = pos as fp32; p = x hi.
__device__ __forceinline__ bool reduce_turns_fp32(float x, float hi, float lo, float* r, float* d) {
  const float p = __fmul_rn(x, hi);
  const float e = __fmaf_rn(x, hi, -p);     // exact: the product's rounding error
  const float f1 = __fsub_rn(p, rintf(p));  // exact: a multiple of ulp(p)
  const float q = __fmaf_rn(x, lo, e);      // |q| < 2 ulp(p)
  *r = __fadd_rn(f1, q);
  *d = __fsub_rn(q, __fsub_rn(*r, f1));     // Fast2Sum (f1 = 0 or |f1| >= ulp(p))
  return fabsf(p) < 0x1p22f;                // false for NaN: the double path then
}
__device__ __forceinline__ bool fast_turns_pos(int64_t pos) {
  return static_cast<uint64_t>(pos + (int64_t(1) << 24)) < (uint64_t(1) << 25);
}
__device__ __forceinline__ void reduce_turns(int64_t pos, float f, float* r, float* d) {
  float hi, lo;
  turns_split(f, &hi, &lo);
  const float x = static_cast<float>(static_cast<int32_t>(pos));  // exact when |pos| < 2^24
  if (fast_turns_pos(pos) && reduce_turns_fp32(x, hi, lo, r, d)) return;
  const double a = static_cast<double>(pos) * static_cast<double>(f);
  const double k = ::rint(a * 0.15915494309189535);
  double t = ::fma(-k, 6.283185307179586, a);
  t = ::fma(-k, 2.4492935982947064e-16, t) * 0.15915494309189535;
  *r = static_cast<float>(t);
  *d = static_cast<float>(t - static_cast<double>(*r));
}
// reduce_turns as a call, for angle_sincos_chunk's rare branch ((r, d) in registers).
static __device__ __noinline__ float2 reduce_turns_outlined(int64_t pos, float f) {
  float2 t;
  reduce_turns(pos, f, &t.x, &t.y);
  return t;
}
#endif
#if defined(__CUDA_ARCH__) && defined(ROPE_EXT_ANGLE_FIXED)
// f / 2 pi as a 64-bit fraction of a turn (mod 1): f = m 2^-sh with m its 24-bit
// significand, T = m * round(2^64 / 2 pi) >> sh. Error < f / 2 + 1 units of 2^-64
// turn (< 2 for every RoPE frequency); NaN/inf give NaN (angle_sincos).
__device__ __forceinline__ uint64_t turns_fixed(float f) {
  constexpr uint64_t kK = 0x28be60db9391054aull;  // round(2^64 / 2 pi), 62 bits
  const uint32_t bits = __float_as_uint(f);
  const uint32_t ex = (bits >> 23) & 0xffu;
  const uint64_t m = ex ? ((bits & 0x7fffffu) | 0x800000u) : (bits & 0x7fffffu);  // f = m 2^-sh
  const int sh = 150 - static_cast<int>(ex ? ex : 1);
  const uint64_t lo = m * kK, hi = __umul64hi(m, kK);  // m * kK: 86 bits, hi < 2^22
  uint64_t t;
  if (sh >= 128) t = 0;
  else if (sh >= 64) t = hi >> (sh - 64);
  else if (sh > 0) t = (lo >> sh) | (hi << (64 - sh));
  else t = lo << (-sh < 63 ? -sh : 63);  // f >= 2^23 rad per position: defined, not accurate
  return (bits >> 31) ? 0 - t : t;
}
#endif

ROPE_HD void angle_sincos(int64_t pos, float f, float* s, float* c) {
#if defined(__CUDA_ARCH__) && defined(ROPE_EXT_ANGLE_TURNS)
  float r, d;
  reduce_turns(pos, f, &r, &d);
  sincos_halfturns(2.f * r, d, s, c);
#elif defined(__CUDA_ARCH__) && defined(ROPE_EXT_ANGLE_FIXED)
  // pos * T mod 2^64: the angle in turns, [-1/2, 1/2) as a signed 64-bit fraction.
  const int64_t x = static_cast<int64_t>(static_cast<uint64_t>(pos) * turns_fixed(f));
  const float h = static_cast<float>(static_cast<int32_t>(x >> 40)) * 0x1p-23f;  // top 24 bits, half-turns, exact
  const float d = static_cast<float>(static_cast<uint32_t>(x >> 8)) * 0x1p-56f;   // bits 8..39, turns in [0, 2^-24)
  sincos_halfturns(h, d, s, c);
  if (!(fabsf(f) <= 3.402823466e38f)) *s = *c = f - f;  // NaN/inf frequency: NaN, as the other paths
#elif defined(__CUDA_ARCH__) && defined(ROPE_EXT_SINCOSPIF)
  const double a = static_cast<double>(pos) * static_cast<double>(f);
  const double t = a * 0.3183098861837907;          // 1 / pi
  const double r = ::fma(-2.0, ::rint(t * 0.5), t);  // exact: t - 2k, in [-1, 1]
  ::sincospif(static_cast<float>(r), s, c);
#else
  const double a = static_cast<double>(pos) * static_cast<double>(f);
  const double k = ::rint(a * 0.15915494309189535);  // 1 / (2 pi)
  double r = ::fma(-k, 6.283185307179586, a);         // 2 pi, high part
  r = ::fma(-k, 2.4492935982947064e-16, r);           // 2 pi, low part
  const float rf = static_cast<float>(r);
#if defined(__CUDA_ARCH__)
  ::sincosf(rf, s, c);
#else
  *s = std::sin(rf);
  *c = std::cos(rf);
#endif
#endif
}

// The sin/cos of P frequencies at one position: angle_sincos's results bit for bit, as
// straight-line code. Per pair, turns' range test is a branch around each reduction,
// and the P reductions and sincospif then ran one after the other (a chain of P sin/cos
// latencies per thread, bench/NOTES.md issue 19, session of 2026-11-25 evening); here
// the P fp32 reductions run unconditionally and one branch, taken only where some pair
// is out of the fp32 range (|pos| >= 2^24, or >= 2^22 turns), redoes them by
// angle_sincos's own rule.
template <int P>
ROPE_HD void angle_sincos_chunk(int64_t pos, const float* f, float* s, float* c) {
#if defined(__CUDA_ARCH__) && defined(ROPE_EXT_ANGLE_TURNS)
  float r[P], d[P];
  const float x = static_cast<float>(static_cast<int32_t>(pos));
  bool fast = fast_turns_pos(pos);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    float hi, lo;
    turns_split(f[j], &hi, &lo);
    fast &= reduce_turns_fp32(x, hi, lo, &r[j], &d[j]);
  }
  if (!fast) {  // out of line: its FP64 code would otherwise sit in the middle of the hot path
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const float2 t = reduce_turns_outlined(pos, f[j]);
      r[j] = t.x;
      d[j] = t.y;
    }
  }
#pragma unroll
  for (int j = 0; j < P; ++j) sincos_halfturns(2.f * r[j], d[j], &s[j], &c[j]);
#else
  for (int j = 0; j < P; ++j) angle_sincos(pos, f[j], &s[j], &c[j]);
#endif
}

// sin/cos for pair i of a token at `pos`, times p.scale, sin carrying the direction sign.
// A cache position outside [0, cache_rows) gives NaN (visible) instead of a read
// out of bounds; the host rejects such positions where it can check them for free.
ROPE_HD void pair_sincos(const RopeParams& p, int64_t pos, int i, float f, float* s, float* c) {
  // Into locals, written once: s and c may point into the same shared table, so a
  // scale applied through the pointers made the compiler store, reload and store again
  // (STS, LDS, STS in variant 4's table fill: a shared-memory round trip on the chain).
  float sv, cv;
  if (p.freq == FreqSource::kCosSinCache) {
    if (pos < 0 || pos >= p.cache_rows) {
      *s = *c = std::numeric_limits<float>::quiet_NaN();
      return;
    }
    const int64_t row = pos * p.cache_stride_row;
    cv = load_float(p.cache, p.cache_dtype, row + i * p.cache_stride_col);
    sv = load_float(p.cache, p.cache_dtype, row + (i + p.R / 2) * p.cache_stride_col);
  } else {
    angle_sincos(pos, f, &sv, &cv);
  }
  *s = sv * (p.sign * p.scale);
  *c = cv * p.scale;
}

// Feature indices of pair i: neox (i, i + R/2), GPT-J (2i, 2i + 1).
ROPE_HD void pair_dims(const RopeParams& p, int i, int* d0, int* d1) {
  *d0 = p.interleaved ? 2 * i : i;
  *d1 = p.interleaved ? 2 * i + 1 : i + p.R / 2;
}

// The 16-byte chunks of a row (vector variants 3 and 4), V elements each: first the
// rotary chunks (of each half for neox, whole for GPT-J), then the pass-through tail
// (out of place only). Chunk c starts at feature chunk_start (neox: its partner
// chunk R/2 later).
ROPE_HD int rot_chunks(const RopeParams& p, int V) { return p.interleaved ? p.R / V : p.R / 2 / V; }
ROPE_HD int row_chunks(const RopeParams& p, int V) {
  return rot_chunks(p, V) + (p.copy_tail ? (p.D - p.R) / V : 0);
}
ROPE_HD int chunk_start(const RopeParams& p, int c, int V) {
  const int rc = rot_chunks(p, V);
  return c < rc ? c * V : p.R + (c - rc) * V;
}

// A token group is a token (b, s), or, when positions do not depend on b, the
// column s of all B sequences: sin/cos are then computed once for the batch.
ROPE_HD int64_t num_groups(const RopeParams& p) { return p.pos_shared_b ? p.S : p.B * p.S; }
ROPE_HD int64_t batches_per_group(const RopeParams& p) { return p.pos_shared_b ? p.B : 1; }
ROPE_HD int64_t heads_total(const RopeParams& p) {
  return p.num_tensors > 1 ? p.t[0].H + p.t[1].H : p.t[0].H;
}
ROPE_HD int64_t rows_per_group(const RopeParams& p) { return batches_per_group(p) * heads_total(p); }

ROPE_HD void group_token(const RopeParams& p, int64_t g, int64_t* b0, int64_t* s) {
  if (p.pos_shared_b) { *b0 = 0; *s = g; return; }
  // A 64-bit divide is a long subroutine on the GPU; token counts below 2^32 (all
  // real ones) take the 32-bit divide.
  if ((static_cast<uint64_t>(g) >> 32) == 0 && (static_cast<uint64_t>(p.S) >> 32) == 0)
    *b0 = static_cast<uint32_t>(g) / static_cast<uint32_t>(p.S);
  else
    *b0 = g / p.S;
  *s = g - (*b0) * p.S;
}

// Row r of a group of NB batches: tensor t (q rows first, then k), batch b0 + bb,
// head h.
struct RowCoord { int t; int64_t b, h; };
ROPE_HD RowCoord row_coord(const RopeParams& p, int64_t NB, int64_t b0, int64_t r) {
  int t = 0;
  if (p.num_tensors > 1 && r >= NB * p.t[0].H) { r -= NB * p.t[0].H; t = 1; }
  const int64_t H = p.t[t].H;
  // 32-bit division: rows of a group fit (the host keeps NB * heads < 2^31), and a
  // 64-bit divide is a long subroutine that cost the vector kernel registers.
  const uint32_t bb32 = static_cast<uint32_t>(r) / static_cast<uint32_t>(H);
  const int64_t bb = bb32;
  return RowCoord{t, b0 + bb, r - bb * H};
}

// The element offsets of the row's first feature in input and output.
struct RowOffsets { int t; int64_t in, out; };
ROPE_HD RowOffsets row_offsets(const RopeParams& p, int64_t NB, int64_t b0, int64_t s, int64_t r) {
  const RowCoord c = row_coord(p, NB, b0, r);
  const TensorView& v = p.t[c.t];
  RowOffsets o;
  o.t = c.t;
  o.in = c.b * v.in_stride[0] + s * v.in_stride[1] + c.h * v.in_stride[2];
  o.out = c.b * v.out_stride[0] + s * v.out_stride[1] + c.h * v.out_stride[2];
  return o;
}

// Rotates pair i of one row (scalar loads; both elements are read before either is
// written, which keeps the in-place op correct).
template <typename T>
ROPE_HD void rotate_pair(const RopeParams& p, const TensorView& v, const RowOffsets& o, int i,
                         float s, float c) {
  int d0, d1;
  pair_dims(p, i, &d0, &d1);
  const T* in = static_cast<const T*>(v.in);
  T* out = static_cast<T*>(v.out);
  using A = acc_t<T>;
  const A x0 = static_cast<A>(in[o.in + d0 * v.in_stride[3]]);
  const A x1 = static_cast<A>(in[o.in + d1 * v.in_stride[3]]);
  out[o.out + d0 * v.out_stride[3]] = static_cast<T>(rot_y0<A>(x0, x1, c, s));
  out[o.out + d1 * v.out_stride[3]] = static_cast<T>(rot_y1<A>(x0, x1, c, s));
}

template <typename T>
ROPE_HD void copy_feature(const TensorView& v, const RowOffsets& o, int d) {
  static_cast<T*>(v.out)[o.out + d * v.out_stride[3]] =
      static_cast<const T*>(v.in)[o.in + d * v.in_stride[3]];
}

}  // namespace rope_ext
