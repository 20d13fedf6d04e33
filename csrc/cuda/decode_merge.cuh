// The end of both decode kernels (variants 2 and 5): merge the online-softmax states
// that the CTA's parts (key slots or warps) keep for its query rows, then write the
// output (one split) or this split's partial O and log2-sum-exp for the combine.
#pragma once
#include <cuda_runtime.h>

#include <cmath>

#include "../attention_params.h"

namespace rope_ext {
namespace cuda {

// Shared memory: ms, ls [kParts][kRows] (running max in log2 units, sum), os
// [kParts][kRows][D] (un-normalised P.V). Rows >= nrows are not read.
template <typename T, int kParts, int kRows>
__device__ __forceinline__ void merge_and_write_rows(const DecodeParams& p, const float* ms, const float* ls,
                                                     const float* os, int D, int nrows, int row0, int hk, int64_t b,
                                                     int split, int tid, int nthreads) {
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
    if (p.num_splits == 1) {
      static_cast<T*>(p.o)[((b * p.q_len + j) * p.Hq + hq) * D + d] = static_cast<T>(acc);
      if (d == 0) p.lse[(b * p.q_len + j) * p.Hq + hq] = lse2 * kLn2;
    } else {
      const int64_t w = ((b * p.Hq + hq) * p.q_len + j) * p.num_splits + split;
      p.ws_o[w * D + d] = acc;
      if (d == 0) p.ws_lse[w] = lse2;
    }
  }
}

}  // namespace cuda
}  // namespace rope_ext
