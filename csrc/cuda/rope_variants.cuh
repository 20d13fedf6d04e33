// The CUDA kernel variants of rope_ext, simplest first. Each rotates every pair of
// the rotary part of up to two tensors (q, k) and copies the pass-through tail
// [R, D) when out of place. The backward is the same kernel with p.sign = -1.
//
//   1. naive   one thread per output element: reads its element and its partner,
//              its own frequency (inv_freq_of: the params' table or inv_freq) and
//              computes its own sin/cos. Cannot run in place (a thread would read a
//              partner another thread already wrote).
//   2. fp32    one thread per rotation pair (or tail element), scalar loads/stores,
//              frequencies from a per-block shared-memory table.
//   3. fp32x4  blocks walk token groups; each thread owns a 16-byte chunk (4 fp32 /
//              8 fp16/bf16) of each half, issues its loads for kRowsInFlight rows, then
//              computes the chunk's sin/cos once and reuses them for every row of the
//              group: all heads of q and k, and the whole batch when positions are
//              shared. Needs unit feature stride and 16-byte alignment.
//   4. fp32x4_tile  (auto's where lean does not apply) variant 3's 16-byte chunks, but each block owns
//              one short tile of consecutive rows and exits: its first loads go out,
//              then the block fills a shared cos/sin table for the tile's token groups
//              (one barrier), then rotates and stores. Same eligibility as 3.
//   5. flat    (impl="flat" only; auto never picks it) for small tensors: no shared
//              memory, no barrier; a thread owns one 16-byte chunk of a few rows (heads)
//              of one token group, computes that chunk's sin/cos once while its loads
//              are in flight, and reuses them for its rows. Grid sized to fill the GPU
//              at decode sizes. Same eligibility.
//              Measured on the H100 (issue 19, latency suite: CUDA graph, cold L2):
//              level with variant 4 or slower at every size, small tensors and W5
//              included, so it left auto's candidates (it was behind an opt-in limit,
//              ROPE_EXT_FLAT_MAX_BYTES, default 0). Kept as an explicit impl: it is
//              tested, the bench still times it, and it is the barrier-free reference
//              a specialised small-tensor kernel would be compared with. What it
//              says: the barrier and the shared table alone were not what kept variant
//              4 behind the peers at small sizes (bench/NOTES.md, issue 19, for what
//              the static resources point at instead).
//   6. lean    (auto's choice where it applies, never named) variant 5's thread shape
//              with almost nothing before the first load: its own small params
//              (LeanParams, filled by rope_dispatch.cu from RopeParams), the token from
//              the grid (blockIdx.z = b, s from blockIdx.y and, with several tokens a
//              block, threadIdx.y; sbhd calls whose positions the
//              batch shares, and one-head calls whose positions the batch shares, come
//              with the batch folded into the token's rows and B = 1, rope_dispatch.cu's
//              lean_fold_batch), the row and chunk from
//              threadIdx by shift and mask, so a thread's x loads go out after a few
//              dozen instructions (variant 4's first load is its ~290th instruction,
//              bench/NOTES.md issue 19); frequencies from global memory (coalesced),
//              the position and the frequencies in flight with x. Common cases only:
//              one position axis, positions / arange (+ offset(s)) / one packed
//              sequence, frequencies as a tensor (inv_freq or the cached kBase table)
//              or a cos_sin_cache (read by vector loads where its layout allows: 0.12 MB
//              4.8 us against the tiles' 6.6, still behind computing, 4.5; NOTES run 8),
//              no context parallelism, no pass-through tail to copy. Accesses of 16, 8
//              or 4 bytes (W; fewer pairs, fewer sin/cos per thread as W shrinks): 8
//              bytes took 0.5-0.8 us off 16-bit tensors up to 8 MB (0.12 MB bf16 5.4 ->
//              4.8 us; a thread's chain of 8 sin/cos, not DRAM, was the time), 4 bytes
//              nothing more (rope_dispatch.cu has the rule, bench/NOTES.md the run).
//              Then (evening of 2026-11-25, bench/NOTES.md runs 1-3): a thread's P sin/cos
//              as straight-line code (angle_sincos_chunk: turns' per-pair range branch had
//              made them P serial blocks), the parameters within one constant line, and
//              two lanes sharing a chunk's sin/cos (K = 2): 0.12 MB 4.9 -> 4.5-4.8 us, 32 MB
//              28.4 -> 27.2. What is left at 0.12 MB: ~280 instructions per warp (Triton's
//              kernel reading a cos/sin table: 96) run by ~2 warps per SM after x arrives.
//              Tried and reverted (run 7 of 2026-11-25): the first warp prefetching
//              every 64-byte line of the params (prefetchu.L1, a CCTL) at kernel start,
//              here, in both append kernels and in decode variant 5: 0.12 MB 4.8 us
//              either way, append T = 16 and decode B = 1 within noise. The generic
//              prefetch does not fill the constant caches the parameter reads miss.
//              Then (night of 2026-11-25/26, bench/small_rope_study.py, H200): blocks
//              keep 128 threads, the frequency loads go out right behind x's, the
//              packed-sequence position is guessed while cu_seqlens[0] loads, and the
//              frequency source is a template argument: 0.12 MB bshd 4.99 -> 4.5-4.7
//              us, thd 5.22 -> 4.7. This kernel launched from the study's own module
//              takes rope_ext's time (4.70), while a kernel of the same loads and
//              arithmetic with one-line params and constant shapes takes 3.84 (torch.
//              compile 3.68): what is left is in this kernel's code (NOTES run 6).
//              Then (2026-11-26): the parameters laid out by constant line (no gain
//              measured, none lost) and the token's sin/cos computed once per block
//              into shared memory instead of two lanes sharing them (K = 2): ncu 0.5 MB
//              3.7 -> 3.5 us, 2 MB 4.6 -> 4.3, 32 MB graph 21.8 -> 20.9; bench/NOTES.md.
//              Then (second session of 2026-11-26, H100, columns timed in turns): an
//              instance without the position code (kPlain) for calls with no position
//              tensor, the table's rare loop out of line: a call's path 6.9 -> 3.8 KB of
//              SASS, 0.12-8 MB 0.1-0.2 us faster than the general instance (0.12 MB 4.45
//              vs 4.51-4.66, torch.compile 4.2-4.3). Tried and reverted: thread 0 touching
//              its output row early (the out page's translation: no gain), one load of
//              cu_seqlens[0] per block (not the cost).
//              Then (ninth session of 2026-11-26, H100, bench/small_rope_study.py): x
//              kept packed until the rotation (pin_word; the compiler had unpacked it
//              right behind its load, which held back the position loads): 0.12 MB thd
//              with cu_seqlens 3.94 -> 3.65 us under ncu; plain calls unchanged. Left at
//              0.12 MB (ncu): torch.compile 3.01, a minimal kernel of the same loads and
//              sin/cos 3.04-3.10, this kernel from the study 3.26, from the op 3.58.
//              Then (twenty-first session, H100, bench/w2_study.py, in turns): past 32 MB,
//              where auto ran the tiles (variant 4) until then, at 2 rows a thread: W2a
//              93.6 us, 128 MB bshd 93.4-93.8, W1 93.6 (the tiles 94.9-97.1 on the same
//              machines, the copy 93.1-93.7): the tiles ran 1.2-3.4 us over the copy,
//              varying between machines, lean level with it. sbhd with B > 1 took the
//              batch fold first (rope_dispatch.cu, lean_fold_batch): without it W2b ran
//              76.7 (the grid walked s within each b, B * H rows apart; the tiles 73.9),
//              with it 71.4 on another machine (the tiles 73.0, the copy 71.6-71.8). W4
//              (thd q + k, random positions, in place) 63.3 -> 60.8, the copy 60.3.
//              Then (twenty-second session, H100, bench/lean_shapes.py): a block holds
//              one token's rows, so one head makes a block of 16 threads (bf16; 8 KB in
//              flight a SM at 32 blocks): one bf16 head at 128 MB took 321 us against the
//              tiles' 100 (the copy 93), 1.8-3.2x the tiles' time from 4 MB up; four heads
//              (64 threads a token) 94.1 against 101.6. Calls under 64 threads a token
//              take the tiles past 256 KB (rope_dispatch.cu). fp32 past 16 MB on lean:
//              32 MB 26.6 us against the tiles' 28.2.
//              Then (twenty-third session, same bench): what makes a small block is the
//              block's threads, not the token's: rows a thread had shrunk a token of 4-8
//              rows to one 16-thread slot (four bf16 heads at 32 MB 37.5 us with the
//              table, 31.7 per lane, the tiles 29.5-29.7); held to 64-thread blocks
//              27.4-27.7. A one-head call with batch-shared positions folds its B rows
//              into the token (4 MB 7.7 us against the tiles' 8.9, 32 MB 27.9-28.0
//              against 30.4). The shared sin/cos table is shared only with several row
//              slots: with one it cost 0.8 us at 0.125 MB (one bf16 head 5.6 -> 4.6-4.8
//              per lane) to 5.4 at 32 MB (four heads, U = 4); with several it ran level.
//              Then (twenty-fourth session, same bench): a token under 64 threads with
//              nothing to fold (one bf16 head at B = 1, two heads) takes its rows in one
//              thread and blocks of several consecutive tokens (blockDim.y), per-lane
//              sin/cos: one bf16 head B = 1 1 MB 5.7 us (the tiles 7.0, torch.compile 6.3),
//              32 MB 34.1 (54.2, 50.2; the copy 27.3: a pair's sin/cos serves 8 bytes
//              there); two heads B = 16 32 MB 27.7 (31.1, 27.9).
//              Then (twenty-sixth session, bench/latency_rows.py --hint, in turns): past
//              32 MB, x loaded with L2's evict_last hint and each line demoted to
//              evict_normal after its rows are stored (kHint; launch_lean has the rule
//              and the numbers): 1.1-2.5% off every timed large row (W2a 93.7 -> 92.5-92.6
//              us, level with torch.compile; W2b 71.8 -> 70.6; W4 in place 60.8 -> 59.5-59.7;
//              fp32 40 MB 32.8 -> 32.0); every hinted line demoted after use, so none is
//              left held (the pin probe agrees within its spread).
//              Tried (twenty-sixth session, H100, in turns): at one row a thread, the
//              work after the loads (sin/cos, the table and its barrier, rotation, store
//              addresses) run first on stand-ins with the stores off while x was in
//              flight, so that its code was fetched during the round trip: bit-equal,
//              and level or 0.1-0.2 us slower (0.12 MB out of place 4.61 -> 4.80-4.83,
//              0.5 MB 5.12 -> 5.12, fp32 0.25 MB 4.77 -> 4.99). Not kept (bench/NOTES.md).
//              Then (twenty-eighth session, ncu in the suite's regime: scripts/ncu_small.sh):
//              plain calls at one row a thread and one token a block run
//              rope_lean_plain1_kernel (below: the study's lean_nopos as rope_ext's
//              kernel); in turns 0.12 MB 4.61-4.70 -> 4.32-4.45 us (torch.compile
//              4.32-4.45), 0.5 MB 4.80-4.99 -> 4.69-4.83 (4.61-4.67).
//
// What was learned on the H100 (bench/NOTES.md has the numbers and the method):
//   - Variant 3's x loads must be uint4: a struct copy of Vec<bf16, 8> compiled to
//     eight 2-byte loads (bf16 bshd W1 222 us -> 127 us once fixed; fp32 was fine).
//   - A shared-memory sin/cos phase per token needs two __syncthreads per group and
//     keeps warps in lock-step (W1 120 us, 75% of copy). Per-thread sin/cos issued
//     after the loads, warps drifting freely, did no better on its own; the kernel is
//     instruction-heavy (ncu: DRAM 60%, 2 blocks/SM at ~120 registers, ~10 cycles per
//     issued instruction). 16 rows per thread instead of 4 cut W1 by ~20% (fewer
//     redundant sin/cos); a 3-blocks/SM launch bound spills and is slower.
//   - Tried and reverted (H100, one run each): sin/cos arrays passed by reference
//     (they sit in local memory when passed as a pointer) + packed bf16x2 stores +
//     2 rows in flight: with the accurate sincosf registers rose to ~194 (1 block/SM)
//     and W1 went 123 -> 136 us, W2b 114 -> 189, W4 84 -> 98; with __sincosf and a
//     2-blocks/SM bound W1 stayed 123 us (W3 400 -> 390) at the cost of accuracy.
//     Software pipelining (two 2-row batches, next loads before the current rotate):
//     W1 124 us (no change), W3 406, W4 218 us: reverted.
//     W1 (bf16 bshd) held at ~123 us (72% of copy) through all of these.
//   - What moved it was the grid, not the instructions (variant 4): short-lived blocks
//     over contiguous row tiles let the block scheduler overlap one block's sin/cos
//     phase with others' DRAM traffic, where variant 3's resident blocks walking
//     token groups left DRAM at 60-78% busy. W1 123 -> 93.8 us (95% of copy; see the
//     batch-fold note in rope_dispatch.cu), W2b 114 -> 72, W3 400 -> 378-388, W4 83 -> 63
//     (bench/NOTES.md). Tile length and registers are tuned next to the kernel and in
//     rope_dispatch.cu.
//   - kBase frequencies come from the host in the params (RopeParams::base_freqs):
//     HF's float32 table, bit-identical to what checkpoints were trained with (issue
//     10); moving the pow to the host made no measurable change on W1 or W5 (the
//     small-tensor latency lies elsewhere, bench/NOTES.md).
//   - Accurate sin/cos are affordable: the angle reduced in double (rope_math.h) and
//     an accurate sin/cos of the reduced fp32 argument.
//   - Issue 11 (small tensors are latency: launch, a constant-cache and an instruction
//     fetch per new line of params or code, then one DRAM round trip), from ptxas/SASS
//     on the CPU machine, timings pending on the H100 (bench/NOTES.md): variant 5 as
//     first written compiled to ~5900 instructions (bf16 neox), mostly P inlined
//     copies of position_of (multi-axis) and of sincosf's Payne-Hanek slow path; the
//     multi-axis lookup out of line and sincospif on an angle reduced in half-turns
//     (opt-in, -DROPE_EXT_SINCOSPIF, until measured) bring it to ~3300 with no stack frame, and hoisting the frequency-source and
//     axis branches out of the per-pair loop lets the P sin/cos interleave (they were
//     P serial branchy blocks).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "../rope_math.h"
#include "primitives.cuh"

namespace rope_ext {
namespace cuda {

// ---------------------------------------------------------------- 1. naive
template <typename T>
__global__ void rope_naive_kernel(const __grid_constant__ RopeParams p) {
  const int64_t per_token = heads_total(p);  // rows of one token: heads of q + k
  const int64_t total = p.B * p.S * per_token * p.D;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int d = static_cast<int>(idx % p.D);
    int64_t rest = idx / p.D;
    const int64_t hh = rest % per_token;
    const int64_t tok = rest / per_token;
    const int64_t b = tok / p.S, s = tok - b * p.S;
    const RowOffsets o = row_offsets(p, 1, b, s, hh);
    const TensorView& v = p.t[o.t];
    const T* in = static_cast<const T*>(v.in);
    T* out = static_cast<T*>(v.out);
    const int64_t out_off = o.out + d * v.out_stride[3];
    if (d >= p.R) {
      out[out_off] = in[o.in + d * v.in_stride[3]];
      continue;
    }
    const int half = p.R / 2;
    const int i = p.interleaved ? d / 2 : (d < half ? d : d - half);
    const bool first = p.interleaved ? (d % 2 == 0) : (d < half);
    const int partner = p.interleaved ? (d ^ 1) : (first ? d + half : d - half);
    float sn, cs;
    pair_sincos(p, pair_position(p, b, s, i), i, inv_freq_of(p, i), &sn, &cs);
    using A = acc_t<T>;
    const A x = static_cast<A>(in[o.in + d * v.in_stride[3]]);
    const A y = static_cast<A>(in[o.in + partner * v.in_stride[3]]);
    out[out_off] = static_cast<T>(first ? rot_y0<A>(x, y, cs, sn) : rot_y1<A>(y, x, cs, sn));
  }
}

// ---------------------------------------------------------------- 2. fp32
template <typename T>
__global__ void rope_fp32_kernel(const __grid_constant__ RopeParams p) {
  extern __shared__ float freq[];
  fill_freq_table(p, freq);
  const int half = p.R / 2;
  const int items = half + (p.copy_tail ? p.D - p.R : 0);  // pairs, then tail features
  const int64_t per_token = heads_total(p);
  const int64_t total = p.B * p.S * per_token * items;
  for (int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; idx < total;
       idx += (int64_t)gridDim.x * blockDim.x) {
    const int k = static_cast<int>(idx % items);
    const int64_t rest = idx / items;
    const int64_t hh = rest % per_token, tok = rest / per_token;
    const int64_t b = tok / p.S, s = tok - b * p.S;
    const RowOffsets o = row_offsets(p, 1, b, s, hh);
    if (k >= half) {
      copy_feature<T>(p.t[o.t], o, p.R + (k - half));
      continue;
    }
    float sn, cs;
    pair_sincos(p, pair_position(p, b, s, k), k, freq[k], &sn, &cs);
    rotate_pair<T>(p, p.t[o.t], o, k, sn, cs);
  }
}

// ---------------------------------------------------------------- 3. fp32x4
constexpr int kRowsInFlight = 4;  // rows loaded before the first use: hides DRAM latency
constexpr int kMaxThreads = 256;  // per block
constexpr int kRowsPerThread = 16;  // rows of a group per thread (launch shape, rope_dispatch.cu)

// Launch shape: blockDim.x threads walk the chunks of a row (a chunk = 16 bytes of
// one half, or of the tail), blockDim.y rows; blockIdx.x walks token groups,
// blockIdx.y splits a group's rows when there are few tokens (decode) to fill the SMs.

// The rows a thread moves in one step: kRowsInFlight rows of one chunk, loaded
// together (all loads issued before any is used), then rotated and stored.
template <typename T, bool kInterleaved>
struct ChunkBatch {
  static constexpr int V = 16 / sizeof(T);           // elements per 16-byte access
  static constexpr int P = kInterleaved ? V / 2 : V;  // pairs per chunk
  using VecT = Vec<T, V>;
  VecT a[kRowsInFlight], b[kRowsInFlight];
  RowOffsets o[kRowsInFlight];

  __device__ __forceinline__ void load(const RopeParams& p, int64_t NB, int64_t b0, int64_t s, int64_t r0,
                                       int64_t step, int64_t rows, int64_t d0, int64_t d1, bool pair) {
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      const int64_t r = r0 + u * step;
      if (r >= rows) break;
      o[u] = row_offsets(p, NB, b0, s, r);
      const T* in = static_cast<const T*>(p.t[o[u].t].in) + o[u].in;
      a[u] = load_vec<VecT>(in + d0);
      if (pair) b[u] = load_vec<VecT>(in + d1);
    }
  }

  // sn/cs: this chunk's P sines and cosines; null for a tail chunk.
  __device__ __forceinline__ void store(const RopeParams& p, int64_t r0, int64_t step, int64_t rows,
                                        int64_t d0, int64_t d1, const float* sn, const float* cs) {
#pragma unroll
    for (int u = 0; u < kRowsInFlight; ++u) {
      if (r0 + u * step >= rows) break;
      T* out = static_cast<T*>(p.t[o[u].t].out) + o[u].out;
      if (sn) rotate_chunk<T, kInterleaved>(a[u], b[u], sn, cs);
      store_vec(out + d0, a[u]);
      if (sn && !kInterleaved) store_vec(out + d1, b[u]);
    }
  }
};

// No minBlocks in the launch bound: the registers are the compiler's choice (the bf16
// neox kernel takes ~114, 2 blocks/SM); a 3-blocks/SM bound spilled and ran slower
// (the notes at the top of this file).
template <typename T, bool kInterleaved>
__global__ void __launch_bounds__(kMaxThreads) rope_fp32x4_kernel(const __grid_constant__ RopeParams p) {
  using Batch = ChunkBatch<T, kInterleaved>;
  constexpr int V = Batch::V, P = Batch::P;
  extern __shared__ float freq[];  // [R/2], once per block
  fill_freq_table(p, freq);

  const int half = p.R / 2;
  const int n_rot = rot_chunks(p, V), chunks = row_chunks(p, V);
  const int64_t NB = batches_per_group(p);
  const int64_t rows = rows_per_group(p);
  const int64_t groups = num_groups(p);
  const int64_t step = (int64_t)gridDim.y * blockDim.y;
  const int64_t first_r0 = blockIdx.y * (int64_t)blockDim.y + threadIdx.y;

  Batch batch;
  // No barrier per group: each thread computes its own chunk's sin/cos after its loads
  // are in flight, and warps drift freely, so one warp's sin/cos overlaps another's
  // DRAM traffic. (A shared-memory sin/cos phase per group needed two __syncthreads
  // per token and held the bf16 bshd case at 75% of copy bandwidth.)
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    int64_t b0, s;
    group_token(p, g, &b0, &s);
    const int64_t pos = position_of(p, b0, s);
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
      const bool rot = c < n_rot;
      const int64_t d0 = chunk_start(p, c, V), d1 = d0 + half;
      float sn[P], cs[P];
      bool have_sincos = false;
      for (int64_t r0 = first_r0; r0 < rows; r0 += kRowsInFlight * step) {
        batch.load(p, NB, b0, s, r0, step, rows, d0, d1, !kInterleaved && rot);
        if (rot && !have_sincos) {  // once per (group, chunk), reused for every row
#pragma unroll
          for (int j = 0; j < P; ++j) {
            const int i = c * P + j;
            pair_sincos(p, p.num_axes > 1 ? pair_position(p, b0, s, i) : pos, i, freq[i], &sn[j], &cs[j]);
          }
          have_sincos = true;
        }
        batch.store(p, r0, step, rows, d0, d1, rot ? sn : nullptr, cs);
      }
    }
  }
}

// ---------------------------------------------------------------- 4. fp32x4_tile
// A block owns a tile: ts.rows consecutive rows of the flattened (token group, row of
// group) space, i.e. a contiguous stretch of tokens, and exits when done (no
// persistent loop: the block scheduler overlaps one block's sin/cos phase with
// another's memory traffic). Per block:
//   1. each thread issues the loads of its first U rows,
//   2. the block fills a shared cos/sin table for the (few) groups the tile touches,
//   3. one __syncthreads, then every thread rotates/stores its rows and loads more.
// Each (position, frequency) is computed once per tile and read from shared memory
// by all heads, q and k, and the batch when positions are shared.
struct TileShape {
  int64_t rows;          // rows per tile (the last tile may be shorter)
  int32_t table_stride;  // floats from the cos table to the sin table (a multiple of 4)
};
constexpr int kTileThreads = 256;
// 2 rows in flight at 4 blocks/SM (64 registers, no spills). Measured on the H100
// (bench/tune_tile.py; W1 us): 4 rows at 3 blocks/SM (80 registers) 96.4; 4 rows
// forced to 4 blocks/SM spills, 112; 1 row at 6 blocks/SM (40 registers, small
// spills) 98.8; streaming cache hints (__ldcs/__stcs) on x 99.5, W3 406 vs 388.
constexpr int kTileRowsInFlight = 2;
constexpr int kTileMinBlocks = 4;

template <typename T, bool kInterleaved, int U>
struct TileRows {
  static constexpr int V = 16 / sizeof(T);
  static constexpr int P = kInterleaved ? V / 2 : V;
  using VecT = Vec<T, V>;
  VecT a[U], b[U];
  T* out[U];
  uint32_t gl[U];  // the row's group within the tile (table row)

  // Rows lr0, lr0 + step, ... (local to the tile, < n); x = r_first + lr counts rows
  // from the first group's start (32-bit: rows of a group + a tile fit).
  __device__ __forceinline__ void load(const RopeParams& p, int64_t NB, uint32_t rows_g, int64_t g_first,
                                       uint32_t r_first, int lr0, int step, int n, int d0, int d1, bool pair) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int lr = lr0 + u * step;
      if (lr >= n) break;
      const uint32_t x = r_first + static_cast<uint32_t>(lr);
      gl[u] = x / rows_g;
      int64_t b0, s;
      group_token(p, g_first + gl[u], &b0, &s);
      const RowOffsets o = row_offsets(p, NB, b0, s, x - gl[u] * rows_g);
      // Selects, not p.t[o.t]: a runtime index into the kernel's parameters made the
      // compiler copy them to local memory when this was written (nvcc 13 can index a
      // __grid_constant__ array with one LDC: variant 6's step 1; not re-checked here).
      const T* in = static_cast<const T*>(o.t ? p.t[1].in : p.t[0].in) + o.in;
      out[u] = static_cast<T*>(o.t ? p.t[1].out : p.t[0].out) + o.out;
      // (Tried, twentieth session of 2026-11-27, bench/NOTES.md runs 4-8: these loads with
      // L2's evict_last hint, each line demoted to evict_normal after its store. In turns
      // on the latency suite's inputs (H100, two passes), plain / hinted: W2a 1.008-1.011x,
      // W2b 1.013-1.014x, 512 MB 1.008-1.009x, 128 MB 1.004x out of place. Not kept: under
      // the >= 1.01x at W2a, W2b and 128 MB set before that run; its cost where the tiles
      // take small calls not measured; and a line whose start this kernel does not load
      // (in place with R < D off a 128-byte line, rows not a multiple of 128 bytes) stays
      // pinned. The hint without the demotion leaves the dead lines in L2's persisting
      // set-aside, as torch.compile's kernels do: a 30 MB read after it 16.1 -> 23.1 us.)
      a[u] = load_vec<VecT>(in + d0);
      if (pair) b[u] = load_vec<VecT>(in + d1);
    }
  }

  // rot: a rotary chunk whose P pairs start at pair index i0 (else a tail chunk).
  __device__ __forceinline__ void store(const float* cos_tab, const float* sin_tab, int half, int lr0, int step,
                                        int n, int d0, int d1, bool rot, int i0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (lr0 + u * step >= n) break;
      if (rot) {
        float sn[P], cs[P];
        load_table<P>(cos_tab + gl[u] * half + i0, cs);
        load_table<P>(sin_tab + gl[u] * half + i0, sn);
        rotate_chunk<T, kInterleaved>(a[u], b[u], sn, cs);
      }
      store_vec(out[u] + d0, a[u]);
      if (rot && !kInterleaved) store_vec(out[u] + d1, b[u]);
    }
  }
};

template <typename T, bool kInterleaved>
__global__ void __launch_bounds__(kTileThreads, kTileMinBlocks) rope_tile_kernel(const __grid_constant__ RopeParams p,
                                                                                const TileShape ts) {
  constexpr int U = kTileRowsInFlight;
  using Rows = TileRows<T, kInterleaved, U>;
  constexpr int V = Rows::V, P = Rows::P;
  extern __shared__ float4 tile_smem[];
  float* cos_tab = reinterpret_cast<float*>(tile_smem);  // [groups of the tile][R/2]
  float* sin_tab = cos_tab + ts.table_stride;

  const int half = p.R / 2;
  const int n_rot = rot_chunks(p, V), chunks = row_chunks(p, V);
  const int64_t NB = batches_per_group(p);
  const uint32_t rows_g = static_cast<uint32_t>(rows_per_group(p));
  const int64_t f0 = blockIdx.x * ts.rows;  // the tile's first row
  const int n = static_cast<int>(min(ts.rows, num_groups(p) * rows_g - f0));
  const int64_t g_first = f0 / rows_g;  // one 64-bit divide per block
  const uint32_t r_first = static_cast<uint32_t>(f0 - g_first * rows_g);
  const int groups = static_cast<int>((r_first + n - 1) / rows_g) + 1;

  // 1. The first loads go out before the sin/cos work, which then hides their latency.
  const int step = blockDim.y;
  int c = threadIdx.x, lr0 = threadIdx.y;
  Rows rows;
  int d0 = chunk_start(p, c, V);
  bool have = c < chunks && lr0 < n;
  if (have) rows.load(p, NB, rows_g, g_first, r_first, lr0, step, n, d0, d0 + half, !kInterleaved && c < n_rot);

  // 2. The cos/sin table of the tile's groups.
  fill_sincos_table(p, g_first, groups, cos_tab, sin_tab);
  __syncthreads();

  // 3. Rotate and store, then the next rows of this chunk, then the next chunk.
  while (have) {
    rows.store(cos_tab, sin_tab, half, lr0, step, n, d0, d0 + half, c < n_rot, c * P);
    lr0 += U * step;
    if (lr0 >= n) {
      c += blockDim.x;
      lr0 = threadIdx.y;
      d0 = chunk_start(p, c, V);
    }
    have = c < chunks && lr0 < n;
    if (have) rows.load(p, NB, rows_g, g_first, r_first, lr0, step, n, d0, d0 + half, !kInterleaved && c < n_rot);
  }
}

// ---------------------------------------------------------------- 5. flat
// For small tensors, whose time is the launch plus one DRAM round trip: no shared
// memory, no barrier, no loop over tiles; every thread is independent. A thread owns
// one 16-byte chunk c (of each half, for neox) of a set of rows of one token group g:
// rows rs, rs + RS, rs + 2 RS, ... of the group (heads of q, then of k, times the batch
// when positions are shared). It issues the position load and the loads of its first
// rows, computes the chunk's P sin/cos (those latencies overlap), then rotates and
// stores each row, reusing sin/cos for all of them. Thread index = (g, rs, c) with c
// fastest: a warp covers consecutive chunks of consecutive rows (coalesced). The host
// (launch_flat) picks RS so the grid fills the GPU even at T = 16 (one row per
// thread), and lowers it for larger tensors to amortise sin/cos over more rows.
struct FlatShape {
  int64_t threads;   // groups * row_sets * chunks
  int32_t chunks;    // 16-byte chunks of a row (row_chunks)
  int32_t row_sets;  // RS: threads sharing one (group, chunk)
};
constexpr int kFlatMaxThreads = 128;   // per block (fewer when the grid is small)
constexpr int kFlatRowsInFlight = 4;   // rows loaded before the first is used

// A pair's position with several position axes (M-RoPE, axial), out of line: inlined
// into the unrolled per-pair loop it made P copies of position_of (cu_seqlens search,
// context parallelism) and doubled the kernel's code, which a latency-bound kernel
// pays in cold instruction fetch even when it never runs that path.
static __device__ __noinline__ int64_t pair_position_outlined(const RopeParams& p, int64_t b0, int64_t s, int i) {
  return pair_position(p, b0, s, i);
}

// The P sin/cos of the pairs i0 .. i0 + P - 1 of a token at `pos` (one axis), or of
// (b0, s) (several axes), scaled and signed as pair_sincos does. The branches on the
// frequency source and the axes are taken once, outside the unrolled loops, so the P
// angle reductions and sincospif are independent straight-line code that the compiler
// interleaves; per pair (pair_sincos in the loop) they compiled to P serial branchy
// blocks, a chain of P sin/cos latencies on the critical path of a decode step.
template <int P>
__device__ __forceinline__ void chunk_sincos(const RopeParams& p, int64_t b0, int64_t s, int64_t pos, int i0,
                                             float* sn, float* cs) {
  if (p.freq == FreqSource::kCosSinCache || p.num_axes > 1) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int i = i0 + j;
      pair_sincos(p, p.num_axes > 1 ? pair_position_outlined(p, b0, s, i) : pos, i, inv_freq_of(p, i), &sn[j],
                  &cs[j]);
    }
    return;
  }
  float f[P];
  if (p.freq == FreqSource::kBase) {
#pragma unroll
    for (int j = 0; j < P; ++j) f[j] = p.base_freqs[i0 + j];
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j) f[j] = p.inv_freq[(i0 + j) * p.inv_freq_stride];
  }
  const float ss = p.sign * p.scale;
  angle_sincos_chunk<P>(pos, f, sn, cs);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    sn[j] *= ss;
    cs[j] *= p.scale;
  }
}

template <typename T, bool kInterleaved>
__global__ void __launch_bounds__(kFlatMaxThreads) rope_flat_kernel(const __grid_constant__ RopeParams p,
                                                                   const FlatShape fs) {
  constexpr int U = kFlatRowsInFlight;
  constexpr int V = 16 / sizeof(T);
  constexpr int P = kInterleaved ? V / 2 : V;
  using VecT = Vec<T, V>;
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= fs.threads) return;
  // (g, rs, c) from idx: 32-bit divides unless the grid is huge (an explicit impl on a
  // large tensor); a 64-bit divide is a long subroutine.
  int64_t g;
  uint32_t rs, c;
  if ((static_cast<uint64_t>(fs.threads) >> 32) == 0) {
    const uint32_t i = static_cast<uint32_t>(idx), rest = i / static_cast<uint32_t>(fs.chunks);
    c = i - rest * static_cast<uint32_t>(fs.chunks);
    const uint32_t g32 = rest / static_cast<uint32_t>(fs.row_sets);
    rs = rest - g32 * static_cast<uint32_t>(fs.row_sets);
    g = g32;
  } else {
    const int64_t rest = idx / fs.chunks;
    c = static_cast<uint32_t>(idx - rest * fs.chunks);
    g = rest / fs.row_sets;
    rs = static_cast<uint32_t>(rest - g * fs.row_sets);
  }
  int64_t b0, s;
  group_token(p, g, &b0, &s);
  const int64_t NB = batches_per_group(p);
  const uint32_t rows_g = static_cast<uint32_t>(rows_per_group(p));
  const uint32_t RS = static_cast<uint32_t>(fs.row_sets);
  const int half = p.R / 2;
  const bool rot = static_cast<int>(c) < rot_chunks(p, V);
  const bool pair = rot && !kInterleaved;
  const int d0 = chunk_start(p, c, V), d1 = d0 + half;
  // The position load goes out first: it heads the longest chain (position -> sin/cos,
  // and -> cache row with a cos_sin_cache); the x loads below do not wait on it.
  const int64_t pos = p.num_axes > 1 ? 0 : position_of(p, b0, s);

  VecT a[U], b[U];
  T* out[U];
  float sn[P], cs[P];
  for (uint32_t r0 = rs; r0 < rows_g; r0 += U * RS) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint32_t r = r0 + u * RS;
      if (r >= rows_g) break;
      const RowOffsets o = row_offsets(p, NB, b0, s, r);
      // Selects, not p.t[o.t] (variant 4's note).
      const T* in = static_cast<const T*>(o.t ? p.t[1].in : p.t[0].in) + o.in;
      out[u] = static_cast<T*>(o.t ? p.t[1].out : p.t[0].out) + o.out;
      a[u] = load_vec<VecT>(in + d0);
      if (pair) b[u] = load_vec<VecT>(in + d1);
    }
    if (rot && r0 == rs) chunk_sincos<P>(p, b0, s, pos, static_cast<int>(c) * P, sn, cs);  // once, loads in flight
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r0 + u * RS >= rows_g) break;
      if (rot) rotate_chunk<T, kInterleaved>(a[u], b[u], sn, cs);
      store_vec(out[u] + d0, a[u]);
      if (pair) store_vec(out[u] + d1, b[u]);
    }
  }
}

// ---------------------------------------------------------------- 6. lean
// One thread: chunk c (16 bytes of each half for neox, of the row for GPT-J) of rows r,
// r + RB, ... (U of them) of token (b, s), rows = q's heads then k's. The host
// (launch_lean) picks U, RB and the tokens a block (blockDim.y, one but where a token has
// few threads); the chunks per row are a power of two (shift, mask).
// Laid out for the constant cache: after an L2 flush each 64-byte line of constant bank
// 0 is a DRAM round trip the first time it is read, and the compiler reads a kernel's
// pointers with LDC / ULDC at its top, ahead of the first loads. The parameters start
// at c[0x0][0x210], so their first 48 bytes share the line at 0x200 with the global
// memory descriptor (c[0x0][0x208]) that every load reads anyway. Those 48 bytes hold
// all a thread needs to issue its x and frequency loads, and the flags (the compiler
// decodes them near the top: from a later line they made the x loads wait for it); the
// rest (outputs, scales, the offset; then the position tensors and the table, read only
// under their flags) is needed after those loads are in flight. Measured (H200, bench/
// NOTES.md, 2026-11-26): graph medians first suggested a second line cost 0.3 us (run 1),
// but ncu timing each kernel alone found none (run 3: 2.56 vs 2.50 us), and this layout
// gained nothing measurable (run 2). Kept: no loss, and a call without position tensors
// no longer reads their line. rope_lean_plain1_kernel's cache instance ran ~0.5 us faster in
// graph replays in turns once its table's pointer came from line 0x200 instead of p.cache
// (line 0x280, first read at the row's address; H100, bench/latency_rows.py, twenty-ninth
// session runs 2-3, its comment has the numbers), but that change also dropped the row's
// range check, stride multiply and dtype branch, so whether the line was the cost is not
// settled. The general instance reads the position tensors' pointers from that line the
// same way, under the flags, and there it measured no cost: with a dense positions
// tensor's pointer in line 0x200 instead
// (in the head strides' slot where heads lie R apart; the position load then issued with
// no read past line 0x200 before it, SASS checked) W5 and bshd bf16 with int64 positions
// at 0.125 / 0.5 MB moved -0.16 to +0.16 us against this layout, in turns over three passes
// (H100, bench/latency_rows.py, thirtieth session run 1; bench/NOTES.md); not kept.
// An input's token offset is one stride times (b * S + s), plus b times a correction
// (its batch stride less S token strides) read from the second line only where a bit in
// line 0 says some tensor needs one (B > 1 and S > 1 in the sbhd and bhsd layouts; sbhd
// calls whose positions the batch shares run folded, B = 1, and need none).
// Strides are 32-bit, head counts 16-bit (the host checks they fit); R / 2 is chunks * P.
constexpr uint8_t kLeanShiftMask = 15, kLeanBatchFix = 128;  // LeanParams::cshift's bits
enum LeanFlags : uint16_t {
  kLeanPos = 1,     // a positions tensor
  kLeanPos64 = 2,
  kLeanOff = 4,     // an offsets tensor
  kLeanOff64 = 8,
  kLeanSeq = 16,    // one packed sequence: cu_seqlens[0] is subtracted from s
  kLeanSeq64 = 32,
  kLeanCacheVec = 64,  // a table chunk's cos (and sin) by vector loads: unit columns, fp32 or x's dtype, aligned
};
struct LeanParams {
  // bytes 0-47 (line 0x200): the x and frequency loads
  const void* in[kMaxTensors];
  const float* inv_freq;   // unit stride (rope_lean_plain1_kernel's cache instances: the cos_sin_cache)
  int32_t in_ts[kMaxTensors];  // element stride of a token (b * S + s)
  int32_t in_hs[kMaxTensors];  // element stride of a head
  uint8_t cshift;          // log2(chunks per row) | kLeanBatchFix where in_bfix is needed
  uint8_t rows_per_block;  // RB
  int16_t rows;            // heads of q + k
  int16_t H0;              // q's heads (rows >= H0 are k's)
  uint16_t flags;          // LeanFlags (here: the position code's branches must not wait for a later line)
  // bytes 48-111 (line 0x240): after the loads
  void* out[kMaxTensors];
  int32_t out_s[kMaxTensors][3];  // element strides b, s, h
  float sin_scale, cos_scale;  // sign * scale, scale (as pair_sincos applies them)
  int64_t offset;
  int32_t in_bfix[kMaxTensors];  // under kLeanBatchFix: batch stride - S * in_ts
  // bytes 112-175 (line 0x280): under the flags
  const void* positions;   // [b * pos_stride_b + s * pos_stride], or null
  const void* offsets;     // [b * off_stride] (or [0] with one packed sequence), or null: `offset`
  const void* seq_start;   // cu_seqlens (its element 0), or null
  const void* cache;       // a cos_sin_cache [cache_rows, R] (read, not computed), or null: inv_freq
  int32_t pos_stride, pos_stride_b, off_stride;
  int32_t cache_stride_row, cache_stride_col, cache_rows;
  DType cache_dtype;
  int32_t lane_zero;       // 0 (see the position loads)
};
static_assert(offsetof(LeanParams, out) == 48 && offsetof(LeanParams, positions) == 112 && sizeof(LeanParams) <= 176,
              "LeanParams: the lines at 0x200, 0x240 and 0x280 in order of use");
constexpr int kLeanMaxThreads = 128;

// The block's sin/cos table (kSource 1): a lean block with the table holds one token, so its R / 2
// sin/cos are computed once, by one thread per pair, into shared memory, and each thread
// reads its chunk's P from there after a barrier. Per-lane sin/cos (kSource 0) computes
// each pair once per row slot of the block: 8 times at 32 heads and 16 chunks. A block of
// one row slot takes kSource 0 (launch_lean: the table would be shared with no one). The
// shared-memory form of the minimal kernel (bench/small_rope_study.py, lean_smem4) ran
// at 2 MB 5.44 us against lean's 6.0-6.4 and at 8 MB 8.06 against 9.2 (H200, run 2 of
// 2026-11-26), where the sin/cos issue work, not DRAM, set the time. It replaced two
// lanes sharing by shuffles (K = 2), which halved the work per lane at most.
// N consecutive table elements as fp32, by the widest aligned loads that hold them (the
// host checks the alignment): a chunk's cos or sin from a cos_sin_cache row, or from the
// block's shared table.
template <typename E, int N>
__device__ __forceinline__ void load_row_chunk(const E* ptr, float* out) {
  constexpr int B = N * static_cast<int>(sizeof(E));
  using Word = std::conditional_t<B >= 16, uint4, std::conditional_t<B == 8, uint2,
               std::conditional_t<B == 4, uint32_t, uint16_t>>>;
  constexpr int NW = B >= 16 ? B / 16 : 1, PER = static_cast<int>(sizeof(Word) / sizeof(E));
#pragma unroll
  for (int w = 0; w < NW; ++w) {
    const Word x = reinterpret_cast<const Word*>(ptr)[w];
    const E* e = reinterpret_cast<const E*>(&x);
#pragma unroll
    for (int m = 0; m < PER; ++m) out[w * PER + m] = static_cast<float>(e[m]);
  }
}

// The table's pairs past the block's threads (blocks narrower than R / 2: few rows),
// out of line: inline, this loop's ~1.1 KB of code sat in the middle of every call's
// straight path, streamed (cold after an L2 flush) and jumped over.
static __device__ __noinline__ void lean_table_rest(float* table, int half, int64_t at, const float* inv_freq,
                                             float sin_scale, float cos_scale) {
  for (int i = threadIdx.x + blockDim.x; i < half; i += blockDim.x) {
    float fi = inv_freq[i], si, ci;
    angle_sincos_chunk<1>(at, &fi, &si, &ci);
    table[i] = si * sin_scale;
    table[half + i] = ci * cos_scale;
  }
}

// kSource: 0 sin/cos computed by each lane, 1 the block's table in shared memory
// (2 * R / 2 floats of dynamic shared memory), 2 read from p.cache. A template argument,
// not a branch: with the table code in the same instance the compiler laid it out as the
// fall-through and the sin/cos path behind a ~2.5 KB jump, whatever the branch's
// expectation. Measured no faster without (run 5 of the night of 2026-11-25/26); kept
// for the 200 fewer instructions per instance.
// kPlain: a call without position tensors (positions, offsets, cu_seqlens), the
// position s + offset: the position code (~850 bytes of SASS between the loads and the
// sin/cos, jumped over by such calls but streamed with the code around it) is not in
// the instance.
// kHint: x loaded with L2's evict_last hint and each 128-byte line of it given back the
// normal priority after its rows are stored (load_word_last, l2_demote_line; launch_lean
// takes it only where every line of x is started by some chunk, so none stays held).
template <typename T, bool kInterleaved, int U, int W, int kSource, bool kPlain = false, bool kHint = false>
__global__ void __launch_bounds__(kLeanMaxThreads) rope_lean_kernel(const __grid_constant__ LeanParams p) {
  constexpr bool kTable = kSource == 1, kCache = kSource == 2;
  static_assert(!(kPlain && kCache), "a cos_sin_cache call reads its rows by position: no plain instance");
  constexpr int V = W / sizeof(T);
  constexpr int P = kInterleaved ? V / 2 : V;
  static_assert(P >= 1, "a chunk holds at least one pair");
  using VecT = Vec<T, V>;
  using Word = typename LeanWord<W>::type;
  const int cshift = p.cshift & kLeanShiftMask;
  const int c = threadIdx.x & ((1 << cshift) - 1);
  const int r0 = blockIdx.x * (p.rows_per_block * U) + (threadIdx.x >> cshift);
  // The block's tokens: blockDim.y consecutive ones (launch_lean: more than one only where a
  // token has few threads, sin/cos then per lane; S = gridDim.y * blockDim.y exactly).
  const int64_t b = blockIdx.z, s = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  const int64_t tok = b * (int64_t(gridDim.y) * blockDim.y) + s;
  const int d0 = c * V, d1 = d0 + (V << cshift);  // neox: the second half starts R / 2 = chunks * V in
  const int half = P << cshift;                     // R / 2: pairs per row

  // 0. With the block's table, its one frequency load first: it heads the chain (load,
  //    sin/cos, barrier), and U rows' address code in front of it delayed it (U = 4:
  //    ~170 instructions, run 4 of 2026-11-26).
  float f[kTable ? 1 : P];  // the table: pair threadIdx.x's; else the chunk's P
  if constexpr (kTable) f[0] = threadIdx.x < half ? p.inv_freq[threadIdx.x] : 0.f;
  // Per-lane sin/cos at U = 1: the chunk's frequencies first too. Behind x's load they
  // waited for x (the compiler unpacked x right after its load; step 4's pin_word), so
  // they went out one DRAM round trip late. With this and pin_word together the kPlain
  // per-lane instance went 3.62 -> 3.46 us (ncu, 0.12 MB, runs 5-6 of the ninth session
  // of 2026-11-26; the table 3.26; since the twenty-eighth session such calls run
  // rope_lean_plain1_kernel, and this instance only under set_lean_plain1(False)). At U > 1 loading them first lost
  // 20-25% at 8-32 MB (the note at step 2).
  constexpr bool kFreqFirst = !kTable && !kCache && U == 1;
  if constexpr (kFreqFirst) {
#pragma unroll
    for (int j = 0; j < P; ++j) f[j] = p.inv_freq[c * P + j];
  }

  // 1. The x loads. Selects, not p.in[t] (older compilers copied the parameters to
  //    local memory for a runtime index; nvcc 13 reads a __grid_constant__ array
  //    indexed at run time with one LDC, ninth session of 2026-11-26, but the selects
  //    were not re-measured against it). (Tried, seventh session of 2026-11-26, run G: at U >= 4,
  //    where a block's rows lie in one tensor, the tensor chosen once and the rows stepped
  //    by RB head strides: ~320 fewer instructions a warp of ~970 at U = 8, and no gain
  //    measurable in turns: 8 MB -0.1 us, 32 MB +0.1, within the noise. Those calls are
  //    DRAM-bound; reverted.)
  Word xa[U], xb[U];
  const T* src[kHint ? U : 1];  // (kHint: the rows' inputs, whose lines are demoted after the stores)
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int r = r0 + u * p.rows_per_block;
    if (r >= p.rows) break;
    const bool k = r >= p.H0;
    const int64_t h = k ? r - p.H0 : r;
    // One offset, then the pointer: tok * ts alone may lie past the tensor (sbhd).
    int64_t off = tok * (k ? p.in_ts[1] : p.in_ts[0]) + h * (k ? p.in_hs[1] : p.in_hs[0]);
    if (p.cshift & kLeanBatchFix) off += b * (k ? p.in_bfix[1] : p.in_bfix[0]);
    const T* in = static_cast<const T*>(k ? p.in[1] : p.in[0]) + off;
    if constexpr (kHint) {
      src[u] = in;
      xa[u] = load_word_last<Word>(in + d0);
      if (!kInterleaved) xb[u] = load_word_last<Word>(in + d1);
    } else {
      xa[u] = *reinterpret_cast<const Word*>(in + d0);
      if (!kInterleaved) xb[u] = *reinterpret_cast<const Word*>(in + d1);
    }
  }

  // 2. The frequencies' loads right behind x's (at U > 1; at U = 1 above): they depend
  //    on nothing but the chunk, so they go out before the position code's branches and
  //    loads (which had put a second constant miss and, for packed sequences, the
  //    cu_seqlens[0] load in front of them: issue 19, bench/NOTES.md night of
  //    2026-11-25/26). (ncu's SASS page showed x unpacked inside the loop above before
  //    later loads issued, until step 4's pin_word; loading the frequencies before x's
  //    with the x loop predicated gained 0.1 us at 0.12 MB and lost 20-25% at 8-32 MB:
  //    run 6 of the night of 2026-11-24, reverted.)
  //    (The table's threads loaded the frequency of pair threadIdx.x above; more pairs
  //    than threads, at most P per thread, load theirs in lean_table_rest.)
  if constexpr (!kTable && !kCache && !kFreqFirst) {
#pragma unroll
    for (int j = 0; j < P; ++j) f[j] = p.inv_freq[c * P + j];
  }
  // 3. The position (position_of's rules for the cases the host lets through): a
  //    positions tensor; else s plus an offsets tensor's entry, less cu_seqlens[0] (one
  //    packed sequence); else s + offset less cu_seqlens[0]. Which of them comes from the
  //    flags (line 0), so a call without position tensors never touches line 2. The
  //    loads stay raw 32-bit words until the sin/cos below are done: a conversion next
  //    to a load (the compiler put load_index's int32 sign extension there) waits for
  //    it, and with in-order issue the sin/cos behind it.
  const uint32_t fl = kPlain ? 0u : p.flags;
  const bool has_pos = fl & kLeanPos, has_off = fl & kLeanOff, has_seq = fl & kLeanSeq;
  const bool a64 = has_pos ? (fl & kLeanPos64) : has_off ? (fl & kLeanOff64) : (fl & kLeanSeq64);
  const bool b64 = fl & kLeanSeq64;
  const bool two = !has_pos && has_off && has_seq;  // load b: cu_seqlens[0] beside an offset
  RawIndex ra, rb;  // (primitives.cuh)
  if (fl & (kLeanPos | kLeanOff | kLeanSeq)) {
    // Load a: the position, the offset, or cu_seqlens[0]. (+ threadIdx.x & lane_zero,
    // which is 0: the compiler moved a uniform load's value to a uniform register
    // (R2UR) right where it lands, which waits for it; a per-lane address keeps it in
    // the thread's registers until its first real use.)
    const void* a_ptr = has_pos ? p.positions : has_off ? p.offsets : p.seq_start;
    const int64_t z = threadIdx.x & p.lane_zero;
    const int64_t a_at = (has_pos ? b * p.pos_stride_b + s * p.pos_stride : has_off && !has_seq ? b * p.off_stride : 0) + z;
    ra = load_raw_index(a_ptr, a_at, a64);
    if (two) rb = load_raw_index(p.seq_start, z, b64);
  }
  const auto loaded = [&] {
    const int64_t va = raw_index(ra, a64), vb = raw_index(rb, b64);  // 0 where not loaded
    return has_pos ? va : has_off ? s + va - vb : s + p.offset - va;
  };
  float sn[P], cs[P];
  if constexpr (!kCache) {
    // Without a positions or offsets tensor, sin/cos start from the guess s + offset
    // while cu_seqlens[0] is in flight (it is 0 in every valid call) and are computed
    // again where the loaded position differs: one loop body (a second copy would be
    // more cold code to fetch). With a tensor the position is waited for. With the
    // table every lane of a block has the same token, so the trip count is the block's
    // (the table's barrier below sees every thread); blocks of several tokens compute
    // per lane and have no barrier.
    const bool guessed = !has_pos && !has_off;
    int64_t at = s + p.offset;
    if (!guessed) at = loaded();
    extern __shared__ __align__(16) float lean_table[];  // kTable: sin * sin_scale [half], then cos * cos_scale [half]
    for (;;) {
      float last;
      if constexpr (kTable) {
        const auto put = [&](int i, float fi) {  // pair i's sin and cos, scaled, into the table
          float si, ci;
          angle_sincos_chunk<1>(at, &fi, &si, &ci);
          lean_table[i] = si * p.sin_scale;
          lean_table[half + i] = ci * p.cos_scale;
          return ci;
        };
        last = threadIdx.x < half ? put(threadIdx.x, f[0]) : 0.f;
        if (threadIdx.x + blockDim.x < half) lean_table_rest(lean_table, half, at, p.inv_freq, p.sin_scale, p.cos_scale);
      } else {
        angle_sincos_chunk<P>(at, f, sn, cs);
        last = cs[0];
      }
      // (An empty asm that rewrites the raw words after the sin/cos: the compiler can
      // neither hoist loaded() out of the loop nor place it before them.)
      asm volatile("" : "+r"(ra.lo), "+r"(ra.hi), "+r"(rb.lo), "+r"(rb.hi) : "f"(last));
      const int64_t want = loaded();
      if (at == want) break;
      at = want;
    }
    if constexpr (kTable) {
      __syncthreads();
      load_row_chunk<float, P>(lean_table + c * P, sn);  // aligned: half is a multiple of P
      load_row_chunk<float, P>(lean_table + half + c * P, cs);
    } else {
#pragma unroll
      for (int j = 0; j < P; ++j) {
        sn[j] *= p.sin_scale;
        cs[j] *= p.cos_scale;
      }
    }
  } else {  // pair_sincos's rule: a position outside [0, cache_rows) gives NaN (row 0 is read
            // and discarded: the host refuses an empty table)
    const int64_t pos = loaded();
    const bool in_range = pos >= 0 && pos < p.cache_rows;
    const int64_t row = (in_range ? pos : 0) * p.cache_stride_row;
    // (Tried and reverted, run 1 of the night of 2026-11-25: at U = 1 the position and
    // these loads before x's, so that the table was not the chain's last load: 0.12 MB
    // 4.8 -> 5.2 us, 0.5 MB 5.0 -> 5.6; x's loads issued after the position and table
    // code cost more than the table's late issue.)
    if (fl & kLeanCacheVec) {  // scalar loads through load_float's dtype switch cost ~1 us here (run 7)
      const int64_t at = row + c * P;
      if (p.cache_dtype == DType::kFloat32) {
        load_row_chunk<float, P>(static_cast<const float*>(p.cache) + at, cs);
        load_row_chunk<float, P>(static_cast<const float*>(p.cache) + at + half, sn);
      } else {
        load_row_chunk<T, P>(static_cast<const T*>(p.cache) + at, cs);
        load_row_chunk<T, P>(static_cast<const T*>(p.cache) + at + half, sn);
      }
    } else {
#pragma unroll
      for (int j = 0; j < P; ++j) {
        const int64_t col = static_cast<int64_t>(c * P + j) * p.cache_stride_col;
        cs[j] = load_float(p.cache, p.cache_dtype, row + col);
        sn[j] = load_float(p.cache, p.cache_dtype, row + col + static_cast<int64_t>(half) * p.cache_stride_col);
      }
    }
    if (!in_range) {
#pragma unroll
      for (int j = 0; j < P; ++j) cs[j] = sn[j] = std::numeric_limits<float>::quiet_NaN();
    }
#pragma unroll
    for (int j = 0; j < P; ++j) {
      sn[j] *= p.sin_scale;
      cs[j] *= p.cos_scale;
    }
  }

  // 4. Rotate and store. x unpacked only here (pin_word): the compiler had put the
  //    unpack right behind x's load, where its wait for x held back everything after it
  //    (in-order issue): the position loads of calls with cu_seqlens / positions /
  //    offsets went out a DRAM round trip late. 0.12 MB thd with cu_seqlens, the table
  //    instance, 3.94 -> 3.65 us (ncu, runs 5-6 of the ninth session of 2026-11-26); the
  //    table instance of calls without position tensors unchanged (3.55 -> 3.58: its
  //    sin/cos wait for the frequency load, which returns with x's).
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int r = r0 + u * p.rows_per_block;
    if (r >= p.rows) break;
    pin_word(xa[u]);
    if constexpr (!kInterleaved) pin_word(xb[u]);
    const bool k = r >= p.H0;
    const int64_t h = k ? r - p.H0 : r;
    T* out = static_cast<T*>(k ? p.out[1] : p.out[0]) + b * (k ? p.out_s[1][0] : p.out_s[0][0]) +
             s * (k ? p.out_s[1][1] : p.out_s[0][1]) + h * (k ? p.out_s[1][2] : p.out_s[0][2]);
    VecT va, vb;
    *reinterpret_cast<Word*>(&va) = xa[u];
    if (!kInterleaved) *reinterpret_cast<Word*>(&vb) = xb[u];
    rotate_chunk<T, kInterleaved>(va, vb, sn, cs);
    *reinterpret_cast<Word*>(out + d0) = *reinterpret_cast<const Word*>(&va);
    if (!kInterleaved) *reinterpret_cast<Word*>(out + d1) = *reinterpret_cast<const Word*>(&vb);
    if constexpr (kHint) {
      l2_demote_line(src[u] + d0);
      if (!kInterleaved) l2_demote_line(src[u] + d1);
    }
  }
}

// Variant 6, plain1: rope_lean_kernel's kPlain work at one row a thread and one token a
// block (U = 1, blockDim.y = 1, no batch correction, no L2 hint), written as the study's
// minimal lean_nopos (bench/small_rope_study.cu): a thread without a row returns at once,
// its input and output rows' pointers are computed before its loads, the chunk's
// frequencies load beside x's, each lane computes its own sin/cos, no loop and no table.
// Bit-equal to rope_lean_kernel (the same angle_sincos_chunk, scales and rotate_chunk).
// (Its cache instances, kSource 2 / 3 below, read the chunk's cos / sin instead, bit-equal
// to rope_lean_kernel's cache instance.)
// Why a kernel of its own: in the suite's regime (ncu --cache-control none, after the
// flush's 256 MB write; twenty-eighth session, bench/NOTES.md runs 1 and 4) lean_nopos ran
// at 3.65-3.68 us at bf16 [64, 32, 128] against 3.87-4.03 for rope_lean_kernel's table
// instance and 4.19 for its per-lane one launched alike, torch.compile's kernel 3.71-3.94;
// at [16, 32, 128] 3.07 against 3.26-3.33. What in rope_lean_kernel's code
// costs that was not found (its output-pointer chain, the guess loop and the early
// return were moved as here without gain: run 3 of that session).
// kSource: 0 sin/cos per lane; 2 cos / sin read from a cos_sin_cache in x's dtype, 3 from
// an fp32 one, at row s + offset (a plain call; launch_lean takes this only where every such
// row is in the table, for a contiguous [rows, R] table whose chunks load as vectors; a
// row outside it would be read, not given NaN as rope_lean_kernel's cache instance does).
// The table's pointer comes in p.inv_freq's slot (line 0x200), its row stride is R, no
// range check: nothing from p.cache's line (0x280), first read at the row's address. Which
// of the two (that line's constant miss after the L2 flush, or the address code it came
// with) cost the form below 0.5 us is not settled (LeanParams' note). H100, in turns, three passes (bench/
// latency_rows.py --knobs noplain1, twenty-ninth session), us, bf16 [1, S, 32, 128] with a
// bf16 table, this / rope_lean_kernel's cache instance / torch.compile of the cached
// formula: with p.cache, cache_stride_row and cache_dtype read from line 0x280 (run 2)
// 0.125 MB 4.86-4.96 / 4.93-5.02 / 4.42-4.48, 0.5 MB 5.12-5.22 / 5.12-5.18 / 4.74-4.90; from
// line 0x200 (run 3) 0.125 MB 4.32-4.54 / 4.86-4.99 / 4.35-4.38, 0.5 MB 4.70-4.83 / 5.18-5.22 /
// 4.61-4.70, 1 MB 5.22-5.38 / 5.28-5.41 / 5.22-5.38.
// (Tried, twenty-ninth session run 1: the block's table, kSource 1 as rope_lean_kernel's,
// in this structure; it lost at every size, us in turns over three passes, table / per
// lane: bf16 [1, 16, 32, 128] 4.64-4.86 / 4.42-4.61, [1, 64, 32, 128] 4.93-5.12 /
// 4.86-4.93, [1, 128, 32, 128] 5.34-5.50 / 5.28-5.41. Removed.)
// (Tried, thirty-first session run 1: the warp's K = 32 / chunks lanes of a chunk each
// computing P / K of its pairs and swapping them by 2P shuffles; at bf16's W = 8 K = 2, two
// of a lane's four pairs. No gain, us in turns over three passes, out of place,
// shared / per lane: bf16 [1, 16, 32, 128] 4.54-4.67 / 4.42-4.51, [1, 64, 32, 128] 4.70-4.83
// / 4.64-4.86, [1, 128, 32, 128] 5.31-5.34 / 5.12-5.31 (docs/h100_share1_s31.txt; fp32 at W
// = 8 has 32 chunks a row, K = 1, so its two columns ran one kernel: 4.48-4.74, the noise).
// Removed: the sin/cos after the loads are not this call's time.)
// (Tried, thirty-third session run 4: one packed sequence (thd, cu_seqlens alone) here too,
// cu_seqlens[0] loaded after x's and the frequencies, sin/cos from the guess s + offset and
// again where the start is not 0, in one loop body. Against rope_lean_kernel's general table
// instance it lost at 0.5-2 MB and gained in one pass of two at 0.125 MB, us in turns, two
// passes, out of place, this / that: thd bf16 [16, 32, 128] 4.74, 4.77 / 4.90, 4.77; [64, 32, 128] 5.12, 5.09 / 5.02, 4.93;
// [256, 32, 128] 6.24, 6.24 / 6.05, 6.08 (the bshd call of [64, 32, 128]'s bytes here: 4.77,
// 4.80; torch.compile 4.70 for thd's), docs/h100_thd_seq_s33.txt. So thd's 0.13-0.25 us over
// bshd at 0.5 MB there comes with its cu_seqlens load (or the parameter line it reads the
// pointer from), not the table instance. Removed.)
template <typename T, bool kInterleaved, int W, int kSource = 0>
__global__ void __launch_bounds__(kLeanMaxThreads) rope_lean_plain1_kernel(const __grid_constant__ LeanParams p) {
  static_assert(kSource == 0 || kSource == 2 || kSource == 3, "per-lane sin/cos or the cache");
  constexpr int V = W / sizeof(T);
  constexpr int P = kInterleaved ? V / 2 : V;
  static_assert(P >= 1, "a chunk holds at least one pair");
  using VecT = Vec<T, V>;
  using Word = typename LeanWord<W>::type;
  const int cshift = p.cshift & kLeanShiftMask;
  const int c = threadIdx.x & ((1 << cshift) - 1);
  const int r = blockIdx.x * p.rows_per_block + (threadIdx.x >> cshift);
  const int64_t b = blockIdx.z, s = blockIdx.y, tok = b * gridDim.y + s;
  const int d0 = c * V, d1 = d0 + (V << cshift);
  if (r >= p.rows) return;
  const bool k = r >= p.H0;
  const int64_t h = k ? r - p.H0 : r;
  const int64_t off = tok * (k ? p.in_ts[1] : p.in_ts[0]) + h * (k ? p.in_hs[1] : p.in_hs[0]);
  const T* in = static_cast<const T*>(k ? p.in[1] : p.in[0]) + off;
  T* out = static_cast<T*>(k ? p.out[1] : p.out[0]) + b * (k ? p.out_s[1][0] : p.out_s[0][0]) +
           s * (k ? p.out_s[1][1] : p.out_s[0][1]) + h * (k ? p.out_s[1][2] : p.out_s[0][2]);
  const Word xa = *reinterpret_cast<const Word*>(in + d0);
  Word xb{};
  if constexpr (!kInterleaved) xb = *reinterpret_cast<const Word*>(in + d1);
  float sn[P], cs[P];
  if constexpr (kSource >= 2) {
    using E = std::conditional_t<kSource == 2, T, float>;
    const int64_t half = P << cshift;
    const E* row = reinterpret_cast<const E*>(p.inv_freq) + (s + p.offset) * (2 * half) + c * P;
    load_row_chunk<E, P>(row, cs);
    load_row_chunk<E, P>(row + half, sn);
  } else {
    float f[P];
#pragma unroll
    for (int j = 0; j < P; ++j) f[j] = p.inv_freq[c * P + j];
    angle_sincos_chunk<P>(s + p.offset, f, sn, cs);
  }
#pragma unroll
  for (int j = 0; j < P; ++j) {
    sn[j] *= p.sin_scale;
    cs[j] *= p.cos_scale;
  }
  VecT va, vb;
  *reinterpret_cast<Word*>(&va) = xa;
  if constexpr (!kInterleaved) *reinterpret_cast<Word*>(&vb) = xb;
  rotate_chunk<T, kInterleaved>(va, vb, sn, cs);
  *reinterpret_cast<Word*>(out + d0) = *reinterpret_cast<const Word*>(&va);
  if constexpr (!kInterleaved) *reinterpret_cast<Word*>(out + d1) = *reinterpret_cast<const Word*>(&vb);
}

}  // namespace cuda
}  // namespace rope_ext
