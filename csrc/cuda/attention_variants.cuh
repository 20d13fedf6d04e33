// The CUDA kernels of the attention family (RoPE fused where fusion pays), numbered:
//
//   1. append_kv        one launch per decode/prefill step: each block owns a few new
//                       tokens; each thread first loads the input chunks of its
//                       (token, K/V/Q head, 16-byte chunk) items, then the block
//                       computes the tokens' slots (contiguous or paged) and the
//                       sin/cos of each (token, pair) once into shared memory, then
//                       the thread rotates and stores its items (K rotated and V into
//                       the cache, Q in place). A slot that does not exist (past the
//                       capacity, or a block id out of range) is dropped.
//                       Tried and reverted (commit 46d3eed, H100 run 2 of 2026-11-24
//                       evening): 1-8 whole warps per token, no block barrier, the
//                       token's sin/cos in the warp's shared row, 4 items per lane in
//                       registers (8 spilled at 128 registers): T = 8192 39.9 us (56%
//                       of copy; this kernel 34.4, 65%), with q 84.6 (77.0 here), T = 16
//                       6.9 us (the same). Registers bound both versions: 2 blocks of
//                       8 warps x 3 items per lane kept fewer bytes in flight per SM
//                       than 3 blocks of 256 threads x ~4 items here. The barriers were
//                       not the cost; staging through shared memory (cp.async: no
//                       registers per byte in flight) is the next thing to try.
//                       FastDiv item decode (2026-11-25 run 2): 17.3 -> 14.0 M warp
//                       instructions at T = 8192, 35.5 -> 33.3 us (same-size copy 27.5).
//   1b. append_kv, bulk  (auto's choice where it applies: 16-byte rows, a token's heads
//                       contiguous, sm_90) the token rows staged whole into shared
//                       memory by the copy engine, V stored from there, K and Q rotated
//                       in place there (fp8 caches: K and V quantized into staged fp8
//                       rows); the same step 2 (slots, sin/cos). T = 8192 29.9 us, 90%
//                       of a same-size copy (run 4 of 2026-11-25).
//   1c. append_kv, lean  (auto's choice below 2 tokens per SM where it applies) one
//                       thread per 8-byte chunk (4-byte for calls of <= 32K threads,
//                       where a chunk holds a pair and a row <= 128 chunks) of one K / V
//                       / Q row of one token, its own small params, no shared memory, no
//                       barrier: T = 16 4.7 us against kernel 1's 6.9 (run 1 of the
//                       night of 2026-11-25; run 7 of 2026-11-26's eighth session: 4.7).
//   2. decode, hybrid_simt (impl="hybrid_simt"; auto takes variant 5, decode_mma.cuh,
//                       which needs 0.70-0.93x of this one's time on the H100: this
//                       kernel spends ~60 warp instructions per key and kv head on
//                       shuffle reductions and scalar P.V) split-KV decode attention over a cache of
//                       ROTATED keys; Q is rotated (accurate sin/cos, fp32) while the
//                       CTA loads it into shared memory, the softmax scale folded in.
//                       Grid (num_splits * row_groups, Hk, B): a CTA takes one kv head,
//                       the G = Hq / Hk query heads of its group times q_len rows (up to
//                       kRows of them) and one split of the keys. Lanes split the head
//                       dim (8 features = one 16-byte load per lane; D/8 lanes per key),
//                       the 128 / (D/8) key slots of the CTA walk the keys N at a time,
//                       each slot with its own online softmax (running max / sum / P.V
//                       in fp32 registers): no barrier in the key loop, every K and V
//                       element is read from DRAM once per CTA, coalesced (a key row is
//                       D contiguous elements). The slots merge in shared memory at the
//                       end; each split writes its partial O and log2-sum-exp (or, with
//                       one split, the output directly).
//   3. decode, full     the same kernel with K-RoPE inside the loop: the cache holds
//      fusion          UN-rotated keys and each key is rotated after its load at
//                       position index + offsets (neox partners are exchanged between
//                       lanes with shuffles). Kept as a variant for the bench.
//   4. combine          1-8 warps per (b, query token, head), 4-16 splits loaded per
//                       warp at once: merges the splits' partial outputs with weights
//                       exp2(lse_s - max).
//
// What was learned (the design notes; H100 numbers come from bench/attn.py runs):
//   - K-RoPE in the loop (3) costs, per key and lane, 8 accurate sin/cos (a double
//     product and a reduction each) plus 4 shuffles: more issue slots than the key's
//     dot products and P.V together, and it is paid on EVERY decode step for EVERY
//     cached key, while rotating at append_kv time (1 + 2) pays once per token. The
//     hybrid (now variant 5) is therefore auto's choice for decode.
//   - Q-RoPE on load is free: rows * R/2 sin/cos per CTA, once, hidden behind the first
//     key loads of the other warps.
//   - Splits are chosen on the host from shapes only (capacity or a max_seqlen hint):
//     the kernel cuts each sequence's actual length into num_splits pieces at run time,
//     so a CUDA graph captured once replays for any cache_seqlens.
#pragma once
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>  // offsetof
#include <type_traits>

#include "../attention_math.h"
#include "decode_merge.cuh"
#include "primitives.cuh"  // Vec, load_vec, store_vec, rotate_chunk

namespace rope_ext {
namespace cuda {

// ---------------------------------------------------------------- 1. append_kv
constexpr int kAppendThreads = 256;

// Per-token record of a block (shared memory): cache offsets, the position.
struct AppendSlot {
  int64_t k_out, v_out;  // element offsets of the token's head-0 row in the caches; < 0: no slot (dropped)
  int64_t pos;
};

// Shared memory of an append block (after the bulk variant's staged rows): the cos and
// sin tables [tokens][R/2] first (16-byte aligned rows: a chunk's P values in one or two
// vector reads), the slots, then (varlen, fewer sequences than the block has threads:
// append_seqs_early) cu_seqlens [B + 1] and the cache lengths [B].
struct AppendTables {
  float* cos_tab;
  float* sin_tab;
  AppendSlot* slots;
  int64_t* cu_s;
  int64_t* lens_s;
};
__host__ __device__ __forceinline__ bool append_seqs_early(const AppendParams& p, int threads) {
  return p.varlen && p.B < threads;
}
__host__ __device__ __forceinline__ size_t append_tables_bytes(const AppendParams& p, int tokens_per_block,
                                                               int threads) {
  return 2 * sizeof(float) * tokens_per_block * (p.rope.R / 2) + tokens_per_block * sizeof(AppendSlot) +
         (append_seqs_early(p, threads) ? sizeof(int64_t) * (2 * p.B + 1) : 0);
}
__device__ __forceinline__ AppendTables append_tables(void* base, const AppendParams& p, int tokens_per_block) {
  const int half = p.rope.R / 2;
  AppendTables t;
  t.cos_tab = static_cast<float*>(base);
  t.sin_tab = t.cos_tab + tokens_per_block * half;
  t.slots = reinterpret_cast<AppendSlot*>(t.sin_tab + tokens_per_block * half);
  t.cu_s = reinterpret_cast<int64_t*>(t.slots + tokens_per_block);
  t.lens_s = t.cu_s + p.B + 1;
  return t;
}

// Step 2 of both append kernels: the cache slot of each of the block's nt tokens (from
// t0) and sin/cos once per (token, pair), into tb; ends with a barrier.
// Varlen inputs of fewer sequences than the block has threads: cu_seqlens and every
// sequence's cache length into shared memory first, all loads at once (and in flight
// with the caller's input loads); the search through cu_seqlens in global memory, one
// dependent sector after another, then the length, made T = 16 of 16 sequences 7.0 us
// against 6.1 batched and a 3.0 us one-store kernel (bench/latency_floor.py, H100). Then,
// where a thread can find its token's position itself (batched, or the tables above),
// the slot and sin/cos phases run side by side, one barrier; else the sin/cos phase reads
// the positions the slot phase wrote.
__device__ __forceinline__ void append_slots_and_sincos(const AppendParams& p, const AppendTables& tb, int64_t t0,
                                                        int nt) {
  const RopeParams& r = p.rope;
  const int half = r.R / 2, tid = threadIdx.x, nthreads = blockDim.x;
  const bool seqs_early = append_seqs_early(p, nthreads);
  if (seqs_early) {
    if (tid <= p.B) tb.cu_s[tid] = seq_start(r, tid);
    if (tid < p.B) tb.lens_s[tid] = cache_len(p.cache, tid);
    __syncthreads();
  }
  auto token_at = [&](int tl) {
    const int64_t t = t0 + tl;
    AppendToken a;
    if (!p.varlen) {
      a.b = p.div.T.div(static_cast<uint32_t>(t));
      a.j = t - a.b * p.T;
      a.row_b = a.b;
      a.row_t = a.j;
    } else if (seqs_early) {  // seq_of_token's search, in shared memory
      int lo = 0, hi = static_cast<int>(p.B) - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (tb.cu_s[mid] <= t) lo = mid; else hi = mid - 1;
      }
      a.b = lo;
      a.j = t - tb.cu_s[lo];
      a.row_b = 0;
      a.row_t = t;
    } else {
      a = append_token(p, t);
    }
    return a;
  };
  auto token_index = [&](const AppendToken& a) {  // the token's cache index
    return (seqs_early ? tb.lens_s[a.b] : cache_len(p.cache, a.b)) + a.j;
  };
  const bool merged = !p.varlen || seqs_early;
  for (int tl = tid; tl < nt; tl += nthreads) {
    const AppendToken at = token_at(tl);
    const int64_t idx = token_index(at);
    AppendSlot sl;
    sl.pos = attn_position(r, at.row_b, at.row_t, at.b, idx);
    if (!cache_slot(p.cache, at.b, idx, &sl.k_out, &sl.v_out)) sl.k_out = sl.v_out = -1;
    tb.slots[tl] = sl;
  }
  if (!merged) __syncthreads();
  for (int e = tid; e < nt * half; e += nthreads) {
    const int tl = p.div.half.div(e), i = e - tl * half;
    int64_t pos;
    if (merged) {
      const AppendToken at = token_at(tl);
      pos = attn_position(r, at.row_b, at.row_t, at.b, token_index(at));
    } else {
      pos = tb.slots[tl].pos;
    }
    pair_sincos(r, pos, i, inv_freq_of(r, i), &tb.sin_tab[e], &tb.cos_tab[e]);
  }
  __syncthreads();
}

// A chunk of V elements: a 16-byte vector, or (kVec false: any strides / sizes)
// V scalar elements at stride sd.
template <bool kVec, typename VecT, typename T>
__device__ __forceinline__ VecT load_chunk(const T* p, int64_t sd) {
  if constexpr (kVec) {
    return load_vec<VecT>(p);
  } else {
    VecT v;
#pragma unroll
    for (int j = 0; j < static_cast<int>(sizeof(v.v) / sizeof(T)); ++j) v.v[j] = p[j * sd];
    return v;
  }
}
template <bool kVec, typename VecT, typename T>
__device__ __forceinline__ void store_chunk(T* p, int64_t sd, const VecT& v) {
  if constexpr (kVec) {
    store_vec(p, v);
  } else {
#pragma unroll
    for (int j = 0; j < static_cast<int>(sizeof(v.v) / sizeof(T)); ++j) p[j * sd] = v.v[j];
  }
}

// FP8 cache chunks (kFp8): the item's V values as fp32 (rotated first for K rotary
// items, the same expression as rotate_chunk's), divided by the scale (IEEE division,
// as torch's x / scale) and rounded once, saturating, to e4m3: V bytes per chunk.
template <int V>
__device__ __forceinline__ void store_fp8_chunk(uint8_t* dst, const float* f, float scale, bool vec) {
  uint8_t b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) b[j] = __nv_cvt_float_to_fp8(f[j] / scale, __NV_SATFINITE, __NV_E4M3);
  if constexpr (V == 8) {
    if (vec) {
      uint2 u;
      u.x = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
      u.y = b[4] | (b[5] << 8) | (b[6] << 16) | (uint32_t(b[7]) << 24);
      *reinterpret_cast<uint2*>(dst) = u;
      return;
    }
  } else if constexpr (V == 4) {
    if (vec) {
      *reinterpret_cast<uint32_t*>(dst) = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
      return;
    }
  } else if constexpr (V == 2) {
    if (vec) {
      *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(b[0] | (b[1] << 8));
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) dst[j] = b[j];
}

// One fp8 cache item (kernels 1 and 1b): chunk a (and, a neox K rotary item, its partner
// b R/2 later) as fp32; a K rotary item is rotated in fp32 by the P sines / cosines at
// sin_row / cos_row (the chunk's first pair), then all is scaled and rounded once into
// dst (and dst + R/2). One expression for both kernels: their caches are bit-equal.
template <bool kInterleaved, int V, int P, typename VecT>
__device__ __forceinline__ void store_fp8_item(uint8_t* dst, int half, const VecT& a, const VecT& b, bool rotary,
                                               const float* sin_row, const float* cos_row, float scale, bool vec) {
  float fa[V], fb[V];
#pragma unroll
  for (int j = 0; j < V; ++j) fa[j] = static_cast<float>(a.v[j]);
  if (rotary) {
    if (!kInterleaved)
#pragma unroll
      for (int j = 0; j < V; ++j) fb[j] = static_cast<float>(b.v[j]);
    float sn[P], cs[P];
    load_table<P>(sin_row, sn);
    load_table<P>(cos_row, cs);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const int j0 = kInterleaved ? 2 * e : e;
      const float x0 = fa[j0], x1 = kInterleaved ? fa[j0 + 1] : fb[e];
      const float y0 = rot_y0(x0, x1, cs[e], sn[e]), y1 = rot_y1(x0, x1, cs[e], sn[e]);
      fa[j0] = y0;
      (kInterleaved ? fa[j0 + 1] : fb[e]) = y1;
    }
    if (!kInterleaved) store_fp8_chunk<V>(dst + half, fb, scale, vec);
  }
  store_fp8_chunk<V>(dst, fa, scale, vec);
}

// Work items of one token, in this order: K rotary items (a chunk and, neox, its partner
// R/2 later), K pass-through chunks (all of K when rotate_k is false), V chunks, Q rotary
// items (p.Hq is 0 without q); chunks of V elements. Kernel 1 and the bulk kernel's fp8
// path decode them with append_item (the divisions by p.div's FastDivs, which the
// launchers set from these counts: set_append_dividers).
struct AppendItems {
  int n_rot, n_tail, ck_rot, v_chunks;  // per head: rotary chunks, K pass-through, K rotary items, V chunks
  int nkr, nkt, nv, per_tok;            // per token: K rotary, K pass-through, V items; all items
};
__host__ __device__ __forceinline__ AppendItems append_items(const AppendParams& p, int V) {
  const RopeParams& r = p.rope;
  AppendItems n;
  n.n_rot = rot_chunks(r, V);
  n.n_tail = p.rotate_k ? (r.D - r.R) / V : r.D / V;
  n.ck_rot = p.rotate_k ? n.n_rot : 0;
  n.v_chunks = static_cast<int>(p.Dv) / V;  // V's own head dim (MLA's latent: kv_lora_rank)
  const int Hk = static_cast<int>(p.cache.Hk);
  n.nkr = Hk * n.ck_rot;
  n.nkt = Hk * n.n_tail;
  n.nv = Hk * n.v_chunks;
  n.per_tok = n.nkr + n.nkt + n.nv + static_cast<int>(p.Hq) * n.n_rot;
  return n;
}
struct AppendItem { int kind, h, d0; };  // kind: 0 K rotary, 1 K pass-through, 2 V, 3 Q rotary; head; first feature
__device__ __forceinline__ AppendItem append_item(const AppendParams& p, const AppendItems& n, int w, int V) {
  AppendItem m;
  if (w < n.nkr) {
    m.kind = 0; m.h = p.div.k_rot.div(w); m.d0 = chunk_start(p.rope, w - m.h * n.ck_rot, V);
  } else if ((w -= n.nkr) < n.nkt) {
    m.kind = 1; m.h = p.div.k_tail.div(w); m.d0 = (p.rotate_k ? p.rope.R : 0) + (w - m.h * n.n_tail) * V;
  } else if ((w -= n.nkt) < n.nv) {
    m.kind = 2; m.h = p.div.v_chunks.div(w); m.d0 = (w - m.h * n.v_chunks) * V;
  } else {
    w -= n.nv;
    m.kind = 3; m.h = p.div.n_rot.div(w); m.d0 = chunk_start(p.rope, w - m.h * n.n_rot, V);
  }
  return m;
}

// kFp8: the caches are e4m3 (attention_params.h): K and V are scaled and rounded once.
template <typename T, bool kInterleaved, bool kVec, bool kFp8, int kItems, int kMinBlocks>
__global__ void __launch_bounds__(kAppendThreads, kMinBlocks) append_kv_kernel(const __grid_constant__ AppendParams p,
                                                                            int tokens_per_block) {
  // V elements per chunk: 16 bytes; scalar path: one pair (GPT-J) or one element (neox).
  constexpr int V = kVec ? 16 / static_cast<int>(sizeof(T)) : (kInterleaved ? 2 : 1);
  constexpr int P = kInterleaved ? V / 2 : V;  // pairs per chunk
  using VecT = Vec<T, V>;
  const RopeParams& r = p.rope;
  const int half = r.R / 2;
  extern __shared__ float4 append_smem[];
  const AppendTables tb = append_tables(append_smem, p, tokens_per_block);
  const float* cos_tab = tb.cos_tab;
  const float* sin_tab = tb.sin_tab;
  const AppendSlot* slots = tb.slots;

  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tokens_per_block;
  const int nt = static_cast<int>(min(static_cast<int64_t>(tokens_per_block), p.num_tokens - t0));
  const int tid = threadIdx.x;

  const AppendItems items = append_items(p, V);
  const int per_tok = items.per_tok;
  const AppendParams::Dividers& dv = p.div;  // the divisions below by these, as multiplies
  const T* kin = static_cast<const T*>(p.k);
  const T* vin = static_cast<const T*>(p.v);
  T* qio = static_cast<T*>(p.q);

  // 1. Every item's input chunks are loaded first: the input rows need only the token
  // index (varlen inputs are packed), so these DRAM reads overlap step 2's dependent
  // chain (cache_seqlens / cu_seqlens -> slot, position -> sin/cos). The first version
  // loaded each chunk after both barriers, one chunk in flight per thread: T = 8192
  // without q ran at 63% of copy, T = 16 took 7 us.
  struct Item { int kind, tl, h, d0; };  // kind: 0 K rotary, 1 K copy, 2 V, 3 Q; -1 none
  auto input_row = [&](int tl, int64_t* rb, int64_t* rt) {  // (b, j) batched, (0, t) varlen
    const int64_t tok = t0 + tl;  // < 2^31 (the host checks)
    *rb = p.varlen ? 0 : dv.T.div(static_cast<uint32_t>(tok));
    *rt = p.varlen ? tok : tok - *rb * p.T;
  };
  auto load_item = [&](int w_all, Item& m, VecT& a, VecT& b) {
    m.kind = -1;
    if (w_all >= nt * per_tok) return;
    m.tl = dv.per_tok.div(w_all);
    int w = w_all - m.tl * per_tok;
    int64_t rb, rt;
    input_row(m.tl, &rb, &rt);
    const AppendItem ai = append_item(p, items, w, V);
    m.kind = ai.kind; m.h = ai.h; m.d0 = ai.d0;
    const T* src;
    int64_t sd;
    if (m.kind <= 1) {
      src = kin + rb * p.k_stride[0] + rt * p.k_stride[1] + m.h * p.k_stride[2]; sd = p.k_stride[3];
    } else if (m.kind == 2) {
      src = vin + rb * p.v_stride[0] + rt * p.v_stride[1] + m.h * p.v_stride[2]; sd = p.v_stride[3];
    } else {
      src = qio + rb * p.q_stride[0] + rt * p.q_stride[1] + m.h * p.q_stride[2]; sd = p.q_stride[3];
    }
    if (kVec) sd = 1;  // the host's condition for 16-byte vectors (no strided-constant reads)
    a = load_chunk<kVec, VecT>(src + m.d0 * sd, sd);
    if (!kInterleaved && (m.kind == 0 || m.kind == 3)) b = load_chunk<kVec, VecT>(src + (m.d0 + half) * sd, sd);
  };
  // 3. (below) Rotate and store: K and V into the token's cache slot (dropped if it
  // does not exist), Q in place.
  T* kc = static_cast<T*>(p.cache.k);
  T* vc = static_cast<T*>(p.cache.v);
  auto store_item = [&](const Item& m, VecT& a, VecT& b) {
    if (m.kind < 0) return;
    const AppendSlot& sl = slots[m.tl];
    if constexpr (kFp8) {
      if (m.kind != 3) {
        const bool is_v = m.kind == 2;
        const int64_t out = is_v ? sl.v_out : sl.k_out;
        if (out < 0) return;
        const KVCacheView& c = p.cache;
        uint8_t* row = static_cast<uint8_t*>(is_v ? c.v : c.k) + out + m.h * (is_v ? c.v_stride[2] : c.k_stride[2]);
        const float scale = is_v ? c.v_scale[m.h * c.v_scale_stride] : c.k_scale[m.h * c.k_scale_stride];
        const int i0 = m.tl * half + (kInterleaved ? m.d0 / 2 : m.d0);  // the chunk's first pair (K rotary)
        store_fp8_item<kInterleaved, V, P>(row + m.d0, half, a, b, m.kind == 0, sin_tab + i0, cos_tab + i0, scale,
                                           kVec);
        return;
      }
    }
    T* dst;
    int64_t dsd = 1;
    if (m.kind == 3) {
      int64_t rb, rt;
      input_row(m.tl, &rb, &rt);
      dst = qio + rb * p.q_stride[0] + rt * p.q_stride[1] + m.h * p.q_stride[2];
      dsd = kVec ? 1 : p.q_stride[3];
    } else if (m.kind == 2) {
      if (sl.v_out < 0) return;
      dst = vc + sl.v_out + m.h * p.cache.v_stride[2];
    } else {
      if (sl.k_out < 0) return;
      dst = kc + sl.k_out + m.h * p.cache.k_stride[2];
    }
    if (m.kind == 0 || m.kind == 3) {
      float sn[P], cs[P];
      const int i0 = kInterleaved ? m.d0 / 2 : m.d0;  // first pair of the chunk
      load_table<P>(sin_tab + m.tl * half + i0, sn);
      load_table<P>(cos_tab + m.tl * half + i0, cs);
      rotate_chunk<T, kInterleaved>(a, b, sn, cs);
      if (!kInterleaved) store_chunk<kVec, VecT>(dst + (m.d0 + half) * dsd, dsd, b);
    }
    store_chunk<kVec, VecT>(dst + m.d0 * dsd, dsd, a);
  };
  constexpr int kBatch = kAppendThreads * kItems;
  Item it[kItems];
  VecT a[kItems], bv[kItems];
#pragma unroll
  for (int u = 0; u < kItems; ++u) load_item(tid + u * kAppendThreads, it[u], a[u], bv[u]);

  // 2. Slots and positions of the block's tokens, and sin/cos once per (token, pair).
  append_slots_and_sincos(p, tb, t0, nt);

  // 3. The preloaded items, then (many heads, or the scalar path: a token has more
  // items than the block holds at once) the rest in batches, loads before stores.
#pragma unroll
  for (int u = 0; u < kItems; ++u) store_item(it[u], a[u], bv[u]);
  for (int base = kBatch; base < nt * per_tok; base += kBatch) {
#pragma unroll
    for (int u = 0; u < kItems; ++u) load_item(base + tid + u * kAppendThreads, it[u], a[u], bv[u]);
#pragma unroll
    for (int u = 0; u < kItems; ++u) store_item(it[u], a[u], bv[u]);
  }
}

// ---------------------------------------------------------------- 1b. append_kv, bulk
// The common case (16-byte vectors, a token's K / V / Q heads contiguous in the inputs,
// sm_90): one thread stages the block's
// token rows of K, V (and Q) into shared memory with the copy engine (cp.async.bulk, one
// copy per row, completing on an mbarrier) while the block computes the slots and the
// sin/cos tables (step 2 above, the same code); V goes from shared memory straight to its
// cache slot, K's and Q's rotary chunks are rotated in place in shared memory, and K's
// row goes to its slot, Q's back to q. No registers per byte in flight, no per-byte index
// math: the register kernel (1) moved T = 8192 at 77-82% of a same-size copy, issue- and
// barrier-bound (ncu: ~280 instructions per 16-byte item before FastDiv, ~230 after).
// A cache whose heads are adjacent takes one store per token row; a head-major one (a
// head's slots contiguous: the faster layout for fp8 reads, docs/attention.md) one per
// head, spread over the threads as (token, head) pairs.
constexpr int kAppendBulkThreads = 128;

template <typename T, bool kInterleaved, bool kFp8>
__global__ void __launch_bounds__(kAppendBulkThreads) append_kv_bulk_kernel(const __grid_constant__ AppendParams p,
                                                                           int tokens_per_block) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int V = 16 / static_cast<int>(sizeof(T));
  constexpr int P = kInterleaved ? V / 2 : V;
  using VecT = Vec<T, V>;
  const RopeParams& r = p.rope;
  const int half = r.R / 2, D = r.D;
  const int Hk = static_cast<int>(p.cache.Hk), Hq = static_cast<int>(p.Hq);
  const int krow = Hk * D, vrow = Hk * static_cast<int>(p.Dv), qrow = p.q ? Hq * D : 0;  // elements per token
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tokens_per_block;
  const int nt = static_cast<int>(min(static_cast<int64_t>(tokens_per_block), p.num_tokens - t0));
  const int tid = threadIdx.x;
  extern __shared__ float4 bulk_smem[];
  T* ks = reinterpret_cast<T*>(bulk_smem);  // [tokens][krow], then V's and Q's rows
  T* vs = ks + tokens_per_block * krow;
  T* qs = vs + tokens_per_block * vrow;
  // fp8 caches: the quantized K and V rows are staged here for the bulk stores (bytes).
  uint8_t* k8 = reinterpret_cast<uint8_t*>(qs + tokens_per_block * qrow);
  uint8_t* v8 = k8 + (kFp8 ? tokens_per_block * krow : 0);
  uint64_t* bar = reinterpret_cast<uint64_t*>(v8 + (kFp8 ? tokens_per_block * vrow : 0));
  const AppendTables tb = append_tables(bar + 2, p, tokens_per_block);
  const T* kin = static_cast<const T*>(p.k);
  const T* vin = static_cast<const T*>(p.v);
  T* qio = static_cast<T*>(p.q);
  auto input_row = [&](int tl, int64_t* rb, int64_t* rt) {  // as kernel 1's
    const int64_t tok = t0 + tl;
    *rb = p.varlen ? 0 : p.div.T.div(static_cast<uint32_t>(tok));
    *rt = p.varlen ? tok : tok - *rb * p.T;
  };

  // 1. The rows, by one thread (its arrival carries the byte count, so the barrier's
  // phase cannot complete before every copy is issued).
  if (tid == 0) mbar_init(bar, 1);
  __syncthreads();
  if (tid == 0) {
    mbar_arrive_expect(bar, static_cast<uint32_t>(nt * (krow + vrow + qrow) * sizeof(T)));
    for (int tl = 0; tl < nt; ++tl) {
      int64_t rb, rt;
      input_row(tl, &rb, &rt);
      bulk_load(ks + tl * krow, kin + rb * p.k_stride[0] + rt * p.k_stride[1], krow * sizeof(T), bar);
      bulk_load(vs + tl * vrow, vin + rb * p.v_stride[0] + rt * p.v_stride[1], vrow * sizeof(T), bar);
      if (qrow) bulk_load(qs + tl * qrow, qio + rb * p.q_stride[0] + rt * p.q_stride[1], qrow * sizeof(T), bar);
    }
  }

  // 2. Slots and sin/cos while the rows arrive.
  append_slots_and_sincos(p, tb, t0, nt);
  mbar_wait(bar, 0);

  // 3. V to its slot as loaded; K's and Q's rotary chunks rotated in shared memory. fp8:
  // kernel 1's items (K rotary, K pass-through, V, Q rotary) from the staged rows, K and V
  // quantized into k8 / v8 (store_fp8_item, the same expression as kernel 1).
  using C = std::conditional_t<kFp8, uint8_t, T>;  // cache element
  C* kc = static_cast<C*>(p.cache.k);
  C* vc = static_cast<C*>(p.cache.v);
  const C* k_out_rows = kFp8 ? reinterpret_cast<const C*>(k8) : reinterpret_cast<const C*>(ks);
  const C* v_out_rows = kFp8 ? reinterpret_cast<const C*>(v8) : reinterpret_cast<const C*>(vs);
  const int Dv = static_cast<int>(p.Dv);
  const int64_t kc_h = p.cache.k_stride[2], vc_h = p.cache.v_stride[2];
  const int nhk = Hk == 1 || kc_h == D ? 1 : Hk, nhv = Hk == 1 || vc_h == Dv ? 1 : Hk;  // stores per row
  const int nh = max(nhk, nhv);
  // Store h of token tl's K (or V) row: the whole row (adjacent heads) or head h's part.
  auto store_k = [&](int tl, int h) {
    if (h < nhk && tb.slots[tl].k_out >= 0)
      bulk_store(kc + tb.slots[tl].k_out + h * kc_h, k_out_rows + tl * krow + h * D, (nhk == 1 ? krow : D) * sizeof(C));
  };
  auto store_v = [&](int tl, int h) {
    if (h < nhv && tb.slots[tl].v_out >= 0)
      bulk_store(vc + tb.slots[tl].v_out + h * vc_h, v_out_rows + tl * vrow + h * Dv, (nhv == 1 ? vrow : Dv) * sizeof(C));
  };
  if (!kFp8)
    for (int e = tid; e < nt * nhv; e += blockDim.x) store_v(e / nhv, e % nhv);
  // Chunk d0 (and, neox, its partner R/2 later) of a K or Q head row in shared memory,
  // rotated in place with token tl's sin/cos.
  auto rotate_staged = [&](T* head_row, int tl, int d0) {
    T* chunk = head_row + d0;
    const int i0 = tl * half + (kInterleaved ? d0 / 2 : d0);
    VecT a = load_vec<VecT>(chunk), b;
    if (!kInterleaved) b = load_vec<VecT>(chunk + half);
    float sn[P], cs[P];
    load_table<P>(tb.sin_tab + i0, sn);
    load_table<P>(tb.cos_tab + i0, cs);
    rotate_chunk<T, kInterleaved>(a, b, sn, cs);
    store_vec(chunk, a);
    if (!kInterleaved) store_vec(chunk + half, b);
  };
  if constexpr (kFp8) {
    const KVCacheView& cv = p.cache;
    const AppendItems items = append_items(p, V);
    for (int it = tid; it < nt * items.per_tok; it += blockDim.x) {
      const int tl = p.div.per_tok.div(it);
      const AppendItem m = append_item(p, items, it - tl * items.per_tok, V);
      if (m.kind == 3) {  // Q: rotated in place, its own dtype
        rotate_staged(qs + tl * qrow + m.h * D, tl, m.d0);
        continue;
      }
      VecT a, b;
      if (m.kind == 2) {  // V: quantized
        a = load_vec<VecT>(vs + tl * vrow + m.h * Dv + m.d0);
        store_fp8_item<kInterleaved, V, P>(v8 + tl * vrow + m.h * Dv + m.d0, half, a, b, false, nullptr, nullptr,
                                           cv.v_scale[m.h * cv.v_scale_stride], true);
      } else {  // K: rotary items rotated in fp32 (both halves), pass-through chunks as they are
        const bool rot = m.kind == 0;
        const T* src = ks + tl * krow + m.h * D + m.d0;
        a = load_vec<VecT>(src);
        if (rot && !kInterleaved) b = load_vec<VecT>(src + half);
        const int i0 = tl * half + (kInterleaved ? m.d0 / 2 : m.d0);
        store_fp8_item<kInterleaved, V, P>(k8 + tl * krow + m.h * D + m.d0, half, a, b, rot, tb.sin_tab + i0,
                                           tb.cos_tab + i0, cv.k_scale[m.h * cv.k_scale_stride], true);
      }
    }
  } else {  // K's (if rotate_k) and Q's rotary chunks
    const int n_rot = rot_chunks(r, V);
    const int nrk = p.rotate_k ? Hk * n_rot : 0, per = nrk + (qrow ? Hq * n_rot : 0);
    for (int it = tid; it < nt * per; it += blockDim.x) {
      const int tl = p.div.rot_tok.div(it);
      const int w = it - tl * per;
      const bool is_k = w < nrk;
      const int wh = is_k ? w : w - nrk;
      const int h = p.div.n_rot.div(wh), c = wh - h * n_rot;
      rotate_staged((is_k ? ks + tl * krow : qs + tl * qrow) + h * D, tl, c * V);  // chunk c starts at c * V
    }
  }
  fence_proxy_async_smem();  // the rotated rows, visible to the bulk stores below
  __syncthreads();
  for (int e = tid; e < nt * nh; e += blockDim.x) {
    const int tl = e / nh, h = e - tl * nh;
    store_k(tl, h);
    if (kFp8) store_v(tl, h);
    if (qrow && h == 0) {
      int64_t rb, rt;
      input_row(tl, &rb, &rt);
      bulk_store(qio + rb * p.q_stride[0] + rt * p.q_stride[1], qs + tl * qrow, qrow * sizeof(T));
    }
  }
  if (tid < nt * nh) bulk_store_drain();  // shared memory stays until the copies have read it
#endif
}

// ---------------------------------------------------------------- 1c. append_kv, lean
// Small calls (auto's choice below 2 tokens per SM, where the common case applies:
// rotary_dim = D = v's head dim, K rotated, frequencies as a tensor, 16-byte aligned
// unit-stride rows, batched or up to 31 packed sequences). Kernels 1 and 1b spend a
// small call's time on their block structure: a 1 KB parameter block (RopeParams and
// its frequency table) read in dependent steps, the slot and sin/cos phases behind
// barriers, then the stores (ncu at T = 16: barrier and constant-miss stalls first).
// Here, as the rope op's lean kernel (variant 6): one thread per 8- or 4-byte chunk (W;
// and, neox, its partner R/2 later) of one row of one token, rows = K heads, V heads, Q heads;
// its own small params, the hot fields first; every load of the thread (its input
// chunks, the sequence's cache length, its P frequencies, the position) goes out
// before any is used, so the chain is the parameters, one DRAM round trip, the P
// sin/cos, (paged: the block id) and the stores. No shared memory, no barrier.
// Packed sequences: lane l loads cu_seqlens[l], cache_seqlens[l] (and offsets[l]) in
// the same round trip, and the warp finds the token's sequence by a ballot (kernel 1's
// search went sector after sector).
// The sin/cos and the rotation are variant 6's (angle_sincos_chunk, rotate_chunk) and
// the fp8 store kernel 1's (store_fp8_item): the caches and q are bit-equal to kernel 1's.
// Parameters by constant line (64 bytes; they start at 0x210 of bank 0, so the first
// line also holds the load descriptor at 0x208, which every kernel reads): bytes 0-47
// hold the pointers of the first loads, bytes 48-111 their strides and the launch
// shape, so a call without position tensors or fp8 scales waits for two cold lines
// before its first loads (the layout before, the fields in declaration order, spread
// them over four); bytes 112-175 the offset and the stores' fields; bytes 176-239 what
// only some calls load with the first loads (position tensors, fp8 scales); then the
// block table, read after the index round trip. Flags: kAL*.
enum : uint16_t {
  kALLen64 = 1, kALCu64 = 2, kALPos = 4, kALPos64 = 8, kALOff = 16, kALOff64 = 32, kALPaged = 64, kALBt64 = 128,
};
struct AppendLeanParams {
  // bytes 0-47: the first loads' pointers
  const void* in[3];        // k, v, q
  const void* seqlens;      // cache_seqlens [B]
  const void* cu_seqlens;   // varlen: [B + 1]
  const float* inv_freq;
  // bytes 48-111: their strides (elements) and the launch shape
  int32_t in_s[3][3];       // k, v, q: row b, row t, head
  int32_t seqlens_stride, cu_stride, inv_freq_stride;
  uint16_t rows;            // 2 * Hk + Hq (unsigned: no sign-extension PRMT after the load)
  uint16_t Hk;
  uint16_t half;            // R / 2
  uint16_t nseq;            // packed sequences (varlen), or 0: batched (b = blockIdx.z, j = blockIdx.y)
  uint8_t cshift;           // log2(chunks per row)
  uint8_t rows_per_block;   // RB
  uint16_t flags;           // kAL*
  int32_t capacity;         // slots per sequence
  // bytes 112-175: the offset, the stores
  int64_t offset;           // without an offsets tensor
  void* cache[2];           // k_cache, v_cache
  int32_t cache_s[2][3];    // dim 0 (sequence or block), dim 1 (slot), head
  float sin_scale, cos_scale;
  int32_t block_size, num_blocks;  // paged (kALPaged)
  // bytes 176-239: loaded with the first loads where the call has them
  const void* positions;    // [row_b * pos_stride_b + row_t * pos_stride] (kALPos)
  const void* offsets;      // [b] (kALOff)
  const float* scale[2];    // fp8: k_scale, v_scale
  int32_t pos_stride, pos_stride_b, off_stride;
  int32_t scale_stride[2];  // fp8: per kv head 1, per tensor 0
  int32_t bt_stride_b, bt_stride;
  // bytes 240-: after the index round trip
  const void* block_table;
};
static_assert(offsetof(AppendLeanParams, in_s) == 48 && offsetof(AppendLeanParams, offset) == 112 &&
                  offsetof(AppendLeanParams, positions) == 176 && offsetof(AppendLeanParams, block_table) == 240,
              "AppendLeanParams: the constant-line layout above");

// W: the chunk's bytes (8, or 4: half the pairs a thread, so half the sin/cos on its
// chain; launch_append_lean's note has the measurements).
template <typename T, bool kInterleaved, bool kFp8, int W>
__global__ void __launch_bounds__(128) append_kv_lean_kernel(const __grid_constant__ AppendLeanParams p) {
  constexpr int V = W / static_cast<int>(sizeof(T));  // elements per chunk
  constexpr int P = kInterleaved ? V / 2 : V;          // pairs per chunk
  static_assert(P >= 1, "a chunk holds at least one pair");
  using VecT = Vec<T, V>;
  using Word = typename LeanWord<W>::type;
  const uint32_t fl = p.flags;
  const int c = threadIdx.x & ((1 << p.cshift) - 1);
  const int r = blockIdx.x * p.rows_per_block + (threadIdx.x >> p.cshift);
  const bool live = r < p.rows;  // a row past the end still takes part in the warp's ballot
  const int kind = r < p.Hk ? 0 : r < 2 * p.Hk ? 1 : 2;  // K, V, Q
  const int h = kind == 0 ? r : kind == 1 ? r - p.Hk : r - 2 * p.Hk;
  const int d0 = c * V, d1 = d0 + p.half;

  // 1. Every load first: the input chunks (rows need only the grid), the frequencies,
  //    the position, the sequence's length (and start, and offset), the fp8 scale; all
  //    kept raw until every one is in flight.
  const int64_t row_b = p.nseq ? 0 : blockIdx.z, row_t = blockIdx.y;
  // Selects, not p.in[kind] (variant 6's note; kernel 1d, which indexed them at run time,
  // launch_append_lean's note, was not faster).
  auto pick = [&](auto x0, auto x1, auto x2) { return kind == 0 ? x0 : kind == 1 ? x1 : x2; };
  const T* src = static_cast<const T*>(pick(p.in[0], p.in[1], p.in[2])) +
                 row_b * pick(p.in_s[0][0], p.in_s[1][0], p.in_s[2][0]) +
                 row_t * pick(p.in_s[0][1], p.in_s[1][1], p.in_s[2][1]) +
                 int64_t(h) * pick(p.in_s[0][2], p.in_s[1][2], p.in_s[2][2]);
  Word xa{}, xb{};
  if (live) {
    xa = *reinterpret_cast<const Word*>(src + d0);
    if (!kInterleaved) xb = *reinterpret_cast<const Word*>(src + d1);
  }
  const bool rot = live && kind != 1;
  float f[P];
  if (rot) {
#pragma unroll
    for (int e = 0; e < P; ++e) f[e] = p.inv_freq[(c * P + e) * static_cast<int64_t>(p.inv_freq_stride)];
  }
  const bool has_pos = fl & kALPos, has_off = fl & kALOff;
  RawIndex pos_r, len_r, cu_r, off_r;
  if (rot && has_pos) pos_r = load_raw_index(p.positions, row_b * p.pos_stride_b + row_t * p.pos_stride, fl & kALPos64);
  const int lane = threadIdx.x & 31;
  if (p.nseq) {  // lane l: sequence l's start, cache length and offset
    if (lane <= p.nseq) cu_r = load_raw_index(p.cu_seqlens, int64_t(lane) * p.cu_stride, fl & kALCu64);
    if (lane < p.nseq) {
      len_r = load_raw_index(p.seqlens, int64_t(lane) * p.seqlens_stride, fl & kALLen64);
      if (has_off) off_r = load_raw_index(p.offsets, int64_t(lane) * p.off_stride, fl & kALOff64);
    }
  } else {
    len_r = load_raw_index(p.seqlens, row_b * p.seqlens_stride, fl & kALLen64);
    if (has_off) off_r = load_raw_index(p.offsets, row_b * p.off_stride, fl & kALOff64);
  }
  float scale = 1.0f;
  if constexpr (kFp8) {
    if (live && kind != 2) scale = kind == 0 ? p.scale[0][h * p.scale_stride[0]] : p.scale[1][h * p.scale_stride[1]];
  }
  int64_t b = row_b, j = row_t, len = raw_index(len_r, fl & kALLen64), off = raw_index(off_r, fl & kALOff64);
  if (p.nseq) {  // the token's sequence by ballot (seq_of_token's rule: the last n < nseq with cu[n] <= t, 0 if none)
    const unsigned mask = blockDim.x >= 32 ? 0xffffffffu : (1u << blockDim.x) - 1u;
    const int64_t cu_l = raw_index(cu_r, fl & kALCu64);
    const unsigned ball = __ballot_sync(mask, lane < p.nseq && cu_l <= row_t);
    const int n = ball ? 31 - __clz(ball) : 0;
    b = n;
    j = row_t - __shfl_sync(mask, cu_l, n);
    len = __shfl_sync(mask, len, n);
    off = __shfl_sync(mask, off, n);
  }
  if (!live) return;
  const int64_t idx = len + j;  // the token's cache index
  // attn_position's rule: positions, else the cache index + the offset
  const int64_t pos = has_pos ? raw_index(pos_r, fl & kALPos64) : idx + (has_off ? off : p.offset);

  // 2. sin/cos of the chunk's pairs, the rotation (K, Q).
  VecT va, vb;
  *reinterpret_cast<Word*>(&va) = xa;
  *reinterpret_cast<Word*>(&vb) = xb;
  float sn[P], cs[P];
  if (rot) {
    angle_sincos_chunk<P>(pos, f, sn, cs);
#pragma unroll
    for (int e = 0; e < P; ++e) {
      sn[e] *= p.sin_scale;
      cs[e] *= p.cos_scale;
    }
    if (!kFp8 || kind == 2) rotate_chunk<T, kInterleaved>(va, vb, sn, cs);
  }
  if (kind == 2) {  // Q: in place
    T* dst = const_cast<T*>(src);
    *reinterpret_cast<Word*>(dst + d0) = *reinterpret_cast<const Word*>(&va);
    if (!kInterleaved) *reinterpret_cast<Word*>(dst + d1) = *reinterpret_cast<const Word*>(&vb);
    return;
  }

  // 3. K / V into the token's slot (cache_slot's rule: a slot that does not exist is dropped).
  if (idx < 0 || idx >= p.capacity) return;
  int64_t d0c = b, d1c = idx;
  if (fl & kALPaged) {
    const int64_t n = div_small(idx, p.block_size);
    d0c = raw_index(load_raw_index(p.block_table, b * p.bt_stride_b + n * p.bt_stride, fl & kALBt64), fl & kALBt64);
    if (d0c < 0 || d0c >= p.num_blocks) return;
    d1c = idx - n * p.block_size;
  }
  const bool is_k = kind == 0;
  const int64_t at = d0c * (is_k ? p.cache_s[0][0] : p.cache_s[1][0]) + d1c * (is_k ? p.cache_s[0][1] : p.cache_s[1][1]) +
                     int64_t(h) * (is_k ? p.cache_s[0][2] : p.cache_s[1][2]);
  void* cache = is_k ? p.cache[0] : p.cache[1];
  if constexpr (kFp8) {
    uint8_t* row = static_cast<uint8_t*>(cache) + at;
    if (kind == 0) {
      store_fp8_item<kInterleaved, V, P>(row + d0, p.half, va, vb, true, sn, cs, scale, true);
    } else {
      store_fp8_item<kInterleaved, V, P>(row + d0, p.half, va, vb, false, nullptr, nullptr, scale, true);
      if (!kInterleaved) store_fp8_item<kInterleaved, V, P>(row + d1, p.half, vb, va, false, nullptr, nullptr, scale, true);
    }
  } else {
    T* row = static_cast<T*>(cache) + at;
    *reinterpret_cast<Word*>(row + d0) = *reinterpret_cast<const Word*>(&va);
    if (!kInterleaved) *reinterpret_cast<Word*>(row + d1) = *reinterpret_cast<const Word*>(&vb);
  }
}

// ---------------------------------------------------------------- 2 / 3. decode
constexpr int kDecodeThreads = 128;
constexpr int kDecodeFeatures = 8;  // per lane: one 16-byte load of fp16/bf16

// Keys in flight per slot (loads issued before their first use): fewer with more rows,
// whose accumulators take the registers.
template <int kRows>
constexpr int decode_keys_in_flight() { return kRows <= 4 ? 4 : 2; }

// CTAs per SM the register allocation must allow (__launch_bounds__).
template <int kRows, bool kFullFusion>
constexpr int decode_min_ctas() { return kRows <= 4 ? (kFullFusion ? 3 : 4) : 2; }

template <int D, int kRows>
constexpr size_t decode_smem_bytes() {
  constexpr int L = D / kDecodeFeatures, S = kDecodeThreads / L;
  constexpr size_t q = sizeof(float) * kRows * D;
  constexpr size_t merge = sizeof(float) * (2 * S * kRows + S * kRows * D);
  return q > merge ? q : merge;
}

template <typename T>
__device__ __forceinline__ void chunk_to_float(const Vec<T, kDecodeFeatures>& c, float* f) {
#pragma unroll
  for (int e = 0; e < kDecodeFeatures; ++e) f[e] = static_cast<float>(c.v[e]);
}

// Full fusion: rotates this lane's 8 features of a key at `pos` (all lanes of the warp
// call it: neox partners live in another lane, reached by shuffles). lane: the lane's
// index within its key slot; warp_base: the warp lane of the slot's lane 0.
template <typename T>
__device__ __forceinline__ void rotate_key_chunk(const RopeParams& r, const Vec<T, kDecodeFeatures>& raw, float* kf,
                                                 int lane, int warp_base, int64_t pos, const float* freq) {
  const int half = r.R / 2;
  if (!r.interleaved) {
    const int hc = half / kDecodeFeatures;  // chunks per rotary half
    const bool first = lane < hc, second = !first && lane < 2 * hc;
    const int partner = first ? lane + hc : second ? lane - hc : lane;
    uint4 u = *reinterpret_cast<const uint4*>(&raw), pu;
    pu.x = __shfl_sync(0xffffffffu, u.x, warp_base + partner);
    pu.y = __shfl_sync(0xffffffffu, u.y, warp_base + partner);
    pu.z = __shfl_sync(0xffffffffu, u.z, warp_base + partner);
    pu.w = __shfl_sync(0xffffffffu, u.w, warp_base + partner);
    if (!first && !second) return;
    Vec<T, kDecodeFeatures> pv;
    *reinterpret_cast<uint4*>(&pv) = pu;
    const int i0 = (first ? lane : lane - hc) * kDecodeFeatures;
#pragma unroll
    for (int e = 0; e < kDecodeFeatures; ++e) {
      float sn, cs;
      pair_sincos(r, pos, i0 + e, freq[e], &sn, &cs);
      const float own = kf[e], other = static_cast<float>(pv.v[e]);
      kf[e] = first ? rot_y0(own, other, cs, sn) : rot_y1(other, own, cs, sn);
    }
  } else {
    if (lane * kDecodeFeatures >= r.R) return;
#pragma unroll
    for (int e = 0; e < kDecodeFeatures / 2; ++e) {
      float sn, cs;
      pair_sincos(r, pos, lane * (kDecodeFeatures / 2) + e, freq[e], &sn, &cs);
      const float x0 = kf[2 * e], x1 = kf[2 * e + 1];
      kf[2 * e] = rot_y0(x0, x1, cs, sn);
      kf[2 * e + 1] = rot_y1(x0, x1, cs, sn);
    }
  }
}

template <typename T, int D, int kRows, bool kFullFusion>
__global__ void __launch_bounds__(kDecodeThreads, decode_min_ctas<kRows, kFullFusion>()) decode_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int E = kDecodeFeatures;
  constexpr int L = D / E;                 // lanes per key: 8, 16, 32
  constexpr int S = kDecodeThreads / L;    // key slots per CTA
  constexpr int N = decode_keys_in_flight<kRows>();
  static_assert(L <= 32 && (L & (L - 1)) == 0, "lanes per key: a power of two within a warp");
  using Chunk = Vec<T, E>;
  constexpr float kLog2e = 1.4426950408889634f;
  const float ninf = -INFINITY;
  const RopeParams& r = p.rope;

  const int split = blockIdx.x % p.num_splits, rg = blockIdx.x / p.num_splits;
  const int hk = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int tid = threadIdx.x, slot = tid / L, lane = tid % L;
  const int warp_base = (tid & 31) - lane;
  const int rows_total = static_cast<int>(p.G * p.q_len);
  const int row0 = rg * p.rows_per_group;
  const int nrows = min(p.rows_per_group, rows_total - row0);
  const int64_t seqlen = decode_seqlen(p, b);
  const int G = static_cast<int>(p.G);

  extern __shared__ float4 decode_smem[];
  float* sm = reinterpret_cast<float*>(decode_smem);

  // Q: load (any strides), rotate in fp32 at its position, scale; into registers.
  float* qs = sm;  // [kRows][D]
  for (int e = tid; e < kRows * D; e += kDecodeThreads) {
    const int rr = e / D, d = e - rr * D;
    float x = 0.f;
    if (rr < nrows) {
      const int row = row0 + rr, j = row / G, hq = hk * G + (row - j * G);
      x = static_cast<float>(static_cast<const T*>(p.q)[b * p.q_stride[0] + j * p.q_stride[1] + hq * p.q_stride[2] +
                                                         d * p.q_stride[3]]);
    }
    qs[e] = x;
  }
  __syncthreads();
  const int half = r.R / 2;
  for (int e = tid; e < nrows * half; e += kDecodeThreads) {
    const int rr = e / half, i = e - rr * half;
    const int j = (row0 + rr) / G;
    float sn, cs;
    pair_sincos(r, attn_position(r, b, j, b, seqlen - p.q_len + j), i, inv_freq_of(r, i), &sn, &cs);
    int d0, d1;
    pair_dims(r, i, &d0, &d1);
    const float x0 = qs[rr * D + d0], x1 = qs[rr * D + d1];
    qs[rr * D + d0] = rot_y0(x0, x1, cs, sn);
    qs[rr * D + d1] = rot_y1(x0, x1, cs, sn);
  }
  __syncthreads();
  const float qscale = p.softmax_scale * kLog2e;  // scores in log2 units: exp2 below
  float q[kRows][E];
  // Key indices are 32-bit (the host keeps the capacity at most 2^31 - 4096: headroom for
  // per_split's rounding and the loop's last step); element offsets into the caches stay
  // 64-bit (cache_slot).
  int lim[kRows];  // keys row rr may see
  int n_keys = 0;
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
#pragma unroll
    for (int e = 0; e < E; ++e) q[rr][e] = qs[rr * D + lane * E + e] * qscale;
    lim[rr] = 0;
    if (rr < nrows) {
      const int64_t n = decode_key_limit(p, seqlen, (row0 + rr) / G);
      lim[rr] = n > 0 ? static_cast<int>(n) : 0;
      n_keys = max(n_keys, lim[rr]);
    }
  }
  __syncthreads();  // qs is reused by the merge below

  // This split's keys: [kbeg, kend) of [0, n_keys).
  const int per_split = (n_keys + p.num_splits - 1) / p.num_splits;
  const int kbeg = static_cast<int>(min(static_cast<int64_t>(n_keys), static_cast<int64_t>(split) * per_split));
  const int kend = static_cast<int>(min(static_cast<int64_t>(n_keys), static_cast<int64_t>(kbeg) + per_split));

  float freq[E];  // full fusion: this lane's frequencies
  if (kFullFusion) {
    const int i0 = r.interleaved ? lane * (E / 2) : (lane % max(1, half / E)) * E;
#pragma unroll
    for (int e = 0; e < E; ++e) freq[e] = (i0 + e < half) ? inv_freq_of(r, i0 + e) : 0.f;
  }

  float m[kRows], l[kRows], acc[kRows][E];
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    m[rr] = ninf;
    l[rr] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[rr][e] = 0.f;
  }
  const T* kc = static_cast<const T*>(p.cache.k) + hk * p.cache.k_stride[2] + lane * E;
  const T* vc = static_cast<const T*>(p.cache.v) + hk * p.cache.v_stride[2] + lane * E;

  for (int base = kbeg; base < kend; base += S * N) {
    Chunk kr[N], vr[N];
    int key[N];
    bool ok[N];
#pragma unroll
    for (int n = 0; n < N; ++n) {
      key[n] = base + n * S + slot;
      int64_t ko = 0, vo = 0;
      ok[n] = key[n] < kend && cache_slot(p.cache, b, key[n], &ko, &vo);
      if (ok[n]) {
        kr[n] = load_vec<Chunk>(kc + ko);
        vr[n] = load_vec<Chunk>(vc + vo);
      } else {
        *reinterpret_cast<uint4*>(&kr[n]) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(&vr[n]) = make_uint4(0, 0, 0, 0);
      }
    }
    float s[N][kRows];
#pragma unroll
    for (int n = 0; n < N; ++n) {
      float kf[E];
      chunk_to_float(kr[n], kf);
      if (kFullFusion) rotate_key_chunk<T>(r, kr[n], kf, lane, warp_base, attn_position(r, 0, 0, b, key[n]), freq);
#pragma unroll
      for (int rr = 0; rr < kRows; ++rr) {
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) dot = fmaf(q[rr][e], kf[e], dot);
#pragma unroll
        for (int off = L / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        s[n][rr] = (ok[n] && key[n] < lim[rr]) ? dot : ninf;
      }
    }
    // Online softmax per row over the N new scores.
#pragma unroll
    for (int rr = 0; rr < kRows; ++rr) {
      float mx = m[rr];
#pragma unroll
      for (int n = 0; n < N; ++n) mx = fmaxf(mx, s[n][rr]);
      if (mx == ninf) continue;  // nothing seen yet
      const float alpha = exp2f(m[rr] - mx);  // 0 when m was -inf
      float pn[N], psum = 0.f;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        pn[n] = exp2f(s[n][rr] - mx);  // 0 for a masked key
        psum += pn[n];
      }
      l[rr] = l[rr] * alpha + psum;
      m[rr] = mx;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        float a = acc[rr][e] * alpha;
#pragma unroll
        for (int n = 0; n < N; ++n) a = fmaf(pn[n], static_cast<float>(vr[n].v[e]), a);
        acc[rr][e] = a;
      }
    }
  }

  // Merge the S slots' states: shared [S][kRows] max and sum, [S][kRows][D] accumulators.
  float* ms = sm;
  float* ls = ms + S * kRows;
  float* accs = ls + S * kRows;
#pragma unroll
  for (int rr = 0; rr < kRows; ++rr) {
    if (lane == 0) {
      ms[slot * kRows + rr] = m[rr];
      ls[slot * kRows + rr] = l[rr];
    }
    float4* dst = reinterpret_cast<float4*>(accs + (slot * kRows + rr) * D + lane * E);
    dst[0] = make_float4(acc[rr][0], acc[rr][1], acc[rr][2], acc[rr][3]);
    dst[1] = make_float4(acc[rr][4], acc[rr][5], acc[rr][6], acc[rr][7]);
  }
  __syncthreads();
  merge_and_write_rows<T, S, kRows>(p, ms, ls, accs, D, nrows, row0, hk, b, split, tid, kDecodeThreads);
}

// ---------------------------------------------------------------- 4. combine
constexpr int kCombineThreads = 256;  // 8 warps: 8 / W output rows of W warps each

// W warps per (b, query token, head), each loading kLoads splits' partial rows at once
// (W = 1 << p.log2_warps and kLoads: the host's combine_shape, attention_dispatch.cu):
// warp w of a row takes splits w, w + W, ..., lane l features 4l .. 4l + 3 (+ 128 for
// D = 256: kH = 2). Every load of a warp (its splits' partial rows and lse) is issued
// before any is used: one L2 round trip per kLoads * W splits. Each warp merges its
// splits against its own max (online across rounds); with W > 1 the row's first warp
// merges the W results (weights exp2(m_w - max)) from shared memory and writes the row.
// History: the first version looped over the splits inside a loop over the features
// (B = 1, 7-28 splits: 10-14 us for a 0.1 MB read); one warp per row with the first 32
// splits' rows prefetched took one round trip up to 32 splits but one more per 8 splits
// after that: ncu (fifth session of 2026-11-26, MQA B = 1 ctx 32768, its 8 rows in 2 CTAs)
// 5.8 us at 32 splits, 15.7 at 64, against the decode kernel's 23.4 / 15.9 / 12.6 at 32 /
// 64 / 128 splits: the combine, not the decode, held few kv heads at 32 splits. (A first
// version of this one read the row's lse for the max before the partial rows: two round
// trips, ~3 us more at B = 1 ctx 32768 with 31 splits, run C of that session.) kLoads was
// 16 for every split count (12 of 16 loads repeated the last row at 4 splits): 4 / 8 / 16
// now, by the A/B beside combine_shape (a one-warp form of 32 loads, 219 registers, was
// never ahead there). With W = 1 the shared-memory merge and its barrier are skipped.
// Launched as a programmatic dependent of the decode kernel where the GPU has PDL: it
// waits for it here.
template <typename T, int kH, int kLoads>
__global__ void __launch_bounds__(kCombineThreads, 1) decode_combine_kernel(const __grid_constant__ CombineParams p) {
  static_assert(kLoads <= 16, "one split's lse per lane (lanes k and k + kLoads, ...)");
  constexpr int kWarpsPerCta = kCombineThreads / 32;
  __shared__ float4 part_o[kWarpsPerCta][32 * kH];
  __shared__ float part_m[kWarpsPerCta], part_l[kWarpsPerCta];
  // Everything before the wait (params, indices) overlaps the decode kernel under PDL.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int lw = p.log2_warps, W = 1 << lw, wp = warp & (W - 1);  // this warp's part of its row
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kWarpsPerCta >> lw) + (warp >> lw);  // (b, j, hq)
  const int D = p.D, ns = p.num_splits;
  const bool live = row < p.B * p.q_len * p.Hq;
  const int64_t hq = row % p.Hq, j = (row / p.Hq) % p.q_len, b = row / (p.Hq * p.q_len);
  const int64_t w0 = ((b * p.Hq + hq) * p.q_len + j) * ns;
  const float* lse = p.ws_lse + w0;
  const float* ws = p.ws_o + w0 * D;
  const float ninf = -INFINITY;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if (W == 1 && !live) return;  // (W > 1: every thread reaches the barrier below)
  float4 acc[kH];
#pragma unroll
  for (int h = 0; h < kH; ++h) acc[h] = zero;
  float m = ninf, lsum = 0.f;  // this warp's max and sum of exp2(lse_s - m) (NaN: a NaN split)
  if (live) {
    for (int s0 = wp; s0 < ns; s0 += W * kLoads) {
      // Unconditional loads (the last split's row again past ns, features clamped), the
      // misses replaced after; lane k (and k + kLoads, ...) holds split k's lse, as the
      // previous kernel did. With each lane loading all the lse values (a register max, no
      // shuffle) the compiler put the partial rows' loads after the max: two round trips
      // (SASS of the fifth session of 2026-11-26).
      float4 v[kLoads][kH];
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const int sc = min(s0 + k * W, ns - 1);
#pragma unroll
        for (int h = 0; h < kH; ++h)
          v[k][h] = *reinterpret_cast<const float4*>(ws + static_cast<int64_t>(sc) * D + min(4 * lane + 128 * h, D - 4));
      }
      const int sl = s0 + (lane % kLoads) * W;
      float ll = lse[min(sl, ns - 1)];
      if (sl >= ns) ll = ninf;
      float mb = fmaxf(m, ll);  // fmaxf drops NaN; its weight is NaN below
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, off));
      const float scale = m == ninf ? 0.f : exp2f(m - mb);
      lsum *= scale;
#pragma unroll
      for (int h = 0; h < kH; ++h) scale4(acc[h], scale);
      m = mb;
      const float wl = ll == ninf ? 0.f : exp2f(ll - m);  // an empty split (or past ns) weighs 0
#pragma unroll
      for (int k = 0; k < kLoads; ++k) {
        const float w = __shfl_sync(0xffffffffu, wl, k);
        lsum += w;
        if (s0 + k * W < ns) {
#pragma unroll
          for (int h = 0; h < kH; ++h) fma4(acc[h], w, v[k][h]);
        }
      }
    }
  }
  float M = m;
  bool nan = isnan(lsum);
  if (W > 1) {
#pragma unroll
    for (int h = 0; h < kH; ++h) part_o[warp][lane * kH + h] = acc[h];
    if (lane == 0) {
      part_m[warp] = m;
      part_l[warp] = lsum;
    }
    __syncthreads();
    if (!live || wp != 0) return;
    for (int w = 1; w < W; ++w) {
      M = fmaxf(M, part_m[warp + w]);
      nan |= isnan(part_l[warp + w]);
    }
  }
  T* o = static_cast<T*>(p.o) + row * D;
  if (M == ninf && !nan) {  // no key in any split
    for (int d = lane; d < D; d += 32) o[d] = static_cast<T>(0.f);
    if (lane == 0) p.lse[row] = ninf;
    return;
  }
  if (W > 1) {
    // The W parts against the row's max (a NaN part makes the row NaN, as its lse would).
    const float f0 = m == ninf ? 0.f : exp2f(m - M);
    lsum *= f0;
#pragma unroll
    for (int h = 0; h < kH; ++h) scale4(acc[h], f0);
    for (int w = 1; w < W; ++w) {
      const float mw = part_m[warp + w];
      const float f = mw == ninf ? 0.f : exp2f(mw - M);
      lsum = fmaf(part_l[warp + w], f, lsum);
#pragma unroll
      for (int h = 0; h < kH; ++h) fma4(acc[h], f, part_o[warp + w][lane * kH + h]);
    }
  }
  if (nan) lsum = __int_as_float(0x7fffffff);
  const float inv = 1.f / lsum;
#pragma unroll
  for (int h = 0; h < kH; ++h) {
    const int d = 4 * lane + 128 * h;
    if (d < D) {
      o[d] = static_cast<T>(acc[h].x * inv);
      o[d + 1] = static_cast<T>(acc[h].y * inv);
      o[d + 2] = static_cast<T>(acc[h].z * inv);
      o[d + 3] = static_cast<T>(acc[h].w * inv);
    }
  }
  if (lane == 0) p.lse[row] = (M + log2f(lsum)) * 0.6931471805599453f;
}

}  // namespace cuda
}  // namespace rope_ext
