// Definitions of variant 5's launchers (declared in decode_mma.h); included only by the
// per-(dtype, head dim) instance files in csrc/cuda/instances/.
#pragma once
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <atomic>

#include "decode_mma.cuh"
#include "launch_utils.h"

namespace rope_ext {

namespace mma_detail {
template <typename T, int D, bool kUpper, bool kFp8, bool kPair>
auto* kernel() { return &cuda::mma_decode::decode_mma_kernel<T, D, kUpper, kFp8, kPair>; }
// The instances with two kv heads per CTA (DecodeParams::kv_per_cta): fp8 caches at D = 64
// and 128 (ring rows of 128 and 256 bytes; at D = 256 one head's row is 256 bytes already).
template <int D, bool kFp8>
constexpr bool has_pair() { return kFp8 && (D == 64 || D == 128); }

// The kernel takes more than the default 48 KB of dynamic shared memory, and clusters of
// up to 16 CTAs (more than the portable 8) for the cluster merge: set both once per
// (instance, device).
template <typename T, int D, bool kUpper, bool kFp8, bool kPair>
void allow_smem(int device) {
  static std::atomic<uint64_t> done{0};
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D, kUpper, kFp8, kPair>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(cuda::mma_decode::smem_bytes<D, kFp8, kPair>())));
  if (cuda_launch::device_attribute<cudaDevAttrComputeCapabilityMajor>(device) >= 9)
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D, kUpper, kFp8, kPair>(),
                                        cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  if (bit) done.fetch_or(bit, std::memory_order_relaxed);
}

// The launch configuration; with p.cluster_merge, clusters of the num_splits CTAs of a
// row group (grid x is num_splits * row_groups, split-major: blockIdx.x % num_splits).
struct Config {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[1];
  Config(dim3 grid, cudaStream_t stream, size_t smem, int cluster) {
    cfg.gridDim = grid;
    cfg.blockDim = dim3(cuda::mma_decode::kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cluster;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cluster > 1 ? 1 : 0;
  }
};
}  // namespace mma_detail

// Calls f.template operator()<kUpper, kPair>() for the instance of (rows of a CTA's kv
// heads, kv heads per CTA); a pair where the instance has none is a host bug (decode_kv_per_cta).
template <int D, bool kFp8, typename F>
auto visit_instance(int64_t rows, int kv_per_cta, F&& f) {
  const bool upper = rows > 8;
  if constexpr (mma_detail::has_pair<D, kFp8>()) {
    if (kv_per_cta == 2)
      return upper ? f.template operator()<true, true>() : f.template operator()<false, true>();
  }
  TORCH_CHECK(kv_per_cta == 1, "rope_ext: internal: no decode instance with ", kv_per_cta, " kv heads per CTA");
  return upper ? f.template operator()<true, false>() : f.template operator()<false, false>();
}

template <typename T, int D, bool kFp8>
void launch_decode_mma(const DecodeParams& p, dim3 grid, cudaStream_t stream, int device) {
  visit_instance<D, kFp8>(p.G * p.kv_per_cta * p.q_len, p.kv_per_cta, [&]<bool kUpper, bool kPair>() {
    mma_detail::allow_smem<T, D, kUpper, kFp8, kPair>(device);
    constexpr size_t smem = cuda::mma_decode::smem_bytes<D, kFp8, kPair>();
    if (p.cluster_merge) {
      mma_detail::Config c(grid, stream, smem, p.num_splits);
      C10_CUDA_CHECK(cudaLaunchKernelEx(&c.cfg, mma_detail::kernel<T, D, kUpper, kFp8, kPair>(), p));
    } else {
      cuda::mma_decode::decode_mma_kernel<T, D, kUpper, kFp8, kPair>
          <<<grid, cuda::mma_decode::kThreads, smem, stream>>>(p);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <typename T, int D, bool kFp8>
int decode_mma_ctas_per_sm(int64_t rows, int kv_per_cta, int device) {
  return visit_instance<D, kFp8>(rows, kv_per_cta, [&]<bool kUpper, bool kPair>() {
    mma_detail::allow_smem<T, D, kUpper, kFp8, kPair>(device);
    return cuda_launch::resident_ctas(reinterpret_cast<const void*>(mma_detail::kernel<T, D, kUpper, kFp8, kPair>()),
                                      cuda::mma_decode::kThreads, cuda::mma_decode::smem_bytes<D, kFp8, kPair>(),
                                      device);
  });
}

template <typename T, int D, bool kFp8>
int decode_mma_max_clusters(int64_t rows, int kv_per_cta, int splits, int device) {
  if (splits < 2 || splits > cuda::kMaxClusterSplits || kv_per_cta < 1 || kv_per_cta > 2 ||
      cuda_launch::device_attribute<cudaDevAttrComputeCapabilityMajor>(device) < 9)
    return 0;
  // Asked once per (instance, device, size), cached as count + 1 (0: not asked yet).
  static std::atomic<int16_t> known[2][2][64][cuda::kMaxClusterSplits + 1] = {};
  auto ask = [&]() {
    return visit_instance<D, kFp8>(rows, kv_per_cta, [&]<bool kUpper, bool kPair>() {
      mma_detail::allow_smem<T, D, kUpper, kFp8, kPair>(device);
      mma_detail::Config c(dim3(splits, 1, 1), nullptr, cuda::mma_decode::smem_bytes<D, kFp8, kPair>(), splits);
      int n = 0;
      const cudaError_t err =
          cudaOccupancyMaxActiveClusters(&n, mma_detail::kernel<T, D, kUpper, kFp8, kPair>(), &c.cfg);
      if (err != cudaSuccess) {
        (void)cudaGetLastError();  // not an error of the caller's: take the combine kernel
        return 0;
      }
      return std::min(n, 32000);
    });
  };
  if (device < 0 || device >= 64) return ask();
  std::atomic<int16_t>& k = known[rows > 8][kv_per_cta - 1][device][splits];
  int v = k.load(std::memory_order_relaxed);
  if (!v) {
    v = ask() + 1;
    k.store(static_cast<int16_t>(v), std::memory_order_relaxed);
  }
  return v - 1;
}

}  // namespace rope_ext
