// Variant 5 of the attention family: decode attention on the tensor cores, Q-RoPE on
// load, K/V streamed through per-warp cp.async pipelines. ATen-free (helpers, then the
// kernel); the launchers are in decode_mma_launch.cuh, instantiated in instances/. The other variants (1-4) are in
// attention_variants.cuh, whose header lists what each taught.
//
// Why this design (issue 18; H100 numbers in bench/NOTES.md and docs/attention.md):
//   - Variant 2 spends ~60 warp instructions per (key, kv head): 16 lanes split the head
//     dim, so every row's dot product ends in a 4-step shuffle reduction, and P.V is a
//     scalar FMA per feature. At B = 64, ctx 32768 that is ~1e9 warp instructions, about
//     the kernel's whole time budget at the copy bandwidth, so it stalled at 86-88%.
//     Here the G * q_len query rows of one kv head (padded to 16) are the M side of
//     mma.m16n8k16: per 16 keys and D = 128, 16 MMAs for Q.K^T, 16 for P.V, 8 + 8
//     ldmatrix: ~9 warp instructions per key instead of 60. The padding rows cost MMA
//     throughput only, of which decode has plenty.
//   - Variant 2 kept 4 keys in flight per key slot through registers, and at B = 1 a
//     ctx-512 call took ~38 us (ncu: one split, 8 busy SMs, one DRAM round trip per
//     few keys). Here each warp owns a private kStages-deep ring of 16-key K and V tiles
//     in shared memory filled by cp.async (zero-fill past the end): 2 tiles in flight per
//     warp, 8 per CTA (64 KB at D = 128), no CTA barrier in the key loop but q_phase's
//     (once, before the first step), and the first tiles in flight while Q's rows land
//     and rotate.
//   - Each cp.async instruction of a warp copies whole key rows (2 rows of 256 B at
//     D = 128). The first version had lanes 2k, 2k+1 copy alternate 32-byte pieces of
//     key k: 16 rows per instruction, 4x the L2 requests; ncu at B = 64 showed the L2 as
//     busy as DRAM (83%/83%) at 2.80 TB/s.
//   - Paged caches: a tile's slots are looked up one tile ahead (one block-table read
//     per tile when block_size is a multiple of 16), so the page size stays off the
//     loop's critical path.
//   - Split-KV partials: with at most 16 splits on sm_90+ the splits of a row group are
//     one thread-block cluster and merge through distributed shared memory at the end
//     (decode_merge.cuh, cluster_merge_and_write): one launch. Otherwise the combine
//     kernel (variant 4) merges them, launched as a programmatic dependent of this one
//     (PDL): its launch overlaps this kernel.
//   - At B <= 8 this kernel was issue-bound, not DRAM-bound (ncu, night of 2026-11-24:
//     2,743 instructions per warp at B = 1 ctx 512 for one tile, ~740 per tile at ctx
//     32768, < 1 warp per scheduler, "no instruction" the largest stall). So the issue
//     path is lean: Q by 16-byte loads staged through q_s, one pair unit per thread; K/V
//     copies by a running pointer per row group; a warp's block ids 32 tiles at a time;
//     the ring slot as a counter; ldmatrix addresses as one XOR; ex2.approx weights;
//     merges with per-row weights (decode_merge.cuh): 1,567 and ~500.
// Measured (H100, CUDA graph, cold L2, the rows timed in turns, Hq 32 / Hk 8 / D 128 bf16;
// docs/attention.md, run 4 of the third session of 2026-11-26): B = 1 1.56x / 1.43x /
// 1.10x / 1.00x rope + SDPA at ctx 512 / 2048 / 8192 / 32768 (~68% of copy there); B = 8
// 1.24x at ctx 512, 1.00x at 32768 (97%); B = 64 1.00-1.07x (timed one row after another,
// 103% at ctx 32768); paged within 1-3% from B = 8 ctx 2048 up. Variant 2 takes 1.1-1.9x
// this kernel's time. The split rule (attention_dispatch.cu) came from forced-split rows.
//   - Timed in turns with other kernels between replays (bench/timing.py
//     graph_us_interleaved, as between the layers of a model), the B <= 8 calls pay for
//     their code fetched cold: B = 1 ctx 512 took 13.9-14.0 us in turns against 9.6 back
//     to back. What that costs is the layout of the path more than its length (ncu and
//     A/B runs, third session of 2026-11-26, bench/NOTES.md): the same ~2,100 distinct
//     instructions executed cost ~3 us less once the path ran in the order it is laid
//     out: one `issue` site (the key loop is software-pipelined, q_phase inside it), Q
//     staged by cp.async with one element-wise fallback outside the rotation loop, no
//     unrolled copies of rare code between the executed blocks (each jump over such a
//     block cost ~0.15-0.2 us). B = 1 ctx 512 14.0 -> 9.85 us, ctx 2048 17.35 -> 12.4 (1.56x /
//     1.43x rope + SDPA). A paged and a contiguous body behind one kernel (each without
//     the other's code, the instance twice the size) made the contiguous one 6-12 us
//     slower (run 5), reverted: the same kernel timed warm ran both in ~9.5 us, cold the
//     second body (56-111 KB from the entry) took 21 us against 10.7 for the first (run
//     8, ncu: instruction-fetch stalls 445 vs 51). Code past ~56-64 KB of an instance
//     fetches far slower cold: keep the B = 1 path in the first ~3,500 instructions.
//   - A split's keys are chunks of 4 tiles dealt round-robin (DecodeParams::split_chunk),
//     not one range: all CTAs then read within a window moving through the cache. 0.3-1.6%
//     faster on contiguous bf16 / fp8 caches from ctx 8192 up, level on paged ones (run
//     1-2 of the thirteenth session of 2026-11-26; one resident wave of long per-CTA streams
//     cost the norm + RoPE forward ~8%, but a decode call has 62-256 such streams, not ~500).
//   - Shared-memory tiles are XOR-swizzled by 16-byte chunk (chunk ^ key % 8), so the
//     8 rows an ldmatrix reads fall in 8 different bank groups.
//   - FP8 caches (kFp8, issue 20): the rings hold e4m3 tiles and the MMA fragments
//     are built from them directly: ldmatrix (b16 view of the bytes) then one
//     cvt.rn.f16x2.e4m3x2 per register pair, exact. K: a lane's 4 bytes are features
//     4t..4t+3 of a 16-feature chunk, used as the MMA's k-indices {2t, 2t+1, 2t+8, 2t+9},
//     so Q is stored with its features permuted the same way (fp8_qcol). V: ldmatrix
//     .trans gives 2 keys x 2 features per lane; a byte permute splits even and odd
//     features into two n-tiles, so O's columns come out permuted and put_fp8 undoes it.
//     The MMAs run in fp16 (every e4m3 value is exact there; q, rotated in fp32, is
//     rounded to fp16 instead of bf16: finer, but |q| must stay below 65504). The scales
//     fold into the score scale (k_scale) and into O before the merge (v_scale).
//     Run 1 of issue 20 first widened each tile into a bf16 tile in shared memory
//     (cvt, st.shared, a warp barrier per tile): fp8 took 0.68-0.75x the bf16 cache's
//     time, 62-76% of copy on its bytes; the per-tile chain, not the bytes, was the cost.
//   - kPair (fp8 caches, D = 64 or 128, DecodeParams::kv_per_cta = 2): a CTA takes two
//     neighbouring kv heads and copies their rows of a slot as one ring row of 2 D bytes
//     (the interleaved cache holds them side by side; at D = 128 one head's fp8 row is
//     128 bytes, 1 KB from the next slot's at Hk 8). QK^T runs once per head over its half of the row and each
//     query row keeps its own head's scores; P.V runs once per head with the other
//     head's rows' P zeroed, into the same accumulators, so every row's O is the one
//     head's result bit for bit (a NaN in one head's values does reach the other
//     head's rows: 0 * NaN). Scales per row. At D = 128 216-220 registers and 112 KB of
//     shared memory: 2 CTAs per SM (one head: 3); at D = 64 128-156 registers, ~54 KB (the
//     stage count follows the ring row, 2 D bytes: as D = 128's one head). H100, in turns (runs C-D of the fifth session of
//     2026-11-26), one head -> two: B = 8 ctx 32768 210.3 -> 197.5-198.9 us (90% of copy,
//     the plain read 191), B = 64 ctx 8192 400.4 -> 381.0, B = 8 ctx 2048 28.3 -> 26.7, B = 1
//     ctx 32768 46.1 -> 44.2, B = 1 ctx 2048 12.2 -> 12.5 (kept at one); the host's rule is
//     decode_kv_per_cta.
//   - P is rounded to the cache dtype for the P.V MMA (as flash-attention does); scores,
//     the softmax state and O stay fp32. Q is rotated in fp32 and rounded once to the
//     cache dtype (the separate path's rope output is rounded the same way).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "../attention_math.h"
#include "decode_merge.cuh"
#include "decode_mma.h"
#include "primitives.cuh"  // cp_async16, smem_u32

namespace rope_ext {
namespace cuda {
namespace mma_decode {

// fp8: 3 stages at D >= 128 (the merge must fit in the rings at D = 256; at D = 128 it
// leaves 60 KB per CTA, 3 CTAs per SM), 4 at D = 64. (6 stages at D <= 128, 2 CTAs per SM
// and 160 KB in flight per SM instead of 96, measured slower everywhere: B = 8 ctx 32768
// 213.0 vs 210.6 us, ctx 2048 34.6 vs 27.8, B = 64 ctx 32768 1512 vs 1490; run 6 of the
// night of 2026-11-24: bytes in flight are not what holds fp8 at ~85% of copy at B = 8.)
// Tried and reverted (run 1 of 2026-11-25, day): fp8 steps of two 16-key tiles (one
// softmax update per 32 keys, 4 stages, Q fragments in registers; 28% fewer instructions
// per key, twice the independent MMA / conversion work per step): B = 8 ctx 32768 207.8
// vs 208.4 us, ctx 8192 69.7 vs 70.3, B = 64 ctx 32768 1508 vs 1490 (211-223 registers:
// 2 CTAs per SM). Neither the per-tile chain nor the instruction count holds fp8 back;
// the 128-byte rows of the interleaved layout do (docs/attention.md, head-major caches;
// kPair below reads two heads' rows as one).
template <int D, bool kFp8>
constexpr int stages() { return kFp8 ? (D >= 128 ? 3 : 4) : (D >= 256 ? 2 : 3); }

// kPair (fp8 caches; the kernel's header): a CTA takes two neighbouring kv heads, whose
// rows are one 2 * D-byte row of the interleaved cache: ring rows are DR = 2 * D wide.
template <int D, bool kPair>
constexpr int ring_d() { return kPair ? 2 * D : D; }
// Shared memory: the warps' tile rings (cache elements: 2 bytes, or 1 for fp8; rows of
// DR features) | Q [16][D] in the MMA type | the Q sin/cos table [16 tokens][D/2] x 2
// floats | the warps' tile-validity masks. The raw Q rows [16][D] (2-byte q, as loaded) are staged in warp 0's
// ring slot NS - 1, which no tile fills before the key loop's trip NS - 1, after q_phase
// (a region of their own cost the 16-bit D = 64 instance its 4th CTA per SM). The
// end-of-loop merge reuses the rings ([kWarps][16][D] floats + m, l).
template <int D, bool kFp8>
constexpr size_t ring_bytes() { return size_t(kWarps) * stages<D, kFp8>() * 2 * kTileKeys * D * (kFp8 ? 1 : 2); }
template <int D, bool kFp8, bool kPair = false>
constexpr size_t smem_bytes() {
  constexpr int DR = ring_d<D, kPair>();
  return ring_bytes<DR, kFp8>() + size_t(kRows) * D * 2 + size_t(kRows) * D * 4 + kWarps * stages<DR, kFp8>() * 4;
}
template <int D, bool kFp8>
constexpr bool merge_fits() {
  return size_t(kWarps) * kRows * D * 4 + 2 * kWarps * kRows * 4 <= ring_bytes<D, kFp8>();
}
static_assert(merge_fits<64, false>() && merge_fits<128, false>() && merge_fits<256, false>() &&
              merge_fits<64, true>() && merge_fits<128, true>() && merge_fits<256, true>(), "merge fits in the rings");
// The cluster merge's parts (decode_merge.cuh) go after the merge's arrays, in the rings too.
template <int D, bool kFp8>
constexpr bool cluster_fits() {
  return size_t(kWarps) * kRows * D * 4 + 2 * kWarps * kRows * 4 + size_t(kRows) * D * 4 + kRows * 4 <=
         ring_bytes<D, kFp8>();
}
static_assert(cluster_fits<64, false>() && cluster_fits<128, false>() && cluster_fits<256, false>() &&
              cluster_fits<64, true>() && cluster_fits<128, true>() && cluster_fits<256, true>(),
              "cluster merge parts fit in the rings");

// ---------------------------------------------------------------- PTX helpers
// (cp_async16 / cp_async_commit / cp_async_wait and smem_u32: primitives.cuh)

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a (16x16, row) * b (16x8, col), fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, c10::Half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one register of two T (the lower index in the low half), rounded.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t u;
  if constexpr (std::is_same<T, c10::Half>::value) {
    const __half2 h = __floats2half2_rn(lo, hi);
    u = *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    u = *reinterpret_cast<const uint32_t*>(&h);
  }
  return u;
}

// 2^x, the MUFU's approximation (max relative error ~2^-22; ex2(-inf) = 0): the
// softmax weights only (P is rounded to 16 bits for the P.V MMA anyway). exp2f's
// denormal scaling added 3 instructions per weight to a per-tile chain that is
// issue-bound at small batches (bench/NOTES.md).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two e4m3 values (bytes 0, 1 of x, or with kHi bytes 2, 3; the lower index first) -> an
// fp16 pair; exact. On sm_89+ the high half is the conversion's own operand selector
// (F2FP ... R.H1): the shift the generic form compiled to was 16 of a tile's ~440
// instructions at D = 128 (SASS, 2026-11-25).
template <bool kHi>
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t d;
  if constexpr (kHi) asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, h;\n}\n" : "=r"(d) : "r"(x));
  else asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %1;\ncvt.rn.f16x2.e4m3x2 %0, l;\n}\n" : "=r"(d) : "r"(x));
  return d;
#else
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>((kHi ? x >> 16 : x) & 0xffffu), __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
#endif
}

// fp8 tiles: byte offset of (key row, 16-byte chunk c), swizzled so that the 8 rows an
// ldmatrix reads fall in 8 different bank groups (rows of 64 bytes pair up in a
// 128-byte line, hence the shift at D = 64).
template <int D>
__device__ __forceinline__ int swz8(int row, int c) {
  constexpr int CH = D / 16;
  const int f = CH >= 8 ? (row & 7) : ((row >> 1) & (CH - 1));
  return row * D + ((c ^ f) << 4);
}

// fp8: the Q column that holds feature d (K's fragments read features 4t..4t+3 of a
// 16-feature chunk as the MMA's k-indices 2t, 2t+1, 2t+8, 2t+9).
__device__ __forceinline__ int fp8_qcol(int d) {
  const int t = (d & 15) >> 2, r = d & 3;
  return (d & ~15) + (r < 2 ? 2 * t + r : 8 + 2 * t + r - 2);
}

// Element offset of (row, feature chunk c) in a swizzled [rows][D] tile of 8-element chunks.
template <int D>
__device__ __forceinline__ int swz(int row, int c) { return row * D + ((c ^ (row & 7)) << 3); }

// ---------------------------------------------------------------- the kernel
// Grid (num_splits * row_groups, Hk / KP, B) as variant 2 (attention_params.h); a CTA
// takes up to 16 query rows (row r = j * G + g, G the query heads of its KP kv heads) and
// one split of the keys, cut into 16-key tiles dealt round-robin to its 4 warps. kUpper:
// rows 8..15 exist (more than 8 query rows per CTA's kv heads); without them the upper
// half of each MMA is padding, whose softmax and rescale are skipped.
template <typename T, int D, bool kUpper, bool kFp8, bool kPair>
__global__ void __launch_bounds__(kThreads) decode_mma_kernel(const __grid_constant__ DecodeParams p) {
  using C = std::conditional_t<kFp8, uint8_t, T>;  // a cache element
  using M = std::conditional_t<kFp8, c10::Half, T>;  // the MMAs' input type
  static_assert(!kPair || kFp8, "pairs of kv heads: fp8 caches only");
  constexpr int KP = kPair ? 2 : 1;            // kv heads per CTA
  constexpr int DR = ring_d<D, kPair>();       // features of a ring row (KP heads' rows)
  constexpr int NS = stages<DR, kFp8>();
  constexpr int EC = 16 / sizeof(C);           // cache elements per 16-byte chunk
  constexpr int CH = DR / EC;                  // 16-byte chunks per ring row
  constexpr int TILE = kTileKeys * DR;         // elements of one K (or V) tile
  constexpr float kLog2e = 1.4426950408889634f;
  const float ninf = -INFINITY;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::);  // the combine may launch (it waits for us)
#endif
  extern __shared__ __align__(16) unsigned char smem_raw[];
  C* ring = reinterpret_cast<C*>(smem_raw);
  M* q_s = reinterpret_cast<M*>(smem_raw + ring_bytes<DR, kFp8>());
  float* tab_s = reinterpret_cast<float*>(q_s + kRows * D);  // [16][D/2] cos, then [16][D/2] sin
  uint32_t* mask_s = reinterpret_cast<uint32_t*>(tab_s + kRows * D);
  // [16][D] raw Q rows (the cp.async staging): warp 0's ring slot NS - 1 (see smem_bytes).
  static_assert(size_t(kRows) * D * 2 <= size_t(2) * kTileKeys * DR * sizeof(C), "raw Q rows fit in one ring slot");
  T* qraw_s = reinterpret_cast<T*>(ring + (NS - 1) * 2 * kTileKeys * DR);

  const int split = blockIdx.x % p.num_splits, rg = blockIdx.x / p.num_splits;
  const int hk = blockIdx.y;  // the CTA's kv head (kPair: heads KP * hk, KP * hk + 1)
  const int64_t b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int G = static_cast<int>(p.G) * KP;  // query heads of the CTA's kv head(s), in order
  const int row0 = rg * kRows;
  const int nrows = min(kRows, G * static_cast<int>(p.q_len) - row0);
  const int64_t seqlen = decode_seqlen(p, b);
  // The decode step in this launch (p.k_new): the q_len new keys [old, seqlen) are one
  // extra tile of the last split, built by its last warp (the one with the fewest cached
  // tiles) from k_new / v_new after its cached tiles, and written into the cache. The
  // cached keys [0, old) are split as usual. (The host: one row group, q_len <= 8.)
  const bool fused_append = !kPair && p.k_new != nullptr;  // (the host never pairs heads here)
  // Paged caches with 16-aligned blocks, one split: the warp's tile t starts at key (warp +
  // kWarps t) * 16 whatever the length, so lane l looks up tile l's block id now, in flight
  // with cache_seqlens instead of after it (slot_of below takes these as its first batch).
  // Tried and reverted (run 2 of 2026-11-25, day): with several splits, the first key
  // guessed from the host's max_seqlen hint and checked against the length: paged B = 1
  // ctx 512 / 2048 unchanged (10.6 / 13.3 us against 9.8 / 12.3 contiguous). ncu (run 3):
  // the paged call runs ~140 more instructions per warp in its cold prologue (1741 vs 1601
  // at B = 1 ctx 512), and both are stalled mostly on instruction fetch (no_instruction
  // 4.1-4.5 per issue): the gap is that code's fetch, not the block-table round trip.
  struct Slot { int64_t ko, vo; bool ok; };
  int bt_t0 = -32;
  Slot bt{0, 0, false};
  if (p.cache.paged && p.cache.block_size % kTileKeys == 0 && p.num_splits == 1) {
    const KVCacheView& c = p.cache;
    bt_t0 = 0;
    const int key0 = (warp + lane * kWarps) * kTileKeys;
    if (key0 < c.capacity) {  // inside the block table's row
      const int64_t n = div_small(key0, c.block_size);
      const int64_t blk = load_index(c.block_table, b * c.bt_stride_b + n * c.block_table.stride);
      const int64_t in_block = key0 - n * c.block_size;
      bt.ok = blk >= 0 && blk < c.num_blocks;
      bt.ko = blk * c.k_stride[0] + in_block * c.k_stride[1];
      bt.vo = blk * c.v_stride[0] + in_block * c.v_stride[1];
    }
  }
  const int64_t old = seqlen - (fused_append ? p.q_len : 0);
  const bool new_tile = fused_append && split == p.num_splits - 1 && warp == kWarps - 1;

  // Q first: its loads depend on nothing, so they overlap the seqlen -> key range ->
  // K/V chain below. Where q's rows allow it (features contiguous, rows 16-byte aligned:
  // the usual [B, q_len, Hq, D] tensor) they are copied raw into qraw_s by cp.async (a
  // commit group of their own, ahead of the tiles'); for other strides q_phase below
  // copies them element by element; then it reads them per pair unit. Row r of the CTA is
  // query head hk * G + g of token j, r = j * G + g: j from a float reciprocal (exact: the
  // host keeps G * q_len < 2^22). Why (third session of 2026-11-26, ncu): at B = 1 the
  // kernel's time is its code fetched cold, and the earlier Q prologue (a vector path,
  // a scalar path unrolled 8 times, their staging barrier) was ~700 instructions of it;
  // Q held in registers from the top through the key loop cost fp8's occupancy.
  const RopeParams& r = p.rope;
  const int half = r.R / 2;
  auto q_unit_dims = [&](int u, int* d0, int* d1) {
    if (u < half) pair_dims(r, u, d0, d1);
    else *d1 = (*d0 = r.R + 2 * (u - half)) + 1;
  };
  const float inv_g = __frcp_rn(static_cast<float>(G));
  auto tok_of = [&](int row) { return __float2int_rz((static_cast<float>(row) + 0.5f) * inv_g); };
  const T* q_b = static_cast<const T*>(p.q) + b * p.q_stride[0] + static_cast<int64_t>(hk) * G * p.q_stride[2];
  auto q_row = [&](int rr) {
    const int row = row0 + rr, j = tok_of(row);
    return q_b + j * p.q_stride[1] + (row - j * G) * p.q_stride[2];
  };
  const bool q_vec = p.q_stride[3] == 1 &&
                     ((reinterpret_cast<uintptr_t>(p.q) |
                       static_cast<uintptr_t>((p.q_stride[0] | p.q_stride[1] | p.q_stride[2]) * int64_t(sizeof(T)))) &
                      15) == 0;
  if (q_vec) {
    constexpr int RC = D / 8;  // 16-byte chunks per row
#pragma unroll
    for (int it = 0; it < kRows * RC / kThreads; ++it) {
      const int e = tid + it * kThreads, rr = e / RC, c = e - rr * RC;
      if (rr < nrows) cp_async16(qraw_s + rr * D + c * 8, q_row(rr) + c * 8, true);
    }
  }
  cp_async_commit();  // group 0: Q (empty without q_vec); the tiles' groups follow
  // Keys: rows see [0, lim(row)), nondecreasing in the row's token; this split takes
  // whole tiles of [0, n_keys) (so tiles align with 16-slot pages): chunks of 2^ck tiles
  // dealt to the splits round-robin (the host's rule, decode_split_chunk: 4 tiles), or one
  // range per split.
  // (Run 4 of 2026-11-25 dealt single tiles round-robin and had paged caches guess their
  // block ids early from the length; that version lost 0.2-0.4 us at B = 1 and 2.3 at B = 8
  // ctx 32768. The chunks here, block ids looked up as for one range, did not lose: NOTES,
  // thirteenth session of 2026-11-26.)
  const int n_keys = static_cast<int>(min(old, max(int64_t(0), decode_key_limit(p, seqlen, tok_of(row0 + nrows - 1)))));
  // p.split_chunk = k > 0: chunks of 2^(k-1) tiles, so the CTAs of all splits read
  // neighbouring keys at any moment; 0: one range. Tile i of the split starts at key
  // kbeg + (i + (i >> ck) * skip) * kTileKeys (skip 0: one range).
  int kbeg, n_tiles, ck = 30, skip = 0;
  if (p.split_chunk > 0) {
    ck = p.split_chunk - 1;
    skip = (p.num_splits - 1) << ck;
    kbeg = (split << ck) * kTileKeys;
    const int nt = (n_keys + kTileKeys - 1) / kTileKeys, round = p.num_splits << ck;
    const int full = nt / round;
    n_tiles = (full << ck) + min(1 << ck, max(0, nt - full * round - (split << ck)));
  } else {
    const int per_split = ((n_keys + p.num_splits - 1) / p.num_splits + kTileKeys - 1) / kTileKeys * kTileKeys;
    kbeg = min(n_keys, split * per_split);
    n_tiles = (min(n_keys, kbeg + per_split) - kbeg + kTileKeys - 1) / kTileKeys;
  }
  // A tile's keys past n_keys are masked (below): for one range per split this is the
  // range's end too (ranges end on a tile boundary or at n_keys).
  const int my_tiles = warp < n_tiles ? (n_tiles - warp + kWarps - 1) / kWarps : 0;

  // ---- the warp's tile ring. A warp instruction copies whole rows (coalesced: RPI
  // consecutive keys of 256 B at D = 128); the slot of a tile's keys is looked up one
  // tile ahead (`next`), so a block-table read never waits in front of a copy.
  // Slot modes: 0 contiguous (key -> row arithmetic); 1 paged, block_size a multiple of
  // the tile (a tile sits in one block: one block-table read per tile); 2 paged, small
  // blocks (lane k < 16 looks up key k, the copying lanes take it by shuffle).
  constexpr int LPR = CH < 32 ? CH : 32;  // lanes per row
  constexpr int RPI = 32 / LPR;           // rows per warp instruction
  constexpr int NI = kTileKeys / RPI;     // instructions per tile (each of K and V)
  C* my_ring = ring + warp * NS * 2 * TILE;
  const C* kc = static_cast<const C*>(p.cache.k) + int64_t(hk) * KP * p.cache.k_stride[2];
  const C* vc = static_cast<const C*>(p.cache.v) + int64_t(hk) * KP * p.cache.v_stride[2];
  const KVCacheView& cv = p.cache;
  const int mode = !cv.paged ? 0 : (cv.block_size % kTileKeys == 0 ? 1 : 2);
  const int lc = lane % LPR, lr = lane / LPR;  // this lane's chunk, and row within an instruction
  // Slot of tile t. Modes 0 and 1: ko / vo = the element offset of the tile's first key
  // row, ok = its block exists (rows follow at the slot stride); mode 2: lane k < 16's
  // own key k (shared by shuffle in issue).
  auto tile_key0 = [&](int t) {
    const int i = warp + t * kWarps;  // the split's i-th tile
    return kbeg + (i + (i >> ck) * skip) * kTileKeys;
  };
  const int64_t ks1 = cv.k_stride[1], vs1 = cv.v_stride[1];
  // Mode 1: the slots of the warp's tiles bt_t0 .. bt_t0 + 31 (lane l: tile bt_t0 + l), looked
  // up by all lanes at once and taken by shuffle per tile. (A lookup per tile, one tile
  // ahead, left an L2 round trip on every tile's chain: paged B = 8 with one split per
  // sequence took 19.5 us against 15.8 contiguous at ctx 512, run 3 of the night of
  // 2026-11-24.)
  auto bt_fill = [&](int t0) {
    bt_t0 = t0;
    bt = Slot{0, 0, false};
    if (t0 + lane < my_tiles) {
      const int key0 = tile_key0(t0 + lane);
      const int64_t n = div_small(key0, cv.block_size);
      const int64_t blk = load_index(cv.block_table, b * cv.bt_stride_b + n * cv.block_table.stride);
      const int64_t in_block = key0 - n * cv.block_size;
      bt.ok = blk >= 0 && blk < cv.num_blocks;
      bt.ko = blk * cv.k_stride[0] + in_block * ks1;
      bt.vo = blk * cv.v_stride[0] + in_block * vs1;
    }
  };
  auto slot_of = [&](int t) {
    Slot s{0, 0, false};
    if (t >= my_tiles) return s;
    const int key0 = tile_key0(t);
    if (mode == 0) {
      s.ok = true;
      s.ko = b * cv.k_stride[0] + key0 * ks1;
      s.vo = b * cv.v_stride[0] + key0 * vs1;
    } else if (mode == 1) {
      if (t >= bt_t0 + 32) bt_fill(t);  // t is warp-uniform
      const int l = t - bt_t0;
      s.ok = __shfl_sync(0xffffffffu, static_cast<int>(bt.ok), l) != 0;
      s.ko = __shfl_sync(0xffffffffu, bt.ko, l);
      s.vo = __shfl_sync(0xffffffffu, bt.vo, l);
    } else {
      const int key = key0 + (lane & (kTileKeys - 1));
      if (key < n_keys) s.ok = cache_slot(cv, b, key, &s.ko, &s.vo);
    }
    return s;
  };
  // Ring tiles, swizzled by 16-byte chunk (swz in elements, swz8 in bytes for fp8).
  auto ring_at = [&](int row, int c) { return kFp8 ? swz8<DR>(row, c) : swz<DR>(row, c); };
  // This lane's row / chunk of a tile (modes 0 and 1), and the step to its next row.
  const C* k_lane = kc + lr * ks1 + lc * EC;
  const C* v_lane = vc + lr * vs1 + lc * EC;
  const int64_t k_step = RPI * ks1, v_step = RPI * vs1;
  // Tile t into ring slot `slot`. Modes 0 / 1: a running pointer per row group, no
  // per-row index math (it was ~400 of a tile's ~740 instructions: ncu, NOTES).
  auto issue = [&](int t, int slot, const Slot& s) {
    C* kd = my_ring + slot * 2 * TILE;
    C* vd = kd + TILE;
    const int key0 = tile_key0(t);
    uint32_t m;  // bit k: key k of the tile exists (read by the masking below)
    if (mode != 2) {
      const int nv = s.ok ? min(kTileKeys, n_keys - key0) : 0;
      const C* ksrc = k_lane + s.ko;
      const C* vsrc = v_lane + s.vo;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const int ki = i * RPI + lr;
        const bool ok = ki < nv;
        cp_async16(kd + ring_at(ki, lc), ok ? ksrc : kc, ok);
        cp_async16(vd + ring_at(ki, lc), ok ? vsrc : vc, ok);
        ksrc += k_step;
        vsrc += v_step;
      }
      m = nv >= kTileKeys ? 0xffffu : (1u << nv) - 1u;
    } else {
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const int ki = i * RPI + lr;
        const bool ok = __shfl_sync(0xffffffffu, static_cast<int>(s.ok), ki) != 0;
        const int64_t ko = __shfl_sync(0xffffffffu, s.ko, ki), vo = __shfl_sync(0xffffffffu, s.vo, ki);
        cp_async16(kd + ring_at(ki, lc), ok ? kc + ko + lc * EC : kc, ok);
        cp_async16(vd + ring_at(ki, lc), ok ? vc + vo + lc * EC : vc, ok);
      }
      m = __ballot_sync(0xffffffffu, s.ok) & 0xffffu;
    }
    if (lane == 0) mask_s[warp * NS + slot] = m;
  };
  // The decode step's new rows (raw, in T), by the warp that builds their tile: K rows
  // into the Q cos table's rows 8.., V rows into its sin rows 8.. (the host takes this
  // road only for one row group of at most 8 tokens, whose table rows are 0..7), copied
  // with the first ring tiles so their DRAM trip overlaps them. The new keys' sin/cos are
  // the query tokens' (the same positions): rows 0..q_len-1 of the same table.
  const T* kn_s = reinterpret_cast<const T*>(tab_s + 8 * (D / 2));
  const T* vn_s = reinterpret_cast<const T*>(tab_s + (kRows + 8) * (D / 2));
  if (new_tile) {
    constexpr int RC = D / 8;  // 16-byte chunks per row of T
    const T* ksrc = static_cast<const T*>(p.k_new) + b * p.kn_stride[0] + hk * p.kn_stride[2];
    const T* vsrc = static_cast<const T*>(p.v_new) + b * p.vn_stride[0] + hk * p.vn_stride[2];
#pragma unroll 1
    for (int e = lane; e < static_cast<int>(p.q_len) * RC; e += 32) {
      const int j = e / RC, c8 = (e % RC) * 8;
      cp_async16(const_cast<T*>(kn_s + j * D + c8), ksrc + j * p.kn_stride[1] + c8, true);
      cp_async16(const_cast<T*>(vn_s + j * D + c8), vsrc + j * p.vn_stride[1] + c8, true);
    }
  }
  Slot next = slot_of(0);

  // ---- Q: sin/cos per (token, pair) once, rotate in fp32, round to M, into q_s. Run by
  // the key loop below once the first NS - 1 tiles are in flight (one issue site: the
  // prologue's own unrolled copies of `issue` were ~280 instructions fetched cold). A
  // thread takes one pair unit qu of the rows qr0, qr0 + kRowStep, ... Unit u of a row:
  // pair u (u < R/2), else the two tail features R + 2 (u - R/2) + {0, 1}.
  static_assert(kThreads % (D / 2) == 0, "one pair unit per thread");
  constexpr int kQUnits = kRows * (D / 2) / kThreads, kRowStep = kThreads / (D / 2);
  const int qu = tid % (D / 2), qr0 = tid / (D / 2);
  const int j0 = tok_of(row0), ntok = tok_of(row0 + nrows - 1) - j0 + 1;
  auto q_phase = [&]() {
#pragma unroll 1
    for (int e = tid; e < ntok * half; e += kThreads) {
      const int jj = e / half, i = e - jj * half, j = j0 + jj;
      float sn, cs;
      pair_sincos(r, attn_position(r, b, j, b, seqlen - p.q_len + j), i, inv_freq_of(r, i), &sn, &cs);
      tab_s[jj * (D / 2) + i] = cs;
      tab_s[(kRows + jj) * (D / 2) + i] = sn;
    }
    if (!q_vec) {  // other strides: element by element into the same staging rows (one loop, not unrolled)
#pragma unroll 1
      for (int e = tid; e < nrows * D; e += kThreads) {
        const int rr = e / D, d = e - rr * D;
        qraw_s[e] = q_row(rr)[d * p.q_stride[3]];
      }
    }
    cp_async_wait<NS - 1>();  // group 0, this thread's Q chunks
    __syncthreads();          // every thread's chunks and table entries
    int qd0, qd1;
    q_unit_dims(qu, &qd0, &qd1);
    const bool q_rot = qu < half;
    const int cq0 = kFp8 ? fp8_qcol(qd0) : qd0, cq1 = kFp8 ? fp8_qcol(qd1) : qd1;
#pragma unroll
    for (int it = 0; it < kQUnits; ++it) {
      const int rr = qr0 + it * kRowStep;
      float x0 = 0.f, x1 = 0.f;
      if (rr < nrows) {
        x0 = static_cast<float>(qraw_s[rr * D + qd0]);
        x1 = static_cast<float>(qraw_s[rr * D + qd1]);
        if (q_rot) {
          const int jj = tok_of(row0 + rr) - j0;
          const float cs = tab_s[jj * (D / 2) + qu], sn = tab_s[(kRows + jj) * (D / 2) + qu];
          const float y0 = rot_y0(x0, x1, cs, sn), y1 = rot_y1(x0, x1, cs, sn);
          x0 = y0;
          x1 = y1;
        }
      }
      q_s[swz<D>(rr, cq0 >> 3) + (cq0 & 7)] = static_cast<M>(x0);
      q_s[swz<D>(rr, cq1 >> 3) + (cq1 & 7)] = static_cast<M>(x1);
    }
    __syncthreads();
  };
  // ---- this lane's rows (MMA accumulator layout): r_lo = lane / 4, r_hi = r_lo + 8.
  const int r_lo = lane >> 2, r_hi = r_lo + 8;
  auto row_limit = [&](int rr) {
    if (rr >= nrows) return 0;
    return static_cast<int>(max(int64_t(0), decode_key_limit(p, seqlen, tok_of(row0 + rr))));
  };
  const int lim_lo = row_limit(r_lo), lim_hi = kUpper ? row_limit(r_hi) : 0;
  // kPair: the kv head (0 or 1 of the CTA's) whose keys this lane's rows read.
  auto head_of = [&](int rr) {
    if constexpr (!kPair) return 0;
    const int row = row0 + rr;
    return row - tok_of(row) * G >= G / KP ? 1 : 0;
  };
  const int h_lo = head_of(r_lo), h_hi = head_of(r_hi);
  const int hk_lo = hk * KP + h_lo, hk_hi = hk * KP + h_hi;
  // Scores in log2 units (exp2 below); an fp8 cache's k_scale folds in here (per row: kPair).
  const float qs_lo = p.softmax_scale * kLog2e * (kFp8 ? cv.k_scale[hk_lo * cv.k_scale_stride] : 1.f);
  const float qs_hi = kPair ? p.softmax_scale * kLog2e * cv.k_scale[hk_hi * cv.k_scale_stride] : qs_lo;

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_lo = ninf, m_hi = ninf, l_lo = 0.f, l_hi = 0.f;  // l: this lane's partial row sums

  // The new tile (keys old .. old + q_len - 1) into ring slot `slot`: K rotated in fp32
  // and rounded once to the cache type (fp8: divided by k_scale, saturated), exactly as
  // append_kv stores it; V converted likewise. V rows past q_len are zeroed (a masked
  // key's P is 0, and 0 * garbage could be NaN); K rows past q_len are masked scores and
  // may hold anything. The new slots are written into the cache too (rg is 0: one row
  // group on this road).
  auto build_new_tile = [&](int slot) {
    C* Kd = my_ring + slot * 2 * TILE;
    C* Vd = Kd + TILE;
    const int nq = static_cast<int>(p.q_len);
    for (int e = nq * CH + lane; e < kTileKeys * CH; e += 32)  // (row, 16-byte chunk) past q_len
      *reinterpret_cast<uint4*>(Vd + ring_at(e / CH, e % CH)) = make_uint4(0u, 0u, 0u, 0u);
    const float ks = kFp8 ? cv.k_scale[hk * cv.k_scale_stride] : 1.f;
    const float vs = kFp8 ? cv.v_scale[hk * cv.v_scale_stride] : 1.f;
    auto to_c = [&](float x, float sc) -> C {
      if constexpr (kFp8) return static_cast<C>(__nv_cvt_float_to_fp8(x / sc, __NV_SATFINITE, __NV_E4M3));
      else return static_cast<C>(x);
    };
    auto tile_at = [&](int row, int d) { return ring_at(row, d / EC) + d % EC; };
    // Lane j < q_len looks up new key j's slot once (one that does not exist, past the
    // capacity or in an invalid block, is dropped, as append_kv drops it).
    int64_t my_ko = 0, my_vo = 0;
    const bool my_ok = lane < nq && cache_slot(cv, b, old + lane, &my_ko, &my_vo);
    for (int e = lane; e < nq * (D / 2); e += 32) {  // (D / 2 >= 32: every lane takes each trip)
      const int j = e / (D / 2), u = e - j * (D / 2);
      int d0, d1;
      q_unit_dims(u, &d0, &d1);
      float x0 = static_cast<float>(kn_s[j * D + d0]), x1 = static_cast<float>(kn_s[j * D + d1]);
      if (u < half) {
        const float cs = tab_s[j * (D / 2) + u], sn = tab_s[(kRows + j) * (D / 2) + u];
        const float y0 = rot_y0(x0, x1, cs, sn), y1 = rot_y1(x0, x1, cs, sn);
        x0 = y0;
        x1 = y1;
      }
      const C k0 = to_c(x0, ks), k1 = to_c(x1, ks);
      const C v0 = to_c(static_cast<float>(vn_s[j * D + d0]), vs), v1 = to_c(static_cast<float>(vn_s[j * D + d1]), vs);
      Kd[tile_at(j, d0)] = k0;
      Kd[tile_at(j, d1)] = k1;
      Vd[tile_at(j, d0)] = v0;
      Vd[tile_at(j, d1)] = v1;
      const bool ok = __shfl_sync(0xffffffffu, static_cast<int>(my_ok), j) != 0;
      const int64_t ko = __shfl_sync(0xffffffffu, my_ko, j), vo = __shfl_sync(0xffffffffu, my_vo, j);
      if (rg == 0 && ok) {
        C* kg = static_cast<C*>(cv.k) + ko + hk * cv.k_stride[2];
        C* vg = static_cast<C*>(cv.v) + vo + hk * cv.v_stride[2];
        kg[d0] = k0;
        kg[d1] = k1;
        vg[d0] = v0;
        vg[d1] = v1;
      }
    }
    return __ballot_sync(0xffffffffu, my_ok) & 0xffffu;  // bit j: new key j exists
  };

  // ldmatrix row addresses: lane l feeds row l % 8 of matrix l / 8.
  const int mi = lane >> 3, mr = lane & 7;
  // The same addresses as swz<D>(row, 2 * kk + h): row & 7 is mr, and 2 * kk + h =
  // (2 * kk) ^ h, so the chunk term is ((h ^ mr) << 3) ^ (kk << 4): one XOR with a constant
  // per ldmatrix (a_row: Q and V^T fragments, rows (mi & 1) * 8 + mr, h = mi >> 1; b_row:
  // K fragments, rows (mi >> 1) * 8 + mr, h = mi & 1).
  const int a_row = ((mi & 1) * 8 + mr) * D, a_x = ((mi >> 1) ^ mr) << 3;
  const int b_row = ((mi >> 1) * 8 + mr) * D, b_x = ((mi & 1) ^ mr) << 3;
  // fp8 tiles, likewise: K and V^T fragments of chunk pair pp read row f_ri, chunk 2 pp +
  // (mi >> 1), at byte swz8<D>(f_ri, .) = f_row + (f_x ^ (pp << 5)). (The fp8 loop computed
  // swz8 per ldmatrix: ~3 instructions each, SASS of 2026-11-25.)
  const int f_ri = (mi & 1) * 8 + mr;
  const int f_row = f_ri * DR, f_x = ((mi >> 1) ^ (DR >= 128 ? (f_ri & 7) : ((f_ri >> 1) & (DR / 16 - 1)))) << 4;
  // 16-bit caches at D = 128: Q's fragments stay in registers (32 of them; the same for
  // every tile, reloading them was 8 of a tile's ldmatrix). Shared memory holds this
  // instance at 2 CTAs per SM anyway; at D = 64 (4 CTAs) and for fp8 (3 CTAs at 168
  // registers) the extra registers would cost a CTA per SM.
  constexpr bool kQReg = D == 128 && !kFp8;
  uint32_t qf[kQReg ? D / 16 : 1][4];  // loaded by the key loop after q_phase
  auto q_frag = [&](int kk, uint32_t(&tmp)[4]) -> const uint32_t* {
    if constexpr (kQReg) return qf[kk];
    ldmatrix_x4(tmp, q_s + a_row + (a_x ^ (kk << 4)));  // rows 0-7/8-15 x k lo/hi
    return tmp;
  };

  // One step: ring slot `slot` (its first key key0, bit k of vmask: its key k exists), one
  // online-softmax update over its 16 keys.
  auto step = [&](int slot, int key0, uint32_t vmask) {
    const C* Ks = my_ring + slot * 2 * TILE;
    const C* Vs = Ks + TILE;
    // S = Q K^T: [16 rows] x [16 keys] as two n-tiles of 8 keys.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if constexpr (kFp8) {
      // One ldmatrix: keys 0-7 / 8-15 x chunks 2pp / 2pp + 1 (16 features each, one k-step)
      // of kv head hh's half of the ring row.
      auto qk = [&](float(&acc)[2][4], int hh) {
#pragma unroll
        for (int pp = 0; pp < D / 32; ++pp) {
          uint32_t kb[4];
          ldmatrix_x4(kb, Ks + f_row + (f_x ^ ((pp + hh * (D / 32)) << 5)));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t tmp[4];
            const uint32_t* a = q_frag(2 * pp + h, tmp);
            mma16816<M>(acc[0], a, e4m3x2_to_f16x2<false>(kb[2 * h]), e4m3x2_to_f16x2<true>(kb[2 * h]));
            mma16816<M>(acc[1], a, e4m3x2_to_f16x2<false>(kb[2 * h + 1]), e4m3x2_to_f16x2<true>(kb[2 * h + 1]));
          }
        }
      };
      qk(s, 0);
      if constexpr (kPair) {  // every row against each head's keys; a row keeps its own head's
        float s1[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        qk(s1, 1);
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            s[n][e] = h_lo ? s1[n][e] : s[n][e];
            s[n][2 + e] = h_hi ? s1[n][2 + e] : s[n][2 + e];
          }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t tmp[4], kb[4];
        const uint32_t* a = q_frag(kk, tmp);
        ldmatrix_x4(kb, Ks + b_row + (b_x ^ (kk << 4)));  // keys 0-7/8-15 x k lo/hi
        mma16816<M>(s[0], a, kb[0], kb[1]);
        mma16816<M>(s[1], a, kb[2], kb[3]);
      }
    }
    // Mask (key past the row's limit, or a slot that does not exist), scale, online softmax.
    float mx_lo = ninf, mx_hi = ninf;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int kl = n * 8 + (lane & 3) * 2 + e, key = key0 + kl;
        const bool ok = (vmask >> kl) & 1u;
        s[n][e] = (ok && key < lim_lo) ? s[n][e] * qs_lo : ninf;
        mx_lo = fmaxf(mx_lo, s[n][e]);
        if (kUpper) {
          s[n][2 + e] = (ok && key < lim_hi) ? s[n][2 + e] * qs_hi : ninf;
          mx_hi = fmaxf(mx_hi, s[n][2 + e]);
        }
      }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
      if (kUpper) mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
    }
    // New max; a row that has seen no key yet keeps m = -inf and p = 0.
    const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
    const float sub_lo = mn_lo == ninf ? 0.f : mn_lo, sub_hi = mn_hi == ninf ? 0.f : mn_hi;
    // alpha = 1 when the max did not move (also a row still at -inf), 0 when m was -inf.
    const float al_lo = mn_lo == m_lo ? 1.f : ex2_approx(m_lo - sub_lo);
    const float al_hi = (!kUpper || mn_hi == m_hi) ? 1.f : ex2_approx(m_hi - sub_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
    uint32_t pa[4];
    {
      const float p00 = ex2_approx(s[0][0] - sub_lo), p01 = ex2_approx(s[0][1] - sub_lo);
      const float p10 = ex2_approx(s[1][0] - sub_lo), p11 = ex2_approx(s[1][1] - sub_lo);
      l_lo = l_lo * al_lo + (p00 + p01 + p10 + p11);
      pa[0] = pack2<M>(p00, p01);
      pa[2] = pack2<M>(p10, p11);
      if (kUpper) {
        const float q00 = ex2_approx(s[0][2] - sub_hi), q01 = ex2_approx(s[0][3] - sub_hi);
        const float q10 = ex2_approx(s[1][2] - sub_hi), q11 = ex2_approx(s[1][3] - sub_hi);
        l_hi = l_hi * al_hi + (q00 + q01 + q10 + q11);
        pa[1] = pack2<M>(q00, q01);
        pa[3] = pack2<M>(q10, q11);
      } else {
        pa[1] = pa[3] = 0u;
      }
    }
    // Rescale O only when some row's max moved (rare after the first tiles).
    if (!__all_sync(0xffffffffu, al_lo == 1.f && al_hi == 1.f)) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[n][0] *= al_lo;
        o[n][1] *= al_lo;
        if (kUpper) {
          o[n][2] *= al_hi;
          o[n][3] *= al_hi;
        }
      }
    }
    // O += P V: V^T fragments by ldmatrix.trans, two 8-feature n-tiles per load.
    if constexpr (kFp8) {
      // ldmatrix.trans: a lane holds keys 2t, 2t+1 x features 2g, 2g+1 of a chunk; one byte
      // permute puts the even features in the low half and the odd ones in the high half,
      // which feed n-tiles 2c and 2c + 1 (put_fp8 restores the order).
      // kPair: head hh's V half with P of its rows only (the other rows' P is 0 there).
#pragma unroll
      for (int hh = 0; hh < KP; ++hh) {
        uint32_t pm[4] = {pa[0], pa[1], pa[2], pa[3]};
        if constexpr (kPair) {
          if (h_lo != hh) pm[0] = pm[2] = 0u;
          if (h_hi != hh) pm[1] = pm[3] = 0u;
        }
#pragma unroll
        for (int pp = 0; pp < D / 32; ++pp) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, Vs + f_row + (f_x ^ ((pp + hh * (D / 32)) << 5)));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int c = 2 * pp + h;
            const uint32_t lo = __byte_perm(vb[2 * h], 0, 0x3120), hi = __byte_perm(vb[2 * h + 1], 0, 0x3120);
            mma16816<M>(o[2 * c], pm, e4m3x2_to_f16x2<false>(lo), e4m3x2_to_f16x2<false>(hi));
            mma16816<M>(o[2 * c + 1], pm, e4m3x2_to_f16x2<true>(lo), e4m3x2_to_f16x2<true>(hi));
          }
        }
      }
    } else {
#pragma unroll
      for (int dn = 0; dn < D / 16; ++dn) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, Vs + a_row + (a_x ^ (dn << 4)));  // keys lo/hi x d lo/hi
        mma16816<M>(o[2 * dn], pa, vb[0], vb[1]);
        mma16816<M>(o[2 * dn + 1], pa, vb[2], vb[3]);
      }
    }
  };

  // The key loop, software-pipelined: iteration it issues tile it (ring slot it % NS) and,
  // NS - 1 iterations later, steps over it; q_phase runs once, after the first NS - 1
  // tiles are issued. So `issue`, `q_phase` and `step` each appear once in the code, in
  // the order a B = 1 call first runs them (a call of `step` per branch doubled the
  // loop's code, ~250 SASS instructions more to fetch cold at small batches).
  const int n_steps = my_tiles + (new_tile ? 1 : 0);
  int islot = 0, cslot = 0;  // ring slots of the tile issued / stepped (mod NS, without a division)
  for (int it = 0; it < n_steps + NS - 1; ++it) {
    if (it < my_tiles) {
      issue(it, islot, next);
      next = slot_of(it + 1);
    }
    cp_async_commit();
    islot = islot == NS - 1 ? 0 : islot + 1;
    if (it == NS - 2) {  // every warp gets here (the loop runs >= NS - 1 times): the barriers hold
      q_phase();
      if constexpr (kQReg) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) ldmatrix_x4(qf[kk], q_s + a_row + (a_x ^ (kk << 4)));
      }
    }
    if (it < NS - 1) continue;
    const int t = it - (NS - 1);
    uint32_t vmask;
    int key0;
    if (t < my_tiles) {
      cp_async_wait<NS - 1>();
      __syncwarp();
      vmask = mask_s[warp * NS + cslot];
      key0 = tile_key0(t);
    } else {  // the new tile: its raw rows have landed once every group has
      cp_async_wait<0>();
      __syncwarp();
      vmask = build_new_tile(cslot);
      key0 = static_cast<int>(old);
      __syncwarp();
    }
    step(cslot, key0, vmask);
    __syncwarp();  // the tile is consumed before the ring slot is refilled
    cslot = cslot == NS - 1 ? 0 : cslot + 1;
  }
  cp_async_wait<0>();
  if constexpr (kFp8) {  // an fp8 cache's v_scale (of the row's kv head), before the merge (it is linear in O)
    const float vs_lo = cv.v_scale[hk_lo * cv.v_scale_stride];
    const float vs_hi = kPair ? cv.v_scale[hk_hi * cv.v_scale_stride] : vs_lo;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= vs_lo;
      o[n][1] *= vs_lo;
      o[n][2] *= vs_hi;
      o[n][3] *= vs_hi;
    }
  }

  // ---- merge the 4 warps' states (rows < nrows) in shared memory, then write.
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    if (kUpper) l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  __syncthreads();  // every warp is done with its ring
  float* os = reinterpret_cast<float*>(smem_raw);  // [kWarps][16][D]
  float* ms = os + kWarps * kRows * D;             // [kWarps][16]
  float* ls = ms + kWarps * kRows;
  auto put = [&](int rr, int cbase, float m, float l) {
    if (rr >= nrows) return;
    if constexpr (kFp8) {  // put_fp8: n-tiles 2c / 2c + 1 hold chunk c's even / odd features
      float* dst = os + (warp * kRows + rr) * D + (lane & 3) * 4;
#pragma unroll
      for (int c = 0; c < D / 16; ++c) {
        dst[c * 16] = o[2 * c][cbase];
        dst[c * 16 + 1] = o[2 * c + 1][cbase];
        dst[c * 16 + 2] = o[2 * c][cbase + 1];
        dst[c * 16 + 3] = o[2 * c + 1][cbase + 1];
      }
    } else {
      float* dst = os + (warp * kRows + rr) * D + (lane & 3) * 2;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        dst[n * 8] = o[n][cbase];
        dst[n * 8 + 1] = o[n][cbase + 1];
      }
    }
    if ((lane & 3) == 0) {
      ms[warp * kRows + rr] = m;
      ls[warp * kRows + rr] = l;
    }
  };
  put(r_lo, 0, m_lo, l_lo);
  if (kUpper) put(r_hi, 2, m_hi, l_hi);
  __syncthreads();
  if (p.cluster_merge) {  // the splits merge in their cluster (decode_merge.cuh)
    float* part_o = ls + kWarps * kRows;  // [16][D], then [16] lse: past os / ms / ls (cluster_fits)
    float* part_lse = part_o + kRows * D;
    merge_and_write_rows<T, kWarps, kRows>(p, ms, ls, os, D, nrows, row0, hk, b, split, tid, kThreads, part_o,
                                           part_lse);
    cluster_merge_and_write<T>(p, part_o, part_lse, D, nrows, row0, hk, b, tid, kThreads);
  } else {
    merge_and_write_rows<T, kWarps, kRows>(p, ms, ls, os, D, nrows, row0, hk, b, split, tid, kThreads);
  }
}

}  // namespace mma_decode
}  // namespace cuda
}  // namespace rope_ext
