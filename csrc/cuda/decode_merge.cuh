// The end of both decode kernels (variants 2 and 5): merge the online-softmax states
// that the CTA's parts (key slots or warps) keep for its query rows, then write the
// output (one split), this split's partial O and log2-sum-exp for the combine kernel,
// or (variant 5, p.cluster_merge) the partials into shared memory, where the cluster of
// the row group's splits merges them (cluster_merge_and_write).
#pragma once
#include <cuda_runtime.h>
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#include <cooperative_groups.h>
#endif

#include <cmath>

#include "../attention_params.h"

namespace rope_ext {
namespace cuda {

// The most splits merged in one cluster (the H100's non-portable cluster limit; 8 is
// the portable one). More splits take the combine kernel.
constexpr int kMaxClusterSplits = 16;

// Four consecutive features of an output row, rounded to T (8 bytes for 16-bit T).
template <typename T>
__device__ __forceinline__ void store4(T* dst, float4 v) {
  dst[0] = static_cast<T>(v.x);
  dst[1] = static_cast<T>(v.y);
  dst[2] = static_cast<T>(v.z);
  dst[3] = static_cast<T>(v.w);
}

__device__ __forceinline__ void scale4(float4& a, float w) {
  a.x *= w;
  a.y *= w;
  a.z *= w;
  a.w *= w;
}

__device__ __forceinline__ void fma4(float4& a, float w, const float4& v) {
  a.x = fmaf(w, v.x, a.x);
  a.y = fmaf(w, v.y, a.y);
  a.z = fmaf(w, v.z, a.z);
  a.w = fmaf(w, v.w, a.w);
}

// Shared memory: ms, ls [kParts][kRows] (running max in log2 units, sum), os
// [kParts][kRows][D] (un-normalised P.V). Rows >= nrows are not read. First one thread
// per row turns ms into the parts' normalised weights exp2(m_w - M) / l and ls[row] (of
// part 0) into the row's log2-sum-exp (in place: a row's thread reads and writes its own
// row only); after a barrier every thread merges groups of 4 features with those
// weights. (The first version computed the weights, a division and a log2 for every
// feature: ncu counted ~450 of a B = 1 ctx 512 warp's ~2,000 instructions here.)
// part_o / part_lse (cluster merge only): this CTA's merged rows [kRows][D] (normalised)
// and [kRows] (log2-sum-exp), in shared memory apart from the three above.
template <typename T, int kParts, int kRows>
__device__ __forceinline__ void merge_and_write_rows(const DecodeParams& p, float* ms, float* ls, const float* os,
                                                     int D, int nrows, int row0, int hk, int64_t b, int split,
                                                     int tid, int nthreads, float* part_o = nullptr,
                                                     float* part_lse = nullptr) {
  constexpr float kLn2 = 0.6931471805599453f;
  const float ninf = -INFINITY;
  const int G = static_cast<int>(p.G * p.kv_per_cta);  // query heads per CTA (hk: the CTA's index)
  if (tid < nrows) {
    const int rr = tid;
    float M = ninf;
#pragma unroll
    for (int w = 0; w < kParts; ++w) M = fmaxf(M, ms[w * kRows + rr]);
    // Empty, unless NaN scores left a part's sum NaN (fmaxf dropped them from its max): then
    // the row is NaN (NaN weights and lse), not empty. Checked in this rare branch only: a
    // flag over every part cost B = 1 ctx 512 ~0.9 us (run 4 of the night of 2026-11-25).
    if (M == ninf) {
#pragma unroll
      for (int w = 0; w < kParts; ++w)
        if (isnan(ls[w * kRows + rr])) M = __int_as_float(0x7fffffff);
    }
    float wt[kParts], lsum = 0.f;
#pragma unroll
    for (int w = 0; w < kParts; ++w) {
      wt[w] = M == ninf ? 0.f : exp2f(ms[w * kRows + rr] - M);
      lsum = fmaf(ls[w * kRows + rr], wt[w], lsum);
    }
    const float inv = M == ninf ? 0.f : 1.f / lsum;
#pragma unroll
    for (int w = 0; w < kParts; ++w) ms[w * kRows + rr] = wt[w] * inv;
    ls[rr] = M == ninf ? ninf : M + log2f(lsum);
  }
  __syncthreads();
  const int D4 = D / 4;
  for (int g = tid; g < nrows * D4; g += nthreads) {
    const int rr = g / D4, d = (g - rr * D4) * 4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kParts; ++w)
      fma4(acc, ms[w * kRows + rr], *reinterpret_cast<const float4*>(os + (w * kRows + rr) * D + d));
    const float lse2 = ls[rr];
    if (part_o) {
      *reinterpret_cast<float4*>(part_o + rr * D + d) = acc;
      if (d == 0) part_lse[rr] = lse2;
      continue;
    }
    const int row = row0 + rr, j = p.q_len == 1 ? 0 : row / G, hq = hk * G + (row - j * G);
    if (p.num_splits == 1) {
      store4(static_cast<T*>(p.o) + ((b * p.q_len + j) * p.Hq + hq) * D + d, acc);
      if (d == 0) p.lse[(b * p.q_len + j) * p.Hq + hq] = lse2 * kLn2;
    } else {
      const int64_t w = ((b * p.Hq + hq) * p.q_len + j) * p.num_splits + split;
      *reinterpret_cast<float4*>(p.ws_o + w * D + d) = acc;
      if (d == 0) p.ws_lse[w] = lse2;
    }
  }
}

// The split merge without a second kernel (sm_90+): the p.num_splits CTAs of one row
// group are a thread-block cluster (the launcher sets its size), and each has written its
// merged rows into part_o / part_lse (merge_and_write_rows above). After a cluster
// barrier, the groups of 4 features of the rows are dealt round-robin to the cluster's
// CTAs; a thread reads every split's part of its group through distributed shared memory
// (all loads independent: one DSMEM round trip) and merges them as the combine kernel
// does (weights exp2(lse_s - max); no key in any split: O = 0, lse = -inf). A second
// barrier keeps every CTA's shared memory alive until its peers have read it: arrive
// .relaxed, as the peers' reads are consumed by their output stores before they arrive
// (the default release arrive compiled to a MEMBAR.ALL.GPU that waited for those stores:
// ncu put ~15% of a B = 1 ctx 512 call's stall samples there). Why a cluster: at B = 1
// the combine kernel was a second launch with its own cold start after the L2 flush, on
// the critical path of a ~14 us call.
template <typename T>
__device__ __forceinline__ void cluster_merge_and_write(const DecodeParams& p, float* part_o, float* part_lse, int D,
                                                        int nrows, int row0, int hk, int64_t b, int tid, int nthreads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr float kLn2 = 0.6931471805599453f;
  const float ninf = -INFINITY;
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();
  const int ns = p.num_splits, G = static_cast<int>(p.G * p.kv_per_cta);
  const int me = static_cast<int>(cl.block_rank());
  const int D4 = D / 4;
  for (int g = me + ns * tid; g < nrows * D4; g += ns * nthreads) {
    const int rr = g / D4, d = (g - rr * D4) * 4;
    float lse[kMaxClusterSplits];
    float4 ov[kMaxClusterSplits];
    float M = ninf;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < ns) {
        lse[s] = *cl.map_shared_rank(part_lse + rr, s);
        ov[s] = *reinterpret_cast<const float4*>(cl.map_shared_rank(part_o + rr * D + d, s));
        M = fmaxf(M, lse[s]);
      }
    }
    if (M == ninf) {  // rare: every split empty, or a NaN split (fmaxf dropped it): then the row is NaN
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s)
        if (s < ns && isnan(lse[s])) M = __int_as_float(0x7fffffff);
    }
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float lsum = 0.f;
    if (M != ninf) {
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < ns) {
          const float w = exp2f(lse[s] - M);
          lsum += w;
          fma4(acc, w, ov[s]);
        }
      }
      scale4(acc, 1.f / lsum);
    }
    const int row = row0 + rr, j = p.q_len == 1 ? 0 : row / G, hq = hk * G + (row - j * G);
    const int64_t orow = (b * p.q_len + j) * p.Hq + hq;
    store4(static_cast<T*>(p.o) + orow * D + d, acc);
    if (d == 0) p.lse[orow] = M == ninf ? ninf : (M + log2f(lsum)) * kLn2;
  }
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
#else
  __trap();  // the host sets cluster_merge on sm_90+ only
#endif
}

}  // namespace cuda
}  // namespace rope_ext
