// Host/device index helpers of the attention family, shared by the CUDA kernels and the
// CPU path (the rotary arithmetic itself is rope_math.h's: pair_sincos, pair_dims).
#pragma once
#include "attention_params.h"
#include "rope_math.h"

namespace rope_ext {

// a / b for non-negative 64-bit values, through the 32-bit divide when both fit (a
// 64-bit divide is a long subroutine on the GPU).
ROPE_HD int64_t div_small(int64_t a, int64_t b) {
  if ((static_cast<uint64_t>(a) >> 32) == 0 && (static_cast<uint64_t>(b) >> 32) == 0)
    return static_cast<uint32_t>(a) / static_cast<uint32_t>(b);
  return a / b;
}

// The rotary position of a token: positions[row_b, row_t] if given, else its cache
// index + offsets[b] (or the scalar offset).
ROPE_HD int64_t attn_position(const RopeParams& p, int64_t row_b, int64_t row_t, int64_t b, int64_t cache_index) {
  if (p.positions.ptr) return load_index(p.positions, row_b * p.pos_stride_b + row_t * p.positions.stride);
  return cache_index + (p.offsets.ptr ? load_index(p.offsets, b * p.offsets.stride) : p.offset);
}

// Element offsets (head 0, feature 0) of slot i of sequence b in the k and v caches.
// False when the slot does not exist: i outside [0, capacity), or a block id outside
// [0, num_blocks). Callers drop such slots (never read or written out of bounds).
ROPE_HD bool cache_slot(const KVCacheView& c, int64_t b, int64_t i, int64_t* k_off, int64_t* v_off) {
  if (i < 0 || i >= c.capacity) return false;
  int64_t d0 = b, d1 = i;
  if (c.paged) {
    const int64_t n = div_small(i, c.block_size);
    d0 = load_index(c.block_table, b * c.bt_stride_b + n * c.block_table.stride);
    if (d0 < 0 || d0 >= c.num_blocks) return false;
    d1 = i - n * c.block_size;
  }
  *k_off = d0 * c.k_stride[0] + d1 * c.k_stride[1];
  *v_off = d0 * c.v_stride[0] + d1 * c.v_stride[1];
  return true;
}

ROPE_HD int64_t cache_len(const KVCacheView& c, int64_t b) { return load_index(c.seqlens, b * c.seqlens.stride); }

// attention_decode: the keys sequence b holds for this call (the decode step's new
// tokens included).
ROPE_HD int64_t decode_seqlen(const DecodeParams& p, int64_t b) { return cache_len(p.cache, b) + p.appended; }

// append_kv: token t (0 .. num_tokens) -> sequence b, index j inside the new tokens of
// b, and the input row (row_b, row_t).
struct AppendToken { int64_t b, j, row_b, row_t; };
ROPE_HD AppendToken append_token(const AppendParams& p, int64_t t) {
  AppendToken a;
  if (p.varlen) {
    a.b = seq_of_token(p.rope, t);
    a.j = t - seq_start(p.rope, a.b);
    a.row_b = 0;
    a.row_t = t;
  } else {
    a.b = div_small(t, p.T);
    a.j = t - a.b * p.T;
    a.row_b = a.b;
    a.row_t = a.j;
  }
  return a;
}

// attention_decode: the number of keys row r (query token j) of sequence b may see.
// Query token j sits at cache index seqlen - q_len + j. When that is negative (q_len >
// seqlen: the token is not in the cache, and its default rotary position would be
// negative) the query sees no key, causal or not: output zeros, lse = -inf, on the CPU
// and the GPU alike. (The host refuses it for causal=False where it checks values; for
// causal=True it is the causal rule itself.) seqlen is clamped to the capacity (a
// longer one never reads past the cache).
ROPE_HD int64_t decode_key_limit(const DecodeParams& p, int64_t seqlen, int64_t j) {
  const int64_t idx = seqlen - p.q_len + j;
  if (idx < 0) return 0;
  const int64_t n = seqlen < p.cache.capacity ? seqlen : p.cache.capacity;
  if (!p.causal) return n;
  return idx + 1 < n ? idx + 1 : n;
}

}  // namespace rope_ext
