// The CUDA kernels of the fused per-head RMSNorm + RoPE (the math: norm_rope_params.h).
// One template, two numbered variants by access width:
//
//   1. warp  V = 1: scalar loads of any feature stride; a team of up to 32 threads
//            (a warp for D >= 64) per row. The fallback for every view.
//   2. tile  V = 16 bytes / element: each thread loads 16-byte chunks. Needs unit
//            feature stride, 16-byte aligned rows and (D - R) in whole chunk pairs
//            (norm_rope_tile_eligible). auto's choice when it applies.
//
// Both take the shape of rope variant 4 (the tile kernel), which is what made the
// plain RoPE reach the copy bandwidth (rope_variants.cuh): a block owns a tile of
// consecutive rows (token-group-major) and exits. The block fills a shared table of
// sin/cos for the tile's token groups and the fp32 weights (+ offset), one barrier;
// then each team of TPR threads takes whole rows: reduces mean(x^2) with shuffles
// inside the team, normalises, rotates from the table and stores. The tile variant
// streams its rows through a per-thread cp.async ring in shared memory (kRing: 2-4 rows
// in flight per team, the first ones issued before the table); without it (the knob's
// depth 1) the 16-bit instances (kAhead) keep the next row's loads in registers, and fp32
// and the scalar variant load each row after the barrier and the previous row's stores.
// A row is read once and written once; sin/cos are computed once per (token, pair) and
// tile, not per head. The tile sizes and ring depths (norm_rope_dispatch.cu) were
// measured.
//
// Work unit: V pairs of the rotary part (neox: V features of each half; GPT-J: 2V
// consecutive features), or 2V consecutive pass-through features of [R, D). Unit u
// covers pairs [uV, uV + V) in both conventions. Lane l of a team owns units
// l, l + TPR, ...: the same features for every row it handles, so the backward's
// dw partial sums stay in registers until the block reduces them in shared memory
// and writes one [D] row per block (norm_rope_dw_sum_kernel sums the rows).
#pragma once
#include <type_traits>

#include "../norm_rope_params.h"
#include "primitives.cuh"  // Vec, pin_word, load_table, fill_sincos_table

namespace rope_ext {
namespace cuda {

constexpr int kNormRopeThreads = 256;

// Launch shape, chosen on the host (norm_rope_dispatch.cu).
struct NormRopeShape {
  int64_t rows;          // rows per block (the tile)
  int32_t table_stride;  // floats per table (cos, then sin)
  int32_t tpr;           // threads per row (power of two <= 32)
  int32_t units;         // work units per row (rotary units first)
  int32_t rot_units;
  int32_t stages;        // the ring's depth (kRing instances: 2-4 rows in flight per team)
};

// The ring's wait (cp_async_wait_upto) leaves up to depth - 1 groups in flight
// (kNormRopeMaxStages: norm_rope_params.h).
static_assert(kNormRopeMaxStages - 1 <= kCpAsyncMaxPending, "cp_async_wait_upto covers the ring's waits");

// 16-byte segments of a row per thread in the ring: x (and dy in the backward), two per unit.
constexpr int norm_rope_ring_segs(bool bwd, int max_units) { return (bwd ? 4 : 2) * max_units; }

// A block's dynamic shared memory, carved in this order by the kernel and sized by the
// host from this one function: the cos and sin tables (table_stride floats each), the
// weights + offset [nt][D] floats, the backward's dw sums [nt][D], then the ring (kRing
// instances: per stage, `segs` 16-byte segments per thread ([segment][thread]: a warp's
// reads of one segment are consecutive, no bank conflicts), then each thread's row
// descriptor: output row, meta).
struct NormRopeSmem {
  size_t ring;   // byte offsets
  size_t out;
  size_t meta;
  size_t bytes;  // total
};
__host__ __device__ inline NormRopeSmem norm_rope_smem(int table_stride, int nt, int D, bool bwd, int stages,
                                                       int segs, int threads) {
  NormRopeSmem m;
  const size_t floats = 2 * static_cast<size_t>(table_stride) + (bwd ? 2 : 1) * static_cast<size_t>(nt) * D;
  m.ring = (floats * sizeof(float) + 15) / 16 * 16;
  m.out = m.ring + static_cast<size_t>(stages) * segs * threads * 16;
  m.meta = m.out + static_cast<size_t>(stages) * threads * sizeof(void*);
  m.bytes = stages > 1 ? m.meta + static_cast<size_t>(stages) * threads * sizeof(int) : floats * sizeof(float);
  return m;
}

// Feature index of a unit's two segments (each V elements): A at fa, B at fb.
__device__ __forceinline__ void unit_segments(const RopeParams& p, int u, int rot_units, int V, int* fa, int* fb) {
  if (u < rot_units) {
    *fa = p.interleaved ? 2 * u * V : u * V;
    *fb = p.interleaved ? *fa + V : p.R / 2 + u * V;
  } else {
    *fa = p.R + 2 * (u - rot_units) * V;
    *fb = *fa + V;
  }
}

// Pair j of a rotary unit held as e[0..2V): neox (e[j], e[V + j]); GPT-J (e[2j], e[2j+1]).
template <bool kInterleaved, int V>
__device__ __forceinline__ void pair_slots(int j, int* a, int* b) {
  *a = kInterleaved ? 2 * j : j;
  *b = kInterleaved ? 2 * j + 1 : V + j;
}

// Rotates the V pairs of a rotary unit held as e[0..2V), pair j by table entry i0 + j
// (the forward's rotation and the backward's rotation back: the table holds the sign).
template <bool kInterleaved, int V>
__device__ __forceinline__ void rotate_unit(float* e, int i0, const float* ct, const float* st) {
  float cs[V], sv[V];
  load_table<V>(ct + i0, cs);  // 16-byte reads: i0 and the table rows are multiples of V
  load_table<V>(st + i0, sv);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    int a, b;
    pair_slots<kInterleaved, V>(j, &a, &b);
    const float x0 = e[a], x1 = e[b], c = cs[j], sn = sv[j];
    e[a] = rot_y0(x0, x1, c, sn);
    e[b] = rot_y1(x0, x1, c, sn);
  }
}

// A segment of V elements as loaded: 16 bytes kept packed until used (converted right
// behind its load, the conversion's wait for the load would hold back every later
// instruction, in-order issue: the next row's loads too); the scalar variant's one
// element as a float (as before the prefetch; raw 16-bit scalars made it spill).
template <typename T, int V>
using RawSeg = std::conditional_t<V == 1, float, uint4>;

template <typename T, int V>
__device__ __forceinline__ RawSeg<T, V> load_segment(const T* base, int64_t stride, int f, int D) {
  if constexpr (V == 1) {
    return f < D ? static_cast<float>(base[f * stride]) : 0.f;
  } else {
    // __ldg: ld.global (the row pointers come from shuffles, which lose the address
    // space: plain loads were generic LD); the inputs are not written by the kernel.
    return __ldg(reinterpret_cast<const uint4*>(base + f));
  }
}

template <typename T, int V>
__device__ __forceinline__ void unpack_segment(RawSeg<T, V> w, float* dst) {
  if constexpr (V == 1) {
    dst[0] = w;
  } else {
    pin_word(w);
    Vec<T, V> v;
    *reinterpret_cast<uint4*>(&v) = w;
#pragma unroll
    for (int j = 0; j < V; ++j) dst[j] = static_cast<float>(v.v[j]);
  }
}

// The weights (+ offset) of a unit's two segments from the block's shared copy: 16-byte
// reads for the vector variant (its segments start at multiples of V floats and end
// inside the row), bounds-checked scalars for V = 1 (a last pass-through pair may end
// past D).
template <int V>
__device__ __forceinline__ void unit_weights(const float* w, int fa, int fb, int D, float* dst) {
  if constexpr (V == 1) {
    dst[0] = w[fa];
    dst[1] = fb < D ? w[fb] : 0.f;
  } else {
    load_table<V>(w + fa, dst);
    load_table<V>(w + fb, dst + V);
  }
}

template <typename T, int V>
__device__ __forceinline__ void store_segment(T* base, int64_t stride, int f, int D, const float* src) {
  if constexpr (V == 1) {
    if (f < D) base[f * stride] = static_cast<T>(src[0]);
  } else {
    Vec<T, V> v;
#pragma unroll
    for (int j = 0; j < V; ++j) v.v[j] = static_cast<T>(src[j]);
    __stwb(reinterpret_cast<uint4*>(base + f), *reinterpret_cast<const uint4*>(&v));  // st.global
  }
}

// Sum over the TPR lanes of a team (teams are aligned groups of TPR lanes of a warp).
__device__ __forceinline__ float team_sum(float v, int tpr) {
  for (int o = tpr / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o, tpr);
  return v;
}

// One row of a team as a thread holds it: its units' segments of x (backward: and of
// dy) as loaded, and where the row goes.
template <typename T, int V, int kMaxU, bool kBwd>
struct NormRopeRow {
  RawSeg<T, V> xa[kMaxU], xb[kMaxU];
  RawSeg<T, V> ga[kMaxU], gb[kMaxU];  // backward only
  T* out = nullptr;
  int64_t os3 = 1;
  int t = 0;
  int gl = 0;  // the row's token group within the tile (table row)
  bool active = false;
};

// Registers and spill stores (ptxas, sm_90a, this code): the forward's 16-bit ring at 64
// registers, no spill (4 blocks of 256 per SM: its rows in flight hold no registers;
// fp32's two units per thread spilled 60 bytes at that bound, so fp32 keeps 3 blocks:
// 77, no spill); the forward without the ring 77-78 (3 blocks: at 64 the next row and
// the descriptors' batch spilled), the scalar forward 80 (8 bytes). The backward holds
// dy and two dw sums besides x: 128 at 2 blocks per SM; spills: 16-bit ring 0, without
// the ring 72-76 bytes; fp32 ring 44, without 28; scalar 60 (at 3 blocks the 16-bit
// ring spilled ~320). The scalar variant's times at these bounds were not re-measured
// (the fallback; the tile variant's are in bench/NOTES.md).
constexpr int norm_rope_min_blocks(bool bwd, bool ring, int elem_bytes) {
  return bwd ? 2 : ring && elem_bytes == 2 ? 4 : 3;
}

// kMaxU: units per thread kept in registers (2V floats each).
// A team's first rows' loads go out before the block's sin/cos table and weights are
// filled (rope variant 4's order), and later rows' while earlier ones are normalised,
// rotated and stored: stages - 1 rows ahead through the ring (kRing), or one in
// registers (kAhead). A row's index math comes from a warp batch (below). H100, Qwen3
// q [1, 8192, 32, 128] + k [.., 8, ..] bf16 (bench/NOTES.md, runs 1-5 of the tenth and
// 1-2 of the eleventh session of 2026-11-26): the first version (each row loaded after
// the table's barrier and the previous row's stores, 2 rows per team, per-lane index
// math, 32 shared atomics per thread and 64 rows for the dw sums) took 79 us forward and
// ~520 backward; with the next row in registers 70 and 116 (ncu: 25.6M and 42.4M warp
// instructions, from 38.5M and 59.0M; the forward's long-scoreboard stalls 6 per issue);
// through the ring 69.2 and 110.5 (forward stalls 0.5 per issue); then the forward's
// tiles of 4 rows per team, not one wave's share (dispatch's tile rule), 64.3 (95% of a
// same-size copy). ncu's MIO stalls (short-scoreboard ~4 per issue) were not the limit:
// the lane's sin/cos and weights held in registers (4-8 fewer LDS.128 a row) and teams
// of half the lanes (half the per-row shuffles and ring steps per byte) gained nothing
// (twelfth session of 2026-11-26, runs 1-3).
template <typename T, int V, int kMaxU, bool kInterleaved, bool kBwd, bool kRing>
__global__ void __launch_bounds__(kNormRopeThreads, norm_rope_min_blocks(kBwd, kRing, sizeof(T)))
    norm_rope_kernel(const __grid_constant__ NormRopeParams np, const NormRopeShape sh) {
  static_assert(!kRing || V > 1, "the ring copies 16-byte segments");
  constexpr int E = 2 * V;  // elements of a unit
  // Without the ring: the first row's loads before the table and the next row's before
  // this row's work where two rows fit the registers (16-bit 16-byte units); else each
  // row loaded after the previous one's stores (fp32 and the scalar variant spilled with
  // two).
  constexpr bool kAhead = !kRing && V > 1 && sizeof(T) == 2;
  constexpr int kSegs = norm_rope_ring_segs(kBwd, kMaxU);
  using Row = NormRopeRow<T, V, kMaxU, kBwd>;
  const RopeParams& p = np.rope;
  extern __shared__ __align__(16) float smem[];  // float4 reads (load_table)
  float* cos_tab = smem;
  float* sin_tab = smem + sh.table_stride;
  float* w_s = smem + 2 * sh.table_stride;  // [num_tensors][D]: weight + offset
  float* dw_s = w_s + p.num_tensors * p.D;  // backward: [num_tensors][D]
  const NormRopeSmem lay = norm_rope_smem(sh.table_stride, p.num_tensors, p.D, kBwd, sh.stages, kSegs,
                                          kNormRopeThreads);
  uint4* ring = reinterpret_cast<uint4*>(reinterpret_cast<char*>(smem) + lay.ring);  // [stages][kSegs][threads]
  T** ring_out = reinterpret_cast<T**>(reinterpret_cast<char*>(smem) + lay.out);     // [stages][threads]
  int* ring_meta = reinterpret_cast<int*>(reinterpret_cast<char*>(smem) + lay.meta);  // [stages][threads]
  const int half = p.R / 2, D = p.D, nt = p.num_tensors;
  const int tid = threadIdx.x, nthreads = blockDim.x;

  const int64_t rows_g = rows_per_group(p), NB = batches_per_group(p);
  const int64_t total = num_groups(p) * rows_g;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.x) * sh.rows;
  const int64_t n = min(total, r_begin + sh.rows) - r_begin;
  const int64_t g_first = r_begin / rows_g;
  const int groups = static_cast<int>((r_begin + n - 1) / rows_g - g_first + 1);
  const int tpr = sh.tpr, lane = tid % tpr, team = tid / tpr, nteams = nthreads / tpr;

  // Row descriptors in warp batches: the row's index math (divides by the rows of a
  // group, the sequence length and the head count; 64-bit strides) is the same for
  // every lane of a team, so lane j of a warp computes it for one row of the next
  // tpr iterations of the warp's 32 / tpr teams, and each iteration's teams
  // take theirs by shuffles (a per-row computation by every lane, ~150 instructions
  // per warp and iteration, made the forward issue-bound: 470 warp instructions per
  // iteration, ncu run 3 of the tenth session of 2026-11-26).
  const int wlane = tid & 31, tw = 32 / tpr, team_w = wlane / tpr;  // teams per warp; this team's index in it
  struct Desc {
    const T* in = nullptr;  // forward x; backward dy
    const T* x = nullptr;   // backward: the saved x
    T* out = nullptr;
    int meta = -1;          // gl * 2 + t; -1 past the tile's end
  };
  auto describe = [&](int64_t lr) {
    Desc d;
    if (lr >= n) return d;
    const int64_t r = r_begin + lr;
    const int64_t g = r / rows_g;
    int64_t b0, s;
    group_token(p, g, &b0, &s);
    const RowCoord c = row_coord(p, NB, b0, r - g * rows_g);
    d.meta = static_cast<int>(g - g_first) * 2 + c.t;
    // Selects, not p.t[c.t]: a runtime index into the parameters made older
    // compilers copy them to local memory (rope_variants.cuh, step 1 of variant 6).
    const TensorView& v = c.t ? p.t[1] : p.t[0];
    d.in = static_cast<const T*>(v.in) + c.b * v.in_stride[0] + s * v.in_stride[1] + c.h * v.in_stride[2];
    d.out = static_cast<T*>(v.out) + c.b * v.out_stride[0] + s * v.out_stride[1] + c.h * v.out_stride[2];
    if (kBwd) {
      const int64_t* xs = c.t ? np.x_stride[1] : np.x_stride[0];
      d.x = static_cast<const T*>(c.t ? np.x[1] : np.x[0]) + c.b * xs[0] + s * xs[1] + c.h * xs[2];
    }
    return d;
  };
  const int64_t team0 = team - team_w;  // the warp's first team
  Desc batch;      // this lane's row of the current batch
  int batch_k = 0;  // the next call's position in the batch
  // Iteration it's row of this team; called for it = 0, 1, 2, ... in turn, by every
  // lane of the warp.
  auto desc_of = [&](int64_t it) {
    const int k = batch_k;
    batch_k = k + 1 == tpr ? 0 : k + 1;
    if (k == 0) batch = describe((it + wlane / tw) * nteams + team0 + wlane % tw);
    const int src = k * tw + team_w;
    Desc d;
    d.in = reinterpret_cast<const T*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(batch.in), src));
    if (kBwd)
      d.x = reinterpret_cast<const T*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(batch.x), src));
    d.out = reinterpret_cast<T*>(__shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(batch.out), src));
    d.meta = __shfl_sync(0xffffffffu, batch.meta, src);
    return d;
  };
  // The lane's units are the same in every row: their starts computed once (recomputed
  // per use in the scalar variant, whose 8 units' starts spilled).
  int fa0[kMaxU], fb0[kMaxU];
#pragma unroll
  for (int k = 0; k < kMaxU; ++k) unit_segments(p, lane + k * tpr, sh.rot_units, V, &fa0[k], &fb0[k]);
  auto seg = [&](int k, int* fa, int* fb) {
    if constexpr (kMaxU <= 2) {
      *fa = fa0[k];
      *fb = fb0[k];
    } else {
      unit_segments(p, lane + k * tpr, sh.rot_units, V, fa, fb);
    }
  };

  // Issues the loads of a row (nothing past the tile's end).
  auto fetch = [&](const Desc& d, Row& row) {
    row.active = d.meta >= 0;
    if (!row.active) return;
    row.t = d.meta & 1;
    row.gl = d.meta >> 1;
    const TensorView& v = row.t ? p.t[1] : p.t[0];
    row.out = d.out;
    row.os3 = v.out_stride[3];
    const T* xrow = kBwd ? d.x : d.in;
    const int64_t xs3 = kBwd ? (row.t ? np.x_stride[1][3] : np.x_stride[0][3]) : v.in_stride[3];
#pragma unroll
    for (int k = 0; k < kMaxU; ++k) {
      if (lane + k * tpr >= sh.units) continue;
      int fa, fb;
      seg(k, &fa, &fb);
      row.xa[k] = load_segment<T, V>(xrow, xs3, fa, D);
      row.xb[k] = load_segment<T, V>(xrow, xs3, fb, D);
      if (kBwd) {
        row.ga[k] = load_segment<T, V>(d.in, v.in_stride[3], fa, D);
        row.gb[k] = load_segment<T, V>(d.in, v.in_stride[3], fb, D);
      }
    }
  };

  // The ring: a row's segments copied into this thread's slot of shared memory
  // (cp.async: no registers per byte in flight, so stages - 1 rows stay in flight while
  // one computes), its descriptor beside them; read back by the same thread only, after
  // its own wait: no barrier.
  // Segment s of this thread's slot: x of unit k at 2k, 2k + 1; dy at 2 kMaxU + 2k, + 1.
  auto slot_seg = [&](int slot, int s) { return ring + (slot * kSegs + s) * kNormRopeThreads + tid; };
  auto slot_desc = [&](int slot) { return slot * kNormRopeThreads + tid; };  // ring_out / ring_meta index
  auto ring_fetch = [&](const Desc& d, int slot) {
    if constexpr (kRing) {
      // The slot's previous row was read (ring_take) before this point in program order;
      // the copies' asm has no memory clobber, so a compiler fence keeps those reads here.
      asm volatile("" ::: "memory");
      ring_out[slot_desc(slot)] = d.out;
      ring_meta[slot_desc(slot)] = d.meta;
      if (d.meta < 0) return;
      const T* xrow = kBwd ? d.x : d.in;
#pragma unroll
      for (int k = 0; k < kMaxU; ++k) {
        if (lane + k * tpr >= sh.units) continue;
        int fa, fb;
        seg(k, &fa, &fb);
        cp_async16(slot_seg(slot, 2 * k), xrow + fa, true);
        cp_async16(slot_seg(slot, 2 * k + 1), xrow + fb, true);
        if (kBwd) {
          cp_async16(slot_seg(slot, 2 * kMaxU + 2 * k), d.in + fa, true);
          cp_async16(slot_seg(slot, 2 * kMaxU + 2 * k + 1), d.in + fb, true);
        }
      }
    }
  };
  auto ring_take = [&](int slot, Row& row) {
    if constexpr (kRing) {
      const int meta = ring_meta[slot_desc(slot)];
      row.active = meta >= 0;
      if (!row.active) return;
      row.t = meta & 1;
      row.gl = meta >> 1;
      row.out = ring_out[slot_desc(slot)];
      row.os3 = (row.t ? p.t[1] : p.t[0]).out_stride[3];
#pragma unroll
      for (int k = 0; k < kMaxU; ++k) {
        if (lane + k * tpr >= sh.units) continue;
        row.xa[k] = *slot_seg(slot, 2 * k);
        row.xb[k] = *slot_seg(slot, 2 * k + 1);
        if (kBwd) {
          row.ga[k] = *slot_seg(slot, 2 * kMaxU + 2 * k);
          row.gb[k] = *slot_seg(slot, 2 * kMaxU + 2 * k + 1);
        }
      }
    }
  };
  const int stages = sh.stages;
  int slot_wr = 0, slot_rd = 0;
  auto next_slot = [&](int s) { return s + 1 == stages ? 0 : s + 1; };

  // 1. The first rows' loads (the ring: stages - 1 rows; else one where two rows fit
  //    the registers), then the block's sin/cos table and weights (their latency hidden
  //    behind the loads').
  Row cur;
  if (kRing) {
    for (int j = 0; j + 1 < stages; ++j) {
      ring_fetch(desc_of(j), slot_wr);
      cp_async_commit();
      slot_wr = next_slot(slot_wr);
    }
  }
  if (kAhead) fetch(desc_of(0), cur);
  fill_sincos_table(p, g_first, groups, cos_tab, sin_tab);
  for (int i = tid; i < nt * D; i += nthreads) {
    const int t = i / D, d = i - t * D;
    const void* wp = t ? np.weight[1] : np.weight[0];
    const DType wd = t ? np.weight_dtype[1] : np.weight_dtype[0];
    w_s[i] = load_float(wp, wd, d * (t ? np.weight_stride[1] : np.weight_stride[0])) + np.weight_offset;
    if (kBwd) dw_s[i] = 0.f;
  }
  __syncthreads();

  float acc[2][kMaxU][E];  // backward: dw partial sums per tensor (registers)
  if (kBwd) {
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int k = 0; k < kMaxU; ++k)
#pragma unroll
        for (int j = 0; j < E; ++j) acc[t][k][j] = 0.f;
  }

  // 2. Every thread runs the same number of iterations: the team reductions are warp
  //    shuffles, so idle teams take part with zeros.
  const float inv_d = 1.f / D;
  for (int64_t it = 0; it * nteams < n; ++it) {
    Row nxt;
    if (kRing) {
      ring_fetch(desc_of(it + stages - 1), slot_wr);  // the slot row it - 1 left
      cp_async_commit();
      slot_wr = next_slot(slot_wr);
      cp_async_wait_upto(stages - 1);  // row it's group has landed
      ring_take(slot_rd, cur);
      slot_rd = next_slot(slot_rd);
    } else if (kAhead) {
      fetch(desc_of(it + 1), nxt);
    } else {
      fetch(desc_of(it), cur);
    }

    float e[kMaxU][E];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxU; ++k) {
      const int u = lane + k * tpr;
      if (cur.active && u < sh.units) {
        unpack_segment<T, V>(cur.xa[k], e[k]);
        unpack_segment<T, V>(cur.xb[k], e[k] + V);
#pragma unroll
        for (int j = 0; j < E; ++j) ss += e[k][j] * e[k][j];
      }
    }
    ss = team_sum(ss, tpr);
    // rsqrtf: within 2 ulp (the IEEE sqrt and divide cost ~25 instructions a row).
    const float rstd = rsqrtf(ss * inv_d + np.eps);
    const float* w = w_s + cur.t * D;
    const float* ct = cos_tab + cur.gl * half;
    const float* st = sin_tab + cur.gl * half;

    if (!kBwd) {
#pragma unroll
      for (int k = 0; k < kMaxU; ++k) {
        const int u = lane + k * tpr;
        if (!cur.active || u >= sh.units) continue;
        int fa, fb;
        seg(k, &fa, &fb);
        float wu[E];
        unit_weights<V>(w, fa, fb, D, wu);
#pragma unroll
        for (int j = 0; j < E; ++j) e[k][j] *= rstd * wu[j];
        if (u < sh.rot_units) rotate_unit<kInterleaved, V>(e[k], u * V, ct, st);
        store_segment<T, V>(cur.out, cur.os3, fa, D, e[k]);
        store_segment<T, V>(cur.out, cur.os3, fb, D, e[k] + V);
      }
    } else {
      // g = R(-theta) dy (the table holds -sin), gw = g * w, n = x * rstd;
      // dx = rstd * (gw - n * mean(gw * n)); dw += g * n.
      float gr[kMaxU][E];  // g * w
      float dot = 0.f;
#pragma unroll
      for (int k = 0; k < kMaxU; ++k) {
        const int u = lane + k * tpr;
        if (!cur.active || u >= sh.units) continue;
        unpack_segment<T, V>(cur.ga[k], gr[k]);
        unpack_segment<T, V>(cur.gb[k], gr[k] + V);
        if (u < sh.rot_units) rotate_unit<kInterleaved, V>(gr[k], u * V, ct, st);
#pragma unroll
        for (int j = 0; j < E; ++j) {
          // dw sums g * n: taken before g is scaled by the weight.
          const float nx = e[k][j] * rstd;
          if (cur.t) acc[1][k][j] += gr[k][j] * nx; else acc[0][k][j] += gr[k][j] * nx;
        }
        int fa, fb;
        seg(k, &fa, &fb);
        float wu[E];
        unit_weights<V>(w, fa, fb, D, wu);
#pragma unroll
        for (int j = 0; j < E; ++j) {
          gr[k][j] *= wu[j];
          dot += gr[k][j] * e[k][j];
        }
      }
      const float mean = team_sum(dot, tpr) * rstd * inv_d;
#pragma unroll
      for (int k = 0; k < kMaxU; ++k) {
        const int u = lane + k * tpr;
        if (!cur.active || u >= sh.units) continue;
        float dx[E];
#pragma unroll
        for (int j = 0; j < E; ++j) {
          const float nx = e[k][j] * rstd;
          dx[j] = rstd * (gr[k][j] - nx * mean);
        }
        int fa, fb;
        seg(k, &fa, &fb);
        store_segment<T, V>(cur.out, cur.os3, fa, D, dx);
        store_segment<T, V>(cur.out, cur.os3, fb, D, dx + V);
      }
    }
    if (kAhead) cur = nxt;
  }

  if (kBwd) {
    // 3. The dw partial sums: the teams of a warp hold the same features (lane l of
    //    every team), so they are summed by shuffles first; then one shared atomic per
    //    feature per warp, and one [D] row per block and tensor.
#pragma unroll
    for (int k = 0; k < kMaxU; ++k) {
      const int u = lane + k * tpr;
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < E; ++j)
          for (int o = tpr; o < 32; o *= 2) acc[t][k][j] += __shfl_xor_sync(0xffffffffu, acc[t][k][j], o);
      if (u >= sh.units || wlane >= tpr) continue;
      int fa, fb;
      seg(k, &fa, &fb);
      for (int t = 0; t < nt; ++t)
#pragma unroll
        for (int j = 0; j < E; ++j) {
          const int f = j < V ? fa + j : fb + j - V;
          if (f < D) atomicAdd(&dw_s[t * D + f], t ? acc[1][k][j] : acc[0][k][j]);
        }
    }
    __syncthreads();
    for (int i = tid; i < nt * D; i += nthreads) {
      const int t = i / D, d = i - t * D;
      static_cast<float*>(t ? np.dweight_partial[1] : np.dweight_partial[0])[blockIdx.x * static_cast<int64_t>(D) + d] =
          dw_s[i];
    }
  }
}

// The weight grads from the partial rows: block (32, kDwSumStripes) sums columns
// [32 blockIdx.x, +32) of tensor blockIdx.y, 32 row stripes per column, then stores the
// fp32 sum in the weight's dtype. (One row per block of the main kernel: ~2 per SM at
// large calls, thousands where the sin/cos table's cap shrinks the tiles; 32 stripes
// keep each thread's serial sum short.)
constexpr int kDwSumStripes = 32;
__global__ void __launch_bounds__(32 * kDwSumStripes) norm_rope_dw_sum_kernel(const NormRopeDwSum a) {
  __shared__ float red[kDwSumStripes][33];
  const int t = blockIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const float* part = t ? a.partial[1] : a.partial[0];
  float s = 0.f;
  if (col < a.D)
    for (int64_t r = threadIdx.y; r < a.rows; r += kDwSumStripes) s += part[r * a.D + col];
  red[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || col >= a.D) return;
#pragma unroll
  for (int y = 1; y < kDwSumStripes; ++y) s += red[y][threadIdx.x];
  void* out = t ? a.out[1] : a.out[0];
  switch (t ? a.out_dtype[1] : a.out_dtype[0]) {
    case DType::kFloat16: static_cast<c10::Half*>(out)[col] = static_cast<c10::Half>(s); break;
    case DType::kBFloat16: static_cast<c10::BFloat16*>(out)[col] = static_cast<c10::BFloat16>(s); break;
    default: static_cast<float*>(out)[col] = s;
  }
}

}  // namespace cuda
}  // namespace rope_ext
