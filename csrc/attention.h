// The backend entry points of the attention family (append_kv, attention_decode); the
// op layer (attention_ops.cpp) validates, fills the params and calls these.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "attention_options.h"
#include "attention_params.h"

namespace rope_ext {

// attention_decode variants, named for the API: "hybrid" = variant 5 (tensor cores,
// csrc/cuda/decode_mma.cuh), "hybrid_simt" = variant 2 and "full_fusion" = variant 3
// (csrc/cuda/attention_variants.cuh). "auto" picks hybrid (the measured reasons are
// in those headers). The CPU path is one reference for all but full_fusion's cache rule.
enum class DecodeImpl : int { kHybrid = 0, kHybridSimt = 1, kFullFusion = 2, kAuto = 3 };
inline const std::vector<std::string>& decode_impl_names() {
  static const std::vector<std::string> names = {"hybrid", "hybrid_simt", "full_fusion"};
  return names;
}

// The split plan of this thread's last CUDA attention_decode (attention_ops.cpp): tests
// check which merge a case took (rope_ext._C.last_decode_plan()).
struct DecodePlan {
  int num_splits = 0;
  bool cluster_merge = false;
  int kv_per_cta = 1;  // variant 5's kv heads per CTA (DecodeParams::kv_per_cta)
  int combine_loads = 0, combine_warps = 0;  // the combine kernel's shape (0: no combine)
  int split_chunk = 0;  // DecodeParams::split_chunk
};
DecodePlan& last_decode_plan();

// The eager entries without the dispatcher (attention_ops.cpp; pybind11: rope_ext._C),
// the ops' parameters in their schemas' order.
void append_kv_direct(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const at::Tensor& cache_seqlens, const std::optional<at::Tensor>& cu_seqlens ATTN_INDEX_PARAMS,
                      const std::optional<at::Tensor>& q ATTN_ROTARY_PARAMS, bool rotate_k ATTN_SCALE_PARAMS);
std::tuple<at::Tensor, at::Tensor> attention_decode_direct(const at::Tensor& q, const at::Tensor& k_cache,
                                                           const at::Tensor& v_cache, const at::Tensor& cache_seqlens
                                                               ATTN_INDEX_PARAMS ATTN_ROTARY_PARAMS ATTN_DECODE_PARAMS
                                                                   ATTN_SCALE_PARAMS);
std::tuple<at::Tensor, at::Tensor> attention_decode_append_direct(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
    const at::Tensor& v_cache, const at::Tensor& cache_seqlens ATTN_INDEX_PARAMS ATTN_ROTARY_PARAMS
        ATTN_DECODE_PARAMS ATTN_SCALE_PARAMS);

void append_kv_cpu(const AppendParams& p, at::ScalarType dtype);
void attention_decode_cpu(const DecodeParams& p, at::ScalarType dtype, bool full_fusion);

#ifdef ROPE_EXT_WITH_CUDA
void append_kv_cuda(const AppendParams& p, at::ScalarType dtype, c10::Device device);
// Host-side choices (from shapes only: CUDA-graph safe): query rows per CTA, and the
// split plan for `max_keys` keys per sequence (capacity or the max_seqlen hint): the
// number of key splits (forced_splits > 0: that many, at most 1024) and whether variant
// 5's splits merge inside their thread-block cluster (no workspace, no combine kernel:
// sm_90+, 2..16 splits, at most one CTA per SM, at most 512 keys per split; automatic
// plans also keep every cluster resident at once and, at D = 256 over 16-bit caches, take
// the combine kernel;
// measured in attention_dispatch.cu; never after set_decode_cluster_merge(false), the
// tests' and the bench's road to the combine kernel).
int decode_rows_per_cta(int64_t rows, DecodeImpl impl);
DecodePlan decode_plan(const DecodeParams& p, int64_t max_keys, int64_t forced_splits, c10::Device device,
                       at::ScalarType dtype, DecodeImpl impl);
void set_decode_cluster_merge(bool on);
// Variant 5's kv heads per CTA (DecodeParams::kv_per_cta) for this call (`max_keys` keys
// per sequence, as decode_plan): 2 where a pair instance serves it and the rule (or
// set_decode_kv_pair) takes it, else 1.
int decode_kv_per_cta(const DecodeParams& p, int64_t max_keys, c10::Device device, at::ScalarType dtype,
                      DecodeImpl impl);
// tests/bench: 0 auto, 1 never pair kv heads, 2 pair them wherever allowed.
void set_decode_kv_pair(int mode);
// Variant 5's keys per split (DecodeParams::split_chunk) for calls with several splits:
// the rule's chunks (attention_dispatch.cu), or what set_decode_split_chunk forced.
// tests/bench: k = -1 the rule (default), 0 one contiguous range per split, 1..12 chunks
// of 2^(k-1) 16-key tiles dealt round-robin. Returns false (and changes nothing) for any
// other value.
bool set_decode_split_chunk(int k);
int decode_split_chunk();
// The combine kernel's (variant 4) shape for `num_splits` splits: splits each warp loads
// at once (4, 8 or 16) and warps per output row (1, 2, 4 or 8).
struct CombineShape {
  int loads, warps;
};
CombineShape combine_shape(int num_splits);
// tests/bench: the combine kernel's loads per warp (4, 8 or 16); 0 = combine_shape's rule.
// Returns false (and changes nothing) for any other value.
bool set_decode_combine_loads(int loads);
// tests/bench: how many clusters of `splits` CTAs of variant 5's instance for (q dtype,
// head dim, fp8 cache, query rows per kv head) can be resident on `device` at once.
int decode_max_clusters(at::ScalarType dtype, int64_t D, bool fp8, int64_t rows, int64_t splits, int device);
// tests/bench: append_kv's kernel and shape (0-2: kernel 1's items per thread and blocks
// per SM; 3, 4: the bulk kernel's bytes per block where it applies; 5: the lean kernel
// where it applies; the list is beside
// launch_append in attention_dispatch.cu), -1: auto.
void set_append_shape(int shape);
// bench/tests: the lean append kernel's fewest threads per block when it halves its rows
// to cover the SMs (0: the default, down to one row; packed sequences keep a warp).
void set_append_lean_min_block(int n);
// bench/tests: the lean append kernel's chunk bytes, 4 or 8 (0: the rule); false (nothing
// set) for another value.
bool set_append_lean_bytes(int w);
// tests: the kernel of this thread's last CUDA append_kv launch: 1 the register kernel,
// 2 the bulk kernel (1b), 3 the lean kernel (1c); 0 none yet.
int& last_append_kernel();
// tests: the chunk bytes (4 or 8) of this thread's last lean append launch; 0 none yet.
int& last_append_lean_bytes();
// Whether the vector kernels can read the caches (16-byte aligned rows); why not, if not.
bool decode_cache_aligned(const KVCacheView& c, int64_t elem_size, std::string* why);
void attention_decode_cuda(const DecodeParams& p, at::ScalarType dtype, c10::Device device, DecodeImpl impl);
#endif

}  // namespace rope_ext
