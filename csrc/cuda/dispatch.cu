// CUDA dispatch: picks a variant from csrc/cuda/variants.cuh, sizes the grid and
// launches on the current stream of x's device.
// (No ATen/cuda/CUDAContext.h: it pulls in cuSPARSE/cuBLAS headers that a bare CUDA
// toolkit may lack; the stream and the SM count come from c10 and the runtime.)
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>

#include "../dispatch.h"
#include "variants.cuh"

namespace rope_ext {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

int sm_count(int device) {
  static int cached[64] = {0};
  if (device < 64 && cached[device]) return cached[device];
  int n = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
  if (device < 64) cached[device] = n;
  return n;
}

// Flat grid for the element/pair variants: enough blocks for several waves, the rest
// by grid-stride (keeps gridDim.x in range for tensors of any size).
dim3 flat_grid(int64_t work, int threads, int device) {
  return dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div(work, threads), sm_count(device) * 64L)));
}

template <typename T>
void launch(const RopeParams& p, Impl impl, int device, cudaStream_t stream) {
  const size_t smem = sizeof(float) * std::max(1, p.R / 2);
  const int64_t tokens_rows = p.B * p.S * heads_total(p);
  if (tokens_rows == 0) return;
  if (impl == Impl::kNaive) {
    constexpr int kThreads = 256;
    cuda::rope_naive_kernel<T><<<flat_grid(tokens_rows * p.D, kThreads, device), kThreads, 0, stream>>>(p);
  } else if (impl == Impl::kFp32) {
    constexpr int kThreads = 256;
    const int64_t items = p.R / 2 + (p.copy_tail ? p.D - p.R : 0);
    cuda::rope_fp32_kernel<T><<<flat_grid(tokens_rows * items, kThreads, device), kThreads, smem, stream>>>(p);
  } else {
    constexpr int V = 16 / sizeof(T);
    const int rot_chunks = p.interleaved ? p.R / V : p.R / 2 / V;
    const int chunks = rot_chunks + (p.copy_tail ? (p.D - p.R) / V : 0);
    const int64_t rows = rows_per_group(p), groups = num_groups(p);
    // x: the chunks of a row; y: rows, about kRowsInFlight per thread, 256 threads.
    const int bx = std::min(chunks, 256);
    const int by = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>(ceil_div(rows, cuda::kRowsInFlight), 256 / bx)));
    // Few tokens (decode): split each group's rows over more blocks to fill the SMs.
    const int64_t want_blocks = 2L * sm_count(device) * std::max(1, 2048 / (bx * by));
    int64_t gy = 1;
    if (groups < want_blocks)
      gy = std::min<int64_t>({ceil_div(want_blocks, groups), ceil_div(rows, by), 65535});
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(groups, 2147483647L)),
                    static_cast<unsigned>(gy));
    if (p.interleaved)
      cuda::rope_fp32x4_kernel<T, true><<<grid, dim3(bx, by), smem, stream>>>(p);
    else
      cuda::rope_fp32x4_kernel<T, false><<<grid, dim3(bx, by), smem, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void run_cuda(const RopeParams& p, Impl impl, at::ScalarType dtype, c10::Device device) {
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_ext_cuda", [&] {
    Impl chosen = impl;
    if (impl == Impl::kAuto)
      chosen = vector_eligible(p, sizeof(scalar_t), nullptr) ? Impl::kFp32x4 : Impl::kFp32;
    launch<scalar_t>(p, chosen, device.index(), stream);
  });
}

}  // namespace rope_ext
