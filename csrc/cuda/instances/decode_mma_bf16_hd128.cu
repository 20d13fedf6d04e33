// Variant 5 (decode_mma.cuh) for c10::BFloat16 queries over c10::BFloat16 caches, head dim 128: one instance per
// file, compiled in parallel.
#include "../decode_mma_launch.cuh"

namespace rope_ext {
template void launch_decode_mma<c10::BFloat16, 128, false>(const DecodeParams&, dim3, cudaStream_t, int);
template int decode_mma_ctas_per_sm<c10::BFloat16, 128, false>(int64_t, int, int);
template int decode_mma_max_clusters<c10::BFloat16, 128, false>(int64_t, int, int, int);
}  // namespace rope_ext
