// The backend entry points of the attention family (append_kv, attention_decode); the
// op layer (attention_ops.cpp) validates, fills the params and calls these.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "attention_params.h"

namespace rope_ext {

// attention_decode variants, in the order of csrc/cuda/attention_variants.cuh
// (variant 1 is append_kv's kernel). "auto" picks hybrid: the full fusion re-rotates
// every cached key on every read (the header of csrc/cuda/attention_variants.cuh).
enum class DecodeImpl : int { kHybrid = 0, kFullFusion = 1, kAuto = 2 };
inline const std::vector<std::string>& decode_impl_names() {
  static const std::vector<std::string> names = {"hybrid", "full_fusion"};
  return names;
}

void append_kv_cpu(const AppendParams& p, at::ScalarType dtype);
void attention_decode_cpu(const DecodeParams& p, at::ScalarType dtype, bool full_fusion);

#ifdef ROPE_EXT_WITH_CUDA
void append_kv_cuda(const AppendParams& p, at::ScalarType dtype, c10::Device device);
// Host-side choices (from shapes only: CUDA-graph safe): rows per CTA, and the number of
// key splits for `max_keys` keys per sequence (capacity or the max_seqlen hint).
int decode_rows_per_cta(int64_t rows);
int decode_num_splits(const DecodeParams& p, int64_t max_keys, c10::Device device, at::ScalarType dtype,
                      bool full_fusion);
// Whether the vector kernels can read the caches (16-byte aligned rows); why not, if not.
bool decode_cache_aligned(const KVCacheView& c, int64_t elem_size, std::string* why);
void attention_decode_cuda(const DecodeParams& p, at::ScalarType dtype, c10::Device device, bool full_fusion);
#endif

}  // namespace rope_ext
