// Variant 5 of attention_decode (tensor cores; the kernel is decode_mma.cuh): its shape
// constants and the launchers the dispatch (attention_dispatch.cu) calls. The launchers
// are instantiated once per (dtype, cache dtype, head dim) in csrc/cuda/instances/ so that the
// instances compile in parallel.
#pragma once
#include <cuda_runtime.h>

#include "../attention_params.h"

namespace rope_ext {
namespace cuda {
namespace mma_decode {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileKeys = 16;  // keys per warp tile: one k-step of the P.V MMA
constexpr int kRows = 16;      // query rows per CTA: the MMA's M

}  // namespace mma_decode
}  // namespace cuda

// rows: query rows of a CTA's kv heads (G * kv_per_cta * q_len; a CTA takes at most 16
// of them, one row group), which picks the instance with or without the MMA's upper 8 rows; kv_per_cta (1, or 2 where the instance has pairs: fp8
// caches at D = 64 and 128) the one with one or two kv heads per CTA. kFp8: the caches are
// float8_e4m3fn (q and o stay T).
template <typename T, int D, bool kFp8>
void launch_decode_mma(const DecodeParams& p, dim3 grid, cudaStream_t stream, int device);
template <typename T, int D, bool kFp8>
int decode_mma_ctas_per_sm(int64_t rows, int kv_per_cta, int device);
// How many thread-block clusters of `splits` CTAs (DecodeParams::cluster_merge) can be
// resident on the device at once (cudaOccupancyMaxActiveClusters: a cluster must fit in
// one GPC); 0 where none can: before sm_90, outside 2..kMaxClusterSplits, or too large.
template <typename T, int D, bool kFp8>
int decode_mma_max_clusters(int64_t rows, int kv_per_cta, int splits, int device);

}  // namespace rope_ext
