// Host helpers shared by the CUDA dispatch files (rope, norm + rope, attention).
#pragma once
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <utility>

namespace rope_ext {
namespace cuda_launch {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A device attribute, asked once per device (the query is not free on every launch).
template <cudaDeviceAttr kAttr>
inline int device_attribute(int device) {
  static std::atomic<int> cached[64] = {};
  if (device >= 0 && device < 64) {
    const int c = cached[device].load(std::memory_order_relaxed);
    if (c) return c;
  }
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, kAttr, device));
  if (device >= 0 && device < 64) cached[device].store(n, std::memory_order_relaxed);
  return n;
}

inline int sm_count(int device) { return device_attribute<cudaDevAttrMultiProcessorCount>(device); }

// Lets `kernel` take up to the device's per-block opt-in maximum of dynamic shared
// memory, once per (kernel, device): the attribute set on every launch cost host time,
// and two threads setting different sizes could fail each other's launch. The caller
// holds a device guard for `device` (the attribute applies to the current device).
inline void allow_max_dynamic_smem(const void* kernel, int device) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> done;
  const std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, device})) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device)));
  done.insert({kernel, device});
}

// Blocks of `kernel` resident per SM of `device` at this block size and shared memory.
// The runtime's answer is cached per (kernel, device, block size, shared memory): it is
// asked on every launch otherwise, and two different GPUs in one process can differ.
// The caller holds a device guard for `device` (the query reads the current device).
inline int resident_ctas(const void* kernel, int threads, size_t smem, int device) {
  struct Entry { const void* k; int device; int threads; size_t smem; int n; };
  static thread_local Entry cache[64] = {};
  static thread_local int next = 0;
  for (const Entry& e : cache)
    if (e.k == kernel && e.device == device && e.threads == threads && e.smem == smem) return e.n;
  int n = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem));
  n = n > 0 ? n : 1;
  cache[next++ % 64] = Entry{kernel, device, threads, smem, n};
  return n;
}

}  // namespace cuda_launch
}  // namespace rope_ext
