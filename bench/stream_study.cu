// Issue 19's W4 (80 MiB of bf16 q + k rotated in place, 59.2-59.7 us against a 59.0 goal):
// under ncu rope_ext's in-place stream moves DRAM at a copy kernel's rate (84-85% of peak,
// run 4 of the thirty-second session). Does any way of streaming the same bytes move DRAM
// faster on this machine? bench/stream_study.py builds this file with
// torch.utils.cpp_extension.load and times each variant as the latency suite does (one
// call in a CUDA graph, the L2 flushed before each replay, the columns in turns).
// No rotation here: only the memory traffic, out of place (src -> dst) and in place (a
// buffer read and written back).
//
// Variants (what each asks):
//   ldst U      LD/ST: a 128-thread block, each thread U 16-byte loads in flight, then its
//               stores (U = 1, 2, 4; torch's element-wise kernels and rope_ext's lean
//               kernel stream this way). A run-time key is XORed into the first 4 bytes
//               of each 16 (0 when timed), so the in-place store is not a store of an
//               unchanged load and the check can see an in-place pass (key ~0).
//   bulk C S    the bulk copy engine (cp.async.bulk, sm_90): a persistent grid of
//               one-warp blocks, one thread each issuing C-byte bulk loads into S
//               shared-memory stages (completing on an mbarrier each) and, as each lands,
//               its bulk store from the same stage; a stage is loaded again only after
//               its store has read it (cp.async.bulk.wait_group.read). No thread touches
//               the bytes: the engine's rate with no issue cost at all.
// Measured (H100, run 1 of the thirty-third session, docs/h100_stream_study_s33.txt; 80 MiB,
// two passes, us, out of place / in place): ldst 1 60.26-60.29 / 59.63-59.90, ldst 2
// 60.42-60.43 / 60.11-60.19, ldst 4 60.45-60.51 / 60.70-60.80; bulk 16 KB x 4 stages
// 60.00-60.02 / 59.87-59.94, 32 KB x 3 61.39-61.54 / 61.47-61.49, 8 KB x 8 60.16-60.45 /
// 60.35-60.75; torch copy_ 60.00-60.22; rope_ext W4 in place 59.07-59.33. The bulk engine
// is no faster than LD/ST here (its issue cost was not the limit) and nothing streams these
// bytes faster than W4 in place. (The outputs are checked before and after timing; a
// barrier that never completes hangs: run it under `timeout`.)
#include <algorithm>
#include <cstdint>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "cuda/primitives.cuh"

namespace {

template <int U>
__global__ void __launch_bounds__(128) ldst_kernel(const uint4* src, uint4* dst, int64_t n16, uint32_t key) {
  const int64_t i0 = int64_t(blockIdx.x) * (128 * U) + threadIdx.x;
  uint4 v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = i0 + u * 128;
    if (i < n16) v[u] = src[i];
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = i0 + u * 128;
    if (i < n16) {
      v[u].x ^= key;
      dst[i] = v[u];
    }
  }
}

// One thread of each block streams chunks blockIdx.x, blockIdx.x + gridDim.x, ... of
// `chunk` bytes through `stages` shared-memory stages (dynamic shared memory, 128-byte
// aligned; the mbarriers behind them), with the project's bulk-copy primitives
// (csrc/cuda/primitives.cuh, append_kv's bulk variant's).
__global__ void __launch_bounds__(32) bulk_kernel(const uint8_t* src, uint8_t* dst, int64_t nchunks, uint32_t chunk,
                                                  int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (the primitives' guard; the study needs sm_90)
  using namespace rope_ext::cuda;
  extern __shared__ __align__(128) uint8_t smem[];
  if (threadIdx.x != 0) return;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + int64_t(stages) * chunk);
  for (int s = 0; s < stages; ++s) mbar_init(bar + s, 1);
  fence_proxy_async_smem();
  const auto load = [&](int s, int64_t c) {
    mbar_arrive_expect(bar + s, chunk);
    bulk_load(smem + int64_t(s) * chunk, src + c * chunk, chunk, bar + s);
  };
  for (int s = 0; s < stages; ++s) {
    const int64_t c = blockIdx.x + int64_t(s) * gridDim.x;
    if (c < nchunks) load(s, c);
  }
  int s = 0;            // this chunk's stage
  uint32_t parity = 0;  // its use of that stage, mod 2 (the mbarrier phase it waits for)
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    mbar_wait(bar + s, parity);
    bulk_store(dst + c * chunk, smem + int64_t(s) * chunk, chunk);
    bulk_store_drain();  // committed, and read out of the stage before it is loaded again
    const int64_t next = c + int64_t(stages) * gridDim.x;
    if (next < nchunks) load(s, next);
    if (++s == stages) {
      s = 0;
      parity ^= 1;
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");  // the stores' writes done
#endif
}

void check_buffers(const torch::Tensor& src, const torch::Tensor& dst) {
  TORCH_CHECK(src.is_cuda() && dst.is_cuda() && src.is_contiguous() && dst.is_contiguous(),
              "stream_study: src and dst must be contiguous CUDA tensors");
  TORCH_CHECK(src.nbytes() == dst.nbytes(), "stream_study: src and dst must have the same size");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(src.data_ptr()) % 128 == 0 &&
                  reinterpret_cast<uintptr_t>(dst.data_ptr()) % 128 == 0,
              "stream_study: src and dst must be 128-byte aligned");
}

void ldst(const torch::Tensor& src, torch::Tensor& dst, int64_t u, int64_t key) {
  check_buffers(src, dst);
  TORCH_CHECK(src.nbytes() % 16 == 0, "stream_study: ldst takes a multiple of 16 bytes");
  const c10::cuda::CUDAGuard guard(src.device());
  const int64_t n16 = static_cast<int64_t>(src.nbytes() / 16);
  const auto* s = static_cast<const uint4*>(src.data_ptr());
  auto* d = static_cast<uint4*>(dst.data_ptr());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto blocks = [&](int per) { return static_cast<unsigned>((n16 + 128 * per - 1) / (128 * per)); };
  const auto k = static_cast<uint32_t>(key);
  if (u == 1) ldst_kernel<1><<<blocks(1), 128, 0, stream>>>(s, d, n16, k);
  else if (u == 2) ldst_kernel<2><<<blocks(2), 128, 0, stream>>>(s, d, n16, k);
  else if (u == 4) ldst_kernel<4><<<blocks(4), 128, 0, stream>>>(s, d, n16, k);
  else TORCH_CHECK(false, "stream_study: ldst's u is 1, 2 or 4, got ", u);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// blocks_per_sm: blocks a SM (the grid is that many times the SM count, fewer if the
// shared memory does not allow it: checked here).
void bulk(const torch::Tensor& src, torch::Tensor& dst, int64_t chunk, int64_t stages, int64_t blocks_per_sm) {
  check_buffers(src, dst);
  // (an mbarrier's transaction count holds at most 2^20 - 1 bytes)
  TORCH_CHECK(chunk >= 16 && chunk % 16 == 0 && chunk < (int64_t(1) << 20), "stream_study: chunk bytes ", chunk);
  TORCH_CHECK(stages >= 1 && stages <= 8, "stream_study: stages 1-8, got ", stages);
  TORCH_CHECK(blocks_per_sm >= 1, "stream_study: blocks a SM >= 1, got ", blocks_per_sm);
  TORCH_CHECK(static_cast<int64_t>(src.nbytes()) % chunk == 0, "stream_study: bulk takes a multiple of chunk bytes");
  const c10::cuda::CUDAGuard guard(src.device());
  const size_t smem = static_cast<size_t>(chunk * stages) + 8 * static_cast<size_t>(stages);
  static cudaDeviceProp props{};  // (read once: the study runs on one device)
  static int props_of = -1;
  if (props_of != src.get_device()) {
    C10_CUDA_CHECK(cudaGetDeviceProperties(&props, src.get_device()));
    props_of = src.get_device();
  }
  const cudaDeviceProp* prop = &props;
  TORCH_CHECK((smem + prop->reservedSharedMemPerBlock) * blocks_per_sm <= prop->sharedMemPerMultiprocessor &&
                  smem <= prop->sharedMemPerBlockOptin,
              "stream_study: ", blocks_per_sm, " blocks of ", smem, " bytes of shared memory do not fit a SM");
  static size_t smem_set = 0;  // (raised once, outside a graph capture: the first, eager call)
  if (smem > smem_set) {
    C10_CUDA_CHECK(
        cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    C10_CUDA_CHECK(cudaFuncSetAttribute(bulk_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
    smem_set = smem;
  }
  int resident = 0;  // (the persistent grid's blocks a SM, as the occupancy calculator sees them)
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, bulk_kernel, 32, smem));
  TORCH_CHECK(resident >= blocks_per_sm, "stream_study: ", blocks_per_sm, " blocks a SM asked, ", resident,
              " resident");
  const int64_t nchunks = static_cast<int64_t>(src.nbytes()) / chunk;
  const int64_t grid = std::min<int64_t>(nchunks, prop->multiProcessorCount * blocks_per_sm);
  bulk_kernel<<<static_cast<unsigned>(grid), 32, smem, c10::cuda::getCurrentCUDAStream()>>>(
      static_cast<const uint8_t*>(src.data_ptr()), static_cast<uint8_t*>(dst.data_ptr()), nchunks,
      static_cast<uint32_t>(chunk), static_cast<int>(stages));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("ldst", &ldst, "dst = src (the first 4 bytes of each 16 XOR key) by 16-byte loads and stores, u in flight "
        "a thread (dst may be src)", pybind11::arg("src"), pybind11::arg("dst"), pybind11::arg("u"),
        pybind11::arg("key") = 0);
  m.def("bulk", &bulk, "dst = src by the bulk copy engine: chunk bytes, stages, blocks a SM (dst may be src)");
}
