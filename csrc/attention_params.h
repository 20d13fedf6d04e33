// The contract between the attention op layer (attention_ops.cpp) and its
// implementations (csrc/cuda/attention_variants.cuh, csrc/cpu/attention_cpu.cpp):
// one struct per kernel family, passed by value (no 20-argument signatures).
//
// The rotary part reuses RopeParams (rope_params.h): R, D, pairing, the frequency
// source (base / inv_freq / cos_sin_cache, filled by fill_frequencies exactly as for
// apply_rope), explicit positions, offsets. Its positions rules are NOT position_of's:
// a token's default position is its cache index (+ offsets), see attention_math.h.
//
// Caches (vLLM / FlashInfer layouts), the feature dimension always unit-stride:
//   contiguous  [batch, capacity, Hk, D]: slot i of sequence b is row (b, i)
//   paged       [num_blocks, block_size, Hk, D] + block_table [B, max_blocks]:
//               slot i of sequence b is row (block_table[b, i / block_size], i % block_size)
// Strides are in elements and 64-bit.
// FP8 caches (float8_e4m3fn, vLLM's kv_cache_dtype="fp8"): a cache element holds x / scale
// (rounded once, saturated to +-448); a reader multiplies by the scale. k_scale / v_scale:
// float32, one per tensor (stride 0) or one per kv head (stride 1).
#pragma once
#include <cstdint>

#include "rope_params.h"

namespace rope_ext {

struct KVCacheView {
  void* k = nullptr;
  void* v = nullptr;
  int64_t k_stride[3] = {0, 0, 0};  // dim 0 (sequence or block), dim 1 (slot or offset in block), head
  int64_t v_stride[3] = {0, 0, 0};
  int64_t Hk = 0;
  int64_t capacity = 0;             // slots per sequence: max_len, or max_blocks * block_size
  bool paged = false;
  int64_t block_size = 1;
  int64_t num_blocks = 0;
  IndexArray block_table;           // .stride: the column stride
  int64_t bt_stride_b = 0;          // the row stride
  IndexArray seqlens;               // cache_seqlens [B]
  bool fp8 = false;                 // e4m3 elements (1 byte) with the scales below
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  int64_t k_scale_stride = 0;       // per kv head: 1; per tensor: 0
  int64_t v_scale_stride = 0;
};

// n / d for 0 <= n < 2^31 by a multiply-high, an add and a shift, d (>= 1, < 2^31) fixed
// per launch and its multiplier computed on the host (division by invariant integers,
// Granlund and Montgomery; PyTorch's IntDivider is the same). A run-time 32-bit division
// is ~20 instructions: append_kv's item decode did five per 16-byte item.
struct FastDiv {
  uint32_t d = 1, m = 1;
  int32_t s = 0;
  FastDiv() = default;
  explicit FastDiv(uint32_t divisor) : d(divisor < 1 ? 1 : divisor) {
    while ((uint64_t(1) << s) < d) ++s;
    m = static_cast<uint32_t>(((uint64_t(1) << 32) * ((uint64_t(1) << s) - d)) / d + 1);
  }
#if defined(__CUDACC__)
  __host__ __device__ __forceinline__
#else
  inline
#endif
  uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t t = __umulhi(n, m);
#else
    const uint32_t t = static_cast<uint32_t>((uint64_t(n) * m) >> 32);
#endif
    return (t + n) >> s;
  }
};

// append_kv: rotate k (and q in place), write rotated k and v into the cache slots
// cache_seqlens[b] + j of the new tokens.
//   batched  k, v [B, T, Hk, D] (q [B, T, Hq, D]): token (b, j), input row (b, j)
//   varlen   k, v [Ttot, Hk, D] + cu_seqlens [B+1]: token t of sequence b (j = t - cu[b]),
//            input row (0, t); in_stride[.][0] is then 0
// rope.positions (if given) are indexed like the input rows: [B, T] / [T] / [Ttot].
struct AppendParams {
  KVCacheView cache;
  const void* k = nullptr;
  const void* v = nullptr;
  void* q = nullptr;                   // optional, rotated in place
  int64_t k_stride[4] = {0, 0, 0, 0};  // row b, row t, head, feature
  int64_t v_stride[4] = {0, 0, 0, 0};
  int64_t q_stride[4] = {0, 0, 0, 0};
  int64_t Hq = 0;                      // 0 when q is not given
  int64_t Dv = 0;                      // v's head dim (= D but for MLA's latent, kv_lora_rank)
  int64_t B = 0;                       // sequences
  int64_t T = 0;                       // tokens per sequence (batched) or in total (varlen)
  int64_t num_tokens = 0;              // B * T, or Ttot
  bool varlen = false;                 // rope.cu_seqlens / rope.num_seqs then hold the sequences
  bool rotate_k = true;                // false: k is written as given (the full-fusion cache)
  // The CUDA kernels' divisors, set by their launchers (they depend on the chunk width):
  // items per token, K rotary / K pass-through / V chunks per head, Q rotary chunks per
  // head (= K's), tokens per sequence (batched), pairs per token (R / 2); the bulk
  // variant's rotary chunks of K and Q per token.
  struct Dividers { FastDiv per_tok, k_rot, k_tail, v_chunks, n_rot, T, half, rot_tok; } div;
  // Last: the kernels read the fields above in dependent steps, and with the ~1 KB
  // RopeParams (its frequency table) first they straddled more constant-cache lines.
  RopeParams rope;
};

// attention_decode: q [B, q_len, Hq, D] (un-rotated) against the cache. Query token j of
// sequence b sits at cache index seqlens[b] - q_len + j; with `causal` it sees keys
// 0 .. that index, else every key below seqlens[b]; at a negative index (not in the
// cache) it sees no key either way (attention_math.h, decode_key_limit). Q is rotated while it is loaded
// (position: rope.positions[b, j] if given, else its cache index + offsets); keys in
// the cache are already rotated (hybrid), or rotated on every read at position
// index + offsets (full fusion).
// Work: grid (num_splits * row_groups, Hk / kv_per_cta, B). The G = Hq / Hk query heads
// of one kv head (kv_per_cta * G of the CTA's kv heads) times q_len form the rows (row r =
// j * G + g), cut into row groups; each CTA runs one row group over one split of the keys.
struct DecodeParams {
  KVCacheView cache;
  const void* q = nullptr;
  int64_t q_stride[4] = {0, 0, 0, 0};  // b, j, head, feature
  void* o = nullptr;                   // [B, q_len, Hq, D], contiguous, q's dtype
  float* lse = nullptr;                // [B, q_len, Hq] natural log
  float* ws_o = nullptr;               // num_splits > 1: [B, Hq, q_len, num_splits, D] partial O / l
  float* ws_lse = nullptr;             //                 [B, Hq, q_len, num_splits] partial lse (log2)
  int64_t B = 0, q_len = 0, Hq = 0, G = 0;
  int32_t rows_per_group = 0;          // rows of one CTA (<= the kernel's kRows)
  int32_t row_groups = 1;
  int32_t num_splits = 1;
  // Variant 5: 0 = split s takes the s-th contiguous range of the keys; k > 0 = the splits
  // take chunks of 2^(k-1) tiles of 16 keys round-robin (decode_split_chunk).
  int32_t split_chunk = 0;
  // Variant 5 over fp8 caches: kv heads per CTA (1, or 2: neighbouring heads whose rows
  // lie side by side in the cache; grid y is then Hk / 2 and a CTA's query rows are both
  // heads' G query heads; decode_kv_per_cta in attention_dispatch.cu).
  int32_t kv_per_cta = 1;
  // Variant 5, num_splits > 1 on sm_90+: the splits of one row group form a thread-block
  // cluster and merge through distributed shared memory at the end of the kernel (no
  // workspace, no combine launch; decode_merge.cuh). Otherwise the combine kernel does it.
  bool cluster_merge = false;
  // The combine kernel's shape (num_splits > 1 without the cluster merge; combine_shape in
  // attention_dispatch.cu): splits each warp loads at once (4, 8, 16), warps per row (1-8).
  int32_t combine_loads = 0, combine_warps = 0;
  float softmax_scale = 1.f;
  bool causal = true;
  // The decode step (attention_decode with k, v): the q_len new tokens go (or went: the
  // paths that append first) to cache indices cache_seqlens[b] + j, and every reader sees
  // cache_seqlens[b] + appended keys (decode_seqlen). k_new / v_new set: variant 5 writes
  // them itself, in the same launch (rows [B, q_len, Hk, D], features contiguous,
  // 16-byte aligned; strides b, j, head).
  int64_t appended = 0;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int64_t kn_stride[3] = {0, 0, 0};
  int64_t vn_stride[3] = {0, 0, 0};
  RopeParams rope;  // last, as in AppendParams
};

// The combine kernel's own (small) params: one constant-cache line instead of the
// decode params' ~1.2 KB (issue 18: at B = 1 its cold misses were most of its time).
struct CombineParams {
  void* o = nullptr;
  float* lse = nullptr;
  const float* ws_o = nullptr;
  const float* ws_lse = nullptr;
  int64_t B = 0, q_len = 0, Hq = 0;
  int32_t num_splits = 1, D = 0;
  int32_t log2_warps = 0;  // warps per output row: 1 << log2_warps (1..8)
};

}  // namespace rope_ext
