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

// Shared memory: ms, ls [kParts][kRows] (running max in log2 units, sum), os
// [kParts][kRows][D] (un-normalised P.V). Rows >= nrows are not read. part_o / part_lse
// (cluster merge only): this CTA's merged rows [kRows][D] (normalised) and [kRows]
// (log2-sum-exp), in shared memory apart from the three above.
template <typename T, int kParts, int kRows>
__device__ __forceinline__ void merge_and_write_rows(const DecodeParams& p, const float* ms, const float* ls,
                                                     const float* os, int D, int nrows, int row0, int hk, int64_t b,
                                                     int split, int tid, int nthreads, float* part_o = nullptr,
                                                     float* part_lse = nullptr) {
  constexpr float kLn2 = 0.6931471805599453f;
  const float ninf = -INFINITY;
  const int G = static_cast<int>(p.G);
  for (int e = tid; e < nrows * D; e += nthreads) {
    const int rr = e / D, d = e - rr * D;
    float M = ninf;
#pragma unroll
    for (int w = 0; w < kParts; ++w) M = fmaxf(M, ms[w * kRows + rr]);
    float acc = 0.f, lsum = 0.f;
    if (M != ninf) {
#pragma unroll
      for (int w = 0; w < kParts; ++w) {
        const float wt = exp2f(ms[w * kRows + rr] - M);
        lsum = fmaf(ls[w * kRows + rr], wt, lsum);
        acc = fmaf(os[(w * kRows + rr) * D + d], wt, acc);
      }
      acc /= lsum;
    }
    const int row = row0 + rr, j = row / G, hq = hk * G + (row - j * G);
    const float lse2 = M == ninf ? ninf : M + log2f(lsum);
    if (part_o) {
      part_o[rr * D + d] = acc;
      if (d == 0) part_lse[rr] = lse2;
    } else if (p.num_splits == 1) {
      static_cast<T*>(p.o)[((b * p.q_len + j) * p.Hq + hq) * D + d] = static_cast<T>(acc);
      if (d == 0) p.lse[(b * p.q_len + j) * p.Hq + hq] = lse2 * kLn2;
    } else {
      const int64_t w = ((b * p.Hq + hq) * p.q_len + j) * p.num_splits + split;
      p.ws_o[w * D + d] = acc;
      if (d == 0) p.ws_lse[w] = lse2;
    }
  }
}

// The split merge without a second kernel (sm_90+): the p.num_splits CTAs of one row
// group are a thread-block cluster (the launcher sets its size), and each has written its
// merged rows into part_o / part_lse (merge_and_write_rows above). After a cluster
// barrier, CTA c of the cluster finishes elements c * nthreads + tid, + num_splits *
// nthreads, ... of the rows: it reads every split's part through distributed shared memory
// and merges them as the combine kernel does (weights exp2(lse_s - max); no key in any
// split: O = 0, lse = -inf). A second barrier keeps every CTA's shared memory alive until
// its peers have read it. Why: at B = 1 the combine kernel was a second launch with its
// own cold start after the L2 flush, on the critical path of a ~14 us call.
template <typename T>
__device__ __forceinline__ void cluster_merge_and_write(const DecodeParams& p, float* part_o, float* part_lse, int D,
                                                        int nrows, int row0, int hk, int64_t b, int tid, int nthreads) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  constexpr float kLn2 = 0.6931471805599453f;
  const float ninf = -INFINITY;
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();
  const int ns = p.num_splits, G = static_cast<int>(p.G);
  const int me = static_cast<int>(cl.block_rank());
  for (int e = me * nthreads + tid; e < nrows * D; e += ns * nthreads) {
    const int rr = e / D, d = e - rr * D;
    float lse[kMaxClusterSplits], ov[kMaxClusterSplits];
    float M = ninf;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      if (s < ns) {
        lse[s] = *cl.map_shared_rank(part_lse + rr, s);
        ov[s] = *cl.map_shared_rank(part_o + e, s);
        M = fmaxf(M, lse[s]);
      }
    }
    float acc = 0.f, lsum = 0.f;
    if (M != ninf) {
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        if (s < ns) {
          const float w = exp2f(lse[s] - M);
          lsum += w;
          acc = fmaf(w, ov[s], acc);
        }
      }
      acc *= 1.f / lsum;
    }
    const int row = row0 + rr, j = row / G, hq = hk * G + (row - j * G);
    const int64_t orow = (b * p.q_len + j) * p.Hq + hq;
    static_cast<T*>(p.o)[orow * D + d] = static_cast<T>(acc);
    if (d == 0) p.lse[orow] = M == ninf ? ninf : (M + log2f(lsum)) * kLn2;
  }
  cl.sync();
#else
  __trap();  // the host sets cluster_merge on sm_90+ only
#endif
}

}  // namespace cuda
}  // namespace rope_ext
