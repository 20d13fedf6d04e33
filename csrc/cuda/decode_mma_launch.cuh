// Definitions of variant 5's launchers (declared in decode_mma.h); included only by the
// per-(dtype, head dim) instance files in csrc/cuda/instances/.
#pragma once
#include <c10/cuda/CUDAException.h>

#include "decode_mma.cuh"
#include "launch_utils.h"

namespace rope_ext {

namespace mma_detail {
template <typename T, int D, bool kUpper, bool kFp8>
auto* kernel() { return &cuda::mma_decode::decode_mma_kernel<T, D, kUpper, kFp8>; }

// The kernel takes more than the default 48 KB of dynamic shared memory: raise its limit
// once per (instance, device).
template <typename T, int D, bool kUpper, bool kFp8>
void allow_smem(int device) {
  static std::atomic<uint64_t> done{0};
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
  if (bit && (done.load(std::memory_order_relaxed) & bit)) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel<T, D, kUpper, kFp8>(), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(cuda::mma_decode::smem_bytes<D, kFp8>())));
  if (bit) done.fetch_or(bit, std::memory_order_relaxed);
}
}  // namespace mma_detail

template <typename T, int D, bool kFp8>
void launch_decode_mma(const DecodeParams& p, dim3 grid, cudaStream_t stream, int device) {
  auto go = [&]<bool kUpper>() {
    mma_detail::allow_smem<T, D, kUpper, kFp8>(device);
    cuda::mma_decode::decode_mma_kernel<T, D, kUpper, kFp8>
        <<<grid, cuda::mma_decode::kThreads, cuda::mma_decode::smem_bytes<D, kFp8>(), stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  p.G * p.q_len > 8 ? go.template operator()<true>() : go.template operator()<false>();
}

template <typename T, int D, bool kFp8>
int decode_mma_ctas_per_sm(int64_t rows, int device) {
  auto occ = [&]<bool kUpper>() {
    mma_detail::allow_smem<T, D, kUpper, kFp8>(device);
    return cuda_launch::resident_ctas(reinterpret_cast<const void*>(mma_detail::kernel<T, D, kUpper, kFp8>()),
                                      cuda::mma_decode::kThreads, cuda::mma_decode::smem_bytes<D, kFp8>(), device);
  };
  return rows > 8 ? occ.template operator()<true>() : occ.template operator()<false>();
}

}  // namespace rope_ext
