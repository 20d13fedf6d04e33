// Issue 19: where a 0.12-8 MB out-of-place rope call spends the time that torch.compile's
// Triton kernel does not (bench/small_rope_study.py builds this file with
// torch.utils.cpp_extension.load and times each variant as the latency suite does).
// x [S, H = 32, D = 128] bf16, GPT-NeoX pairs, positions 0..S-1; one thread per 8-byte
// chunk of each half of a row (4 pairs), 128 threads per block.
//
// Variants (what each asks):
//   0 copy_lean    lean's mapping (a block: 8 heads x 16 chunks of one token), x read and
//                  written unchanged: the floor of this launch shape.
//   1 lean_global  + frequencies loaded from a global fp32 table, sin/cos computed
//                  (angle_sincos_chunk, rope_math.h): lean's arithmetic with each lane
//                  computing its own sin/cos (kSource 0).
//   2 lean_param   frequencies from the kernel's parameter block (a per-lane index: the
//                  constant cache serializes the 16 distinct addresses of a warp).
//   3 lean_fake    as 1, sin/cos replaced by two multiplies: the chain without sin/cos.
//   4 lean_table   cos and sin read from global fp32 tables [S, 64] with x (Triton's
//                  shape of work: three loads, then FMAs).
//   5 uni_global   the uniform mapping: a warp holds ONE chunk of 32 heads of one token
//                  (lanes = heads), so its frequencies and position are warp-uniform;
//                  frequencies from the global table (a broadcast load).
//   6 uni_param    as 5, frequencies from the parameter block (uniform index: one
//                  constant-cache access, no DRAM trip after the parameters').
//   7 copy_uni     the uniform mapping, copy only.
//   8 uni_fake     as 6 with the fake sin/cos.
//   9 lean_rb2     as 1 in blocks of 32 threads (2 heads x 16 chunks): the block shape
//                  rope_ext's lean rule picks at 0.12 MB (it halves rows per block until
//                  the blocks cover the SMs).
//  10 lean_seq     as 1 with the position s - cu_seqlens[0] (a load before sin/cos: the
//                  packed-sequence form's chain).
//  11 lean_rb2_seq both.
//  12 real_k2      rope_ext's own lean kernel (rope_variants.cuh, kSource 1, U = 1, 8 rows
//                  per block) launched from this module: does rope_ext's time come from
//                  its kernel's code, or from around it? kSource 1 was two lanes sharing
//                  sin/cos by shuffles (K = 2) until 2026-11-26, the block's table in
//                  shared memory since (the name is kept for the tables in NOTES).
//  13 real_k1      the same at kSource 0 (each lane its own sin/cos).
//  14 lines2       lean_global with its pointers read from a parameter block of 64-byte
//                  lines: x and out from line 0, the frequencies from line 1 (the
//                  minimal kernel's hot fields share one line; lean's spanned four until
//                  2026-11-26).
//  15 lines4       x from line 0, the frequencies from line 1, out from line 2, and a
//                  null test from line 3 before the sin/cos (as lean's position fields were):
//                  if each cold constant line costs the chain a round trip, this runs at
//                  lean's time (real_k1) and 14 between.
//  16 lean_nopos   rope_ext's lean kernel at K = 1 (its LeanParams, runtime shapes, q/k
//                  selects, 64-bit index math) without its position code: the position
//                  is s + offset. Between lean_global and real_k1, it splits lean's extra
//                  time into its index math and parameters versus its position code.
//                  Run 1 of 2026-11-26 (H200, 0.12 MB, graph medians, us): lean_global
//                  3.74, lines2 4.06, lines4 4.06, lean_nopos 4.10, real_k1 4.54. ncu, each
//                  kernel alone (run 3): 2.50, 2.56, -, 2.85, 3.07: a second constant line
//                  costs nothing (the medians' 0.3 us was their modes' noise); lean's
//                  runtime shapes and selects ~0.3 us, its position code ~0.2.
//  17 lean_smem    lean_global with a token's sin/cos computed once per block: 64 lanes
//                  one pair each, into shared memory, then every lane its 4 pairs. At
//                  0.5-2 MB the minimal kernel trails torch.compile (4.54 vs 3.76 us at
//                  0.5 MB), with each lane computing 4 sin/cos 8 times per block: is
//                  that issue work the time there?
//  18 lean_smem4   as 17 with a block per token (32 heads, 4 rows per lane): a quarter of
//                  the blocks and of the sin/cos.
//  19 lean_pf      lean_global with thread 0 of each block prefetching (prefetch.global.L2)
//                  its output row right after the loads: the out page's address
//                  translation, cold after the flush, walked while the loads are in flight
//                  rather than in front of the stores. (Run 1 of 2026-11-26 (second), H100,
//                  graph medians at 0.12 MB: lean_global 4.19, its "_far" form 4.42,
//                  real_k2 4.42 / 4.67 far, the op 4.86: a separate segment costs ~0.23;
//                  ncu, which does not flush the TLBs, saw no difference.)
//  20 lean_ld      as 19 by a load of the row's first word (a prefetch may be dropped on a
//                  TLB miss).
//  21 nopos_const  lean_nopos with the launch shape (cshift, rows per block, rows, H0) as
//                  constants: what runtime shapes cost (issue 19's "runtime shapes and
//                  selects ~0.35 us", H200, split in two; the ninth session of 2026-11-26).
//  22 nopos_one    lean_nopos with one tensor: no q / k selects, shapes at run time.
//  23 nopos_both   both: lean_nopos's address math with neither.
//                  Run 4 of the ninth session (H100, ncu alone, 0.12 MB): lean_nopos 3.14
//                  us, nopos_const 3.14, nopos_one 3.17, nopos_both 3.14, lean_global
//                  3.07: constant shapes and one tensor cost nothing here; the ~0.07 over
//                  lean_global is LeanParams and its index math (the H200's 0.35 did
//                  not reproduce).
//  24 plain_k0     rope_ext's lean kernel, the instance of calls without position tensors
//                  (kPlain), per-lane sin/cos (kSource 0), with lean_nopos's parameters.
//                  Asked after run 4, where the op's bshd call took 3.46-3.58 us with the
//                  table but 4.32 per-lane (run 5: 3.55 / 3.94): the kernel's code or the
//                  op's call? Run 5: 3.62 here against nopos's 3.14, so the code: the
//                  kernel unpacked x right behind its load, holding back what followed.
//                  Run 6 (pin_word, frequencies first at U = 1): 3.46.
//  25 plain_k1     the same instance with the block's table (kSource 1, auto's choice until
//                  the twenty-eighth session's plain1):
//                  run 5 3.30, run 6 3.26 (the op's bshd call 3.55 / 3.58).
//  26 plain1       rope_lean_plain1_kernel (rope_ext's kernel for plain calls at one row a
//                  thread since the twenty-eighth session: lean_nopos's structure, rope_ext's
//                  types and widths), launched with lean_nopos's parameters.
//  (real_pf, removed: real_k2 with lean's kLeanWarmOut flag, a prefetch; the flag
//                  was reverted.) Run 2 of 2026-11-26 (second), H100, graph medians, two
//                  passes, us: 0.12 MB lean_global 4.06 / 3.97, far 4.29 / 4.26; lean_pf 4.29
//                  / 4.29, far 4.30 / 4.29; lean_ld 4.29 / 4.27, far 4.51 / 4.29; real_k2 4.51
//                  / 4.45, far 4.74 / 4.64; real_pf 4.74 / 4.67, far 4.96 / 4.80; the op with
//                  the flag 4.96 / 4.80, without 4.93 / 4.80. Touching the output early
//                  costs what the far segment costs and does not take the far cost
//                  away: not a latency on the chain that an early touch can hide.
#include <cuda_bf16.h>
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

#include "rope_math.h"
#include "cuda/rope_variants.cuh"

namespace {
using bf16 = __nv_bfloat16;
constexpr int kH = 32, kD = 128, kHalf = 64, kV = 4;  // V: bf16 per 8-byte chunk

struct StudyParams {
  const bf16* x;
  bf16* out;
  const float* freq_g;  // [64]
  const float* tcos;    // [S, 64]
  const float* tsin;
  const int* seq_start;  // [1] = 0
  int S;
  float freq[kHalf];
};

// A thread's two 8-byte chunks (4 pairs) rotated by rope_ext's own rotate_chunk (lean's)
// and stored: the same bits as rope_ext's kernels.
__device__ __forceinline__ void rotate_store(uint2 xa, uint2 xb, const float* sn, const float* cs, void* out_a,
                                             void* out_b) {
  using VecT = rope_ext::cuda::Vec<c10::BFloat16, kV>;
  VecT va, vb;
  *reinterpret_cast<uint2*>(&va) = xa;
  *reinterpret_cast<uint2*>(&vb) = xb;
  rope_ext::cuda::rotate_chunk<c10::BFloat16, false>(va, vb, sn, cs);
  *reinterpret_cast<uint2*>(out_a) = *reinterpret_cast<const uint2*>(&va);
  *reinterpret_cast<uint2*>(out_b) = *reinterpret_cast<const uint2*>(&vb);
}

template <int kVar>
__global__ void __launch_bounds__(128) study_kernel(const __grid_constant__ StudyParams p) {
  constexpr bool kUni = kVar >= 5 && kVar <= 8;
  int c, h;
  const int s = blockIdx.y;
  if (kUni) {
    c = blockIdx.x * 4 + (threadIdx.x >> 5);
    h = threadIdx.x & 31;
  } else {
    c = threadIdx.x & 15;
    h = blockIdx.x * (blockDim.x >> 4) + (threadIdx.x >> 4);
  }
  const int64_t row = (static_cast<int64_t>(s) * kH + h) * kD;
  const int d0 = c * kV;
  const uint2 xa = *reinterpret_cast<const uint2*>(p.x + row + d0);
  const uint2 xb = *reinterpret_cast<const uint2*>(p.x + row + d0 + kHalf);
  if (kVar == 0 || kVar == 7) {
    *reinterpret_cast<uint2*>(p.out + row + d0) = xa;
    *reinterpret_cast<uint2*>(p.out + row + d0 + kHalf) = xb;
  } else {
    float sn[kV], cs[kV];
    if (kVar == 4) {
      const float4 c4 = *reinterpret_cast<const float4*>(p.tcos + s * kHalf + d0);
      const float4 s4 = *reinterpret_cast<const float4*>(p.tsin + s * kHalf + d0);
      cs[0] = c4.x; cs[1] = c4.y; cs[2] = c4.z; cs[3] = c4.w;
      sn[0] = s4.x; sn[1] = s4.y; sn[2] = s4.z; sn[3] = s4.w;
    } else {
      float f[kV];
#pragma unroll
      for (int j = 0; j < kV; ++j) f[j] = (kVar == 2 || kVar == 6 || kVar == 8) ? p.freq[d0 + j] : p.freq_g[d0 + j];
      if ((kVar == 19 || kVar == 20) && threadIdx.x == 0) {
        if (kVar == 19) {
          asm volatile("prefetch.global.L2 [%0];" ::"l"(p.out + row));
        } else {
          uint32_t dummy;
          asm volatile("ld.global.relaxed.gpu.u32 %0, [%1];" : "=r"(dummy) : "l"(p.out + row));
        }
      }
      if (kVar == 3 || kVar == 8) {
#pragma unroll
        for (int j = 0; j < kV; ++j) {
          sn[j] = f[j] * static_cast<float>(s);
          cs[j] = 1.f - f[j];
        }
      } else {
        const int64_t pos = (kVar == 10 || kVar == 11) ? s - *p.seq_start : s;
        rope_ext::angle_sincos_chunk<kV>(pos, f, sn, cs);
      }
    }
    rotate_store(xa, xb, sn, cs, p.out + row + d0, p.out + row + d0 + kHalf);
  }
}

template <int kVar>
void launch(const StudyParams& p) {
  const bool uni = kVar >= 5 && kVar <= 8, rb2 = kVar == 9 || kVar == 11;
  const dim3 grid(uni ? 4 : rb2 ? kH / 2 : kH / 8, p.S);
  study_kernel<kVar><<<grid, rb2 ? 32 : 128, 0, c10::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Four 64-byte lines of pointers (kernel parameters start at c[0x0][0x210]).
struct LinesParams {
  const void* line[4][8];
};

template <int kLines>
__global__ void __launch_bounds__(128) lines_kernel(const __grid_constant__ LinesParams p) {
  const int c = threadIdx.x & 15, h = blockIdx.x * 8 + (threadIdx.x >> 4), s = blockIdx.y;
  const bf16* x = static_cast<const bf16*>(p.line[0][0]);
  const float* freq = static_cast<const float*>(p.line[1][1]);
  bf16* out = static_cast<bf16*>(const_cast<void*>(p.line[kLines == 2 ? 0 : 2][2]));
  const int64_t row = (static_cast<int64_t>(s) * kH + h) * kD;
  const int d0 = c * kV;
  const uint2 xa = *reinterpret_cast<const uint2*>(x + row + d0);
  const uint2 xb = *reinterpret_cast<const uint2*>(x + row + d0 + kHalf);
  float f[kV], sn[kV], cs[kV];
#pragma unroll
  for (int j = 0; j < kV; ++j) f[j] = freq[d0 + j];
  int64_t pos = s;
  if (kLines == 4 && p.line[3][3] != nullptr) pos += *static_cast<const int*>(p.line[3][3]);
  rope_ext::angle_sincos_chunk<kV>(pos, f, sn, cs);
  rotate_store(xa, xb, sn, cs, out + row + d0, out + row + d0 + kHalf);
}

template <int kLines>
void launch_lines(const StudyParams& sp) {
  LinesParams lp{};
  lp.line[0][0] = sp.x;
  lp.line[1][1] = sp.freq_g;
  lp.line[kLines == 2 ? 0 : 2][2] = sp.out;
  lines_kernel<kLines><<<dim3(kH / 8, sp.S), 128, 0, c10::cuda::getCurrentCUDAStream()>>>(lp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// A token's 64 sin/cos once per block, then each lane's 4 pairs of kRows rows.
template <int kRows>
__global__ void __launch_bounds__(128) smem_kernel(const __grid_constant__ StudyParams p) {
  __shared__ __align__(16) float tab[2][kHalf];  // sin, cos
  const int c = threadIdx.x & 15, s = blockIdx.y;
  const int h0 = blockIdx.x * 8 * kRows + (threadIdx.x >> 4);
  const int d0 = c * kV;
  uint2 xa[kRows], xb[kRows];
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    const int64_t row = (static_cast<int64_t>(s) * kH + h0 + 8 * u) * kD;
    xa[u] = *reinterpret_cast<const uint2*>(p.x + row + d0);
    xb[u] = *reinterpret_cast<const uint2*>(p.x + row + d0 + kHalf);
  }
  if (threadIdx.x < kHalf) {
    float f = p.freq_g[threadIdx.x], sn, cs;
    rope_ext::angle_sincos_chunk<1>(s, &f, &sn, &cs);
    tab[0][threadIdx.x] = sn;
    tab[1][threadIdx.x] = cs;
  }
  __syncthreads();
  const float4 s4 = *reinterpret_cast<const float4*>(&tab[0][d0]);
  const float4 c4 = *reinterpret_cast<const float4*>(&tab[1][d0]);
  const float sn[kV] = {s4.x, s4.y, s4.z, s4.w}, cs[kV] = {c4.x, c4.y, c4.z, c4.w};
#pragma unroll
  for (int u = 0; u < kRows; ++u) {
    const int64_t row = (static_cast<int64_t>(s) * kH + h0 + 8 * u) * kD;
    rotate_store(xa[u], xb[u], sn, cs, p.out + row + d0, p.out + row + d0 + kHalf);
  }
}

template <int kRows>
void launch_smem(const StudyParams& p) {
  smem_kernel<kRows><<<dim3(kH / (8 * kRows), p.S), 128, 0, c10::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// rope_lean_kernel<bf16, neox, U = 1, W = 8, kSource = 0> with its position code cut
// (the loads, sin/cos and stores as there; the frequencies loaded first, as the lean
// kernel does at U = 1 since the ninth session of 2026-11-26). kMode (variants 16, 21-23;
// what splits lean_nopos's ~0.35 us over lean_global, ncu run 3 of 2026-11-26):
// bit 0 the launch shape (cshift, rows per block, rows, H0) as constants instead of
// parameters; bit 1 one tensor (q's pointers and strides, no q/k selects).
template <int kMode>
__global__ void __launch_bounds__(128) lean_nopos_kernel(const __grid_constant__ rope_ext::cuda::LeanParams p) {
  using T = c10::BFloat16;
  constexpr bool kConst = kMode & 1, kOne = kMode & 2;
  const int cshift = kConst ? 4 : (p.cshift & rope_ext::cuda::kLeanShiftMask);
  const int rb = kConst ? 8 : p.rows_per_block, rows = kConst ? kH : p.rows, H0 = kConst ? kH : p.H0;
  const int c = threadIdx.x & ((1 << cshift) - 1);
  const int r = blockIdx.x * rb + (threadIdx.x >> cshift);
  const int64_t b = blockIdx.z, s = blockIdx.y, tok = b * gridDim.y + s;
  const int d0 = c * kV, d1 = d0 + (kV << cshift);
  if (r >= rows) return;
  const bool k = !kOne && r >= H0;
  const int64_t h = k ? r - H0 : r;
  const T* in = static_cast<const T*>(k ? p.in[1] : p.in[0]) + tok * (k ? p.in_ts[1] : p.in_ts[0]) +
                h * (k ? p.in_hs[1] : p.in_hs[0]);
  T* out = static_cast<T*>(k ? p.out[1] : p.out[0]) + b * (k ? p.out_s[1][0] : p.out_s[0][0]) +
           s * (k ? p.out_s[1][1] : p.out_s[0][1]) + h * (k ? p.out_s[1][2] : p.out_s[0][2]);
  const uint2 xa = *reinterpret_cast<const uint2*>(in + d0), xb = *reinterpret_cast<const uint2*>(in + d1);
  float f[kV], sn[kV], cs[kV];
#pragma unroll
  for (int j = 0; j < kV; ++j) f[j] = p.inv_freq[c * kV + j];
  rope_ext::angle_sincos_chunk<kV>(s + p.offset, f, sn, cs);
#pragma unroll
  for (int j = 0; j < kV; ++j) {  // as lean applies the scales
    sn[j] *= p.sin_scale;
    cs[j] *= p.cos_scale;
  }
  rotate_store(xa, xb, sn, cs, out + d0, out + d1);
}

rope_ext::cuda::LeanParams real_params(const StudyParams& sp) {
  rope_ext::cuda::LeanParams lp{};
  lp.cshift = 4;  // 16 chunks of 8 bytes per half row
  lp.rows_per_block = 8;
  lp.rows = kH;
  lp.H0 = kH;
  lp.in[0] = sp.x;
  lp.in_ts[0] = kH * kD;
  lp.in_hs[0] = kD;
  lp.out[0] = sp.out;
  const int32_t st[3] = {sp.S * kH * kD, kH * kD, kD};
  for (int i = 0; i < 3; ++i) lp.out_s[0][i] = st[i];
  lp.inv_freq = sp.freq_g;
  lp.sin_scale = lp.cos_scale = 1.f;
  return lp;
}

template <int kSource>
void launch_real(const StudyParams& sp) {
  const size_t smem = kSource == 1 ? 2 * sizeof(float) * kHalf : 0;  // the block's sin/cos table
  rope_ext::cuda::rope_lean_kernel<c10::BFloat16, false, 1, 8, kSource>
      <<<dim3(kH / 8, sp.S, 1), 128, smem, c10::cuda::getCurrentCUDAStream()>>>(real_params(sp));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// rope_ext's lean kernel's instance for calls without position tensors (kPlain), per-lane
// sin/cos (kSource 0) or the block's table (1), launched from here with lean_nopos's
// parameters (variants 24, 25).
template <int kSource>
void launch_real_plain(const StudyParams& sp) {
  const size_t smem = kSource == 1 ? 2 * sizeof(float) * kHalf : 0;
  rope_ext::cuda::rope_lean_kernel<c10::BFloat16, false, 1, 8, kSource, true>
      <<<dim3(kH / 8, sp.S, 1), 128, smem, c10::cuda::getCurrentCUDAStream()>>>(real_params(sp));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void launch_plain1(const StudyParams& sp) {
  rope_ext::cuda::rope_lean_plain1_kernel<c10::BFloat16, false, 8>
      <<<dim3(kH / 8, sp.S, 1), 128, 0, c10::cuda::getCurrentCUDAStream()>>>(real_params(sp));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <int kMode>
void launch_nopos(const StudyParams& sp) {
  lean_nopos_kernel<kMode><<<dim3(kH / 8, sp.S, 1), 128, 0, c10::cuda::getCurrentCUDAStream()>>>(real_params(sp));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void run(int64_t variant, torch::Tensor x, torch::Tensor out, torch::Tensor freq, torch::Tensor freq_host,
         torch::Tensor tcos, torch::Tensor tsin, torch::Tensor seq_start) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.is_contiguous() && x.dim() == 3 &&
              x.size(1) == kH && x.size(2) == kD, "x: contiguous bf16 [S, 32, 128]");
  TORCH_CHECK(out.sizes() == x.sizes() && out.is_contiguous() && out.scalar_type() == x.scalar_type(), "out");
  TORCH_CHECK(freq.numel() == kHalf && freq.scalar_type() == torch::kFloat32, "freq: fp32 [64]");
  TORCH_CHECK(!freq_host.is_cuda() && freq_host.numel() == kHalf && freq_host.scalar_type() == torch::kFloat32,
              "freq_host: fp32 [64] on the CPU (no copy back inside a graph capture)");
  TORCH_CHECK(tcos.is_contiguous() && tcos.size(0) >= x.size(0) && tcos.size(1) == kHalf, "tcos: [S, 64]");
  StudyParams p{};
  p.x = reinterpret_cast<const bf16*>(x.data_ptr());
  p.out = reinterpret_cast<bf16*>(out.data_ptr());
  p.freq_g = freq.data_ptr<float>();
  p.tcos = tcos.data_ptr<float>();
  p.tsin = tsin.data_ptr<float>();
  p.seq_start = seq_start.data_ptr<int>();
  p.S = static_cast<int>(x.size(0));
  const auto fh = freq_host.contiguous();
  for (int i = 0; i < kHalf; ++i) p.freq[i] = fh.data_ptr<float>()[i];
  switch (variant) {
    case 0: launch<0>(p); break;
    case 1: launch<1>(p); break;
    case 2: launch<2>(p); break;
    case 3: launch<3>(p); break;
    case 4: launch<4>(p); break;
    case 5: launch<5>(p); break;
    case 6: launch<6>(p); break;
    case 7: launch<7>(p); break;
    case 8: launch<8>(p); break;
    case 9: launch<9>(p); break;
    case 10: launch<10>(p); break;
    case 11: launch<11>(p); break;
    case 12: launch_real<1>(p); break;
    case 13: launch_real<0>(p); break;
    case 14: launch_lines<2>(p); break;
    case 15: launch_lines<4>(p); break;
    case 16: launch_nopos<0>(p); break;
    case 17: launch_smem<1>(p); break;
    case 18: launch_smem<4>(p); break;
    case 19: launch<19>(p); break;
    case 20: launch<20>(p); break;
    case 21: launch_nopos<1>(p); break;
    case 22: launch_nopos<2>(p); break;
    case 23: launch_nopos<3>(p); break;
    case 24: launch_real_plain<0>(p); break;
    case 25: launch_real_plain<1>(p); break;
    case 26: launch_plain1(p); break;
    default: TORCH_CHECK(false, "variant: 0..26");
  }
}
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
