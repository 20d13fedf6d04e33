// Host helpers shared by the CUDA dispatch files (rope, norm + rope, attention).
#pragma once
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace rope_ext {
namespace cuda_launch {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// SMs of a device, asked once (the attribute query is not free on every launch).
inline int sm_count(int device) {
  static std::atomic<int> cached[64] = {};
  if (device >= 0 && device < 64) {
    const int c = cached[device].load(std::memory_order_relaxed);
    if (c) return c;
  }
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (device >= 0 && device < 64) cached[device].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace cuda_launch
}  // namespace rope_ext
