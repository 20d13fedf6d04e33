// CUDA dispatch: picks a variant from csrc/cuda/rope_variants.cuh, sizes the grid and
// launches on the current stream of x's device. auto: lean (variant 6) in the cases it
// covers (launch_lean), else fp32x4_tile (variant 4); fp32 (variant 2) when
// the 16-byte path does not apply. flat (variant 5) runs only when
// asked for by name: on the H100 it measured level with the tiles or slower at every
// size (issue 19), so auto no longer considers it.
// (No ATen/cuda/CUDAContext.h: it pulls in cuSPARSE/cuBLAS headers that a bare CUDA
// toolkit may lack; the stream and the SM count come from c10 and the runtime.)
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "launch_utils.h"
#include "static_switch.h"
#include "../dispatch.h"
#include "rope_variants.cuh"

namespace rope_ext {
namespace {

using cuda_launch::ceil_div;
using cuda_launch::sm_count;

std::atomic<int> g_tile_rows_per_thread{0};  // 0: the default below (tuning hook)
std::atomic<int> g_flat_rows_per_thread{0};  // 0: the default in launch_flat (tuning hook)
// (auto used to pick variant 5, flat, below a size limit, ROPE_EXT_FLAT_MAX_BYTES; issue 19:
// flat measured level with the tiles or slower everywhere on the H100, so the limit is gone.)

// Blocks of `kernel` resident per SM (launch_utils.h; cached per kernel, device and shape).
template <typename K>
int resident_blocks(K kernel, int threads, size_t smem, int device) {
  return cuda_launch::resident_ctas(reinterpret_cast<const void*>(kernel), threads, smem, device);
}

// Flat grid for the element/pair variants: enough blocks for several waves, the rest
// by grid-stride (keeps gridDim.x in range for tensors of any size).
dim3 flat_grid(int64_t work, int threads, int device) {
  return dim3(static_cast<unsigned>(std::min<int64_t>(ceil_div(work, threads), sm_count(device) * 64L)));
}

// Variant 4: tiles of consecutive rows. Rows per tile: 2 per thread (4 with a
// cos_sin_cache) when the tensor is large; fewer when that would leave SMs idle; and
// few enough that the tile's cos/sin table fits. Measured on the H100, W1 bf16
// (bench/tune_tile.py): 1 row per thread 120 us (block start and table per 32 rows),
// 2 rows 95.8, 4 rows 96.7, 16 rows 101 (a 2.6-wave grid: a long tail). A cache
// lookup is two dependent DRAM reads (position, then the cache row) at the head of
// each block, so longer tiles pay off there: W4 with an fp32 cache 77.4 us at 2 rows
// per thread, 68.6 at 4.
template <typename T>
void launch_tile(const RopeParams& shared, int device, cudaStream_t stream) {
  // Positions shared by the batch fold the B rows of token s into one group (one
  // sin/cos per group). When the batch is the outer dimension (bshd) that makes each
  // tile span B far-apart pieces of memory; with enough heads per token to amortise
  // sin/cos, tiles of consecutive tokens of one sequence stream better (W1 bf16
  // [4,4096,32,128]: 95.6 us folded vs the 1-sequence sweep point of the same size at
  // 97.7% of copy). Few heads (the seed's single head) keep the fold.
  RopeParams p = shared;
  const TensorView& v0 = p.t[0];
  if (p.pos_shared_b && p.B > 1 && heads_total(p) >= 8 && std::abs(v0.in_stride[0]) > std::abs(v0.in_stride[1]))
    p.pos_shared_b = false;
  constexpr int V = 16 / sizeof(T);
  const int half = p.R / 2;
  const int bx = std::min(row_chunks(p, V), cuda::kTileThreads);
  const int by = std::max(1, cuda::kTileThreads / bx);
  const int64_t rows_g = rows_per_group(p);
  const int64_t total = num_groups(p) * rows_g;
  auto kernel = p.interleaved ? cuda::rope_tile_kernel<T, true> : cuda::rope_tile_kernel<T, false>;
  const int64_t resident = sm_count(device) * resident_blocks(kernel, bx * by, 0, device);
  const int knob = g_tile_rows_per_thread.load(std::memory_order_relaxed);
  const int64_t rows_per_thread = knob > 0 ? knob : p.freq == FreqSource::kCosSinCache ? 4 : 2;
  int64_t tile = std::min<int64_t>(by * rows_per_thread, ceil_div(total, resident));
  // But never cut a token group into several tiles when one tile can hold it: each
  // tile computes the table of every group it touches, so a group cut in k costs k
  // tables (ncu, 64 KB sweep point: 536k warp instructions vs Triton's 38k). Sweep,
  // 0.25-4 MB: 5-15% faster. Not with a cos/sin cache: a table entry is then one load,
  // cheap to repeat, and more blocks shorten each block's position -> cache chain
  // (W5 with a cache: 6.1 us with one-row tiles, 6.6 with whole groups).
  if (p.freq != FreqSource::kCosSinCache)
    tile = std::max<int64_t>(tile, std::min<int64_t>(rows_g, by * rows_per_thread));
  // Groups a tile of `tile` rows can touch (it may start mid-group), one table row each.
  auto table_rows = [&](int64_t t) { return (t + rows_g - 2) / rows_g + 1; };
  constexpr int64_t kTableBytes = 32 * 1024;
  while (tile > 1 && table_rows(tile) * half * 8 > kTableBytes) tile = (tile + 1) / 2;
  tile = std::max<int64_t>(tile, ceil_div(total, INT32_MAX));  // gridDim.x limit
  cuda::TileShape ts;
  ts.rows = tile;
  ts.table_stride = static_cast<int32_t>((table_rows(tile) * half + 3) / 4 * 4);
  const size_t smem = 2 * sizeof(float) * ts.table_stride;
  kernel<<<static_cast<unsigned>(ceil_div(total, tile)), dim3(bx, by), smem, stream>>>(p, ts);
}

// Variant 5: one thread per (token group, 16-byte chunk, row set). Rows per thread K:
// the fewest that keep the grid within one wave of resident threads (the bf16/fp16
// neox kernel takes ~116 registers: 4 blocks of 128 per SM), so a decode step gets
// one row per thread (T = 16 q + k: 5120 threads) and larger tensors reuse each
// thread's sin/cos over more heads, with K rows in flight per thread (up to
// kFlatRowsInFlight at once). Blocks shrink (down to one warp) until there is at
// least one per SM. (A guess until bench/tune_flat.py runs: its rows/thread sweep.)
constexpr int64_t kFlatThreadsPerSM = 512;
template <typename T>
void launch_flat(const RopeParams& p, int device, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  const int chunks = row_chunks(p, V);
  const int64_t rows_g = rows_per_group(p), groups = num_groups(p);
  const int64_t items = groups * rows_g * chunks;  // (row, chunk) pairs
  const int sms = sm_count(device);
  const int knob = g_flat_rows_per_thread.load(std::memory_order_relaxed);
  int64_t k = knob > 0 ? knob : ceil_div(items, sms * kFlatThreadsPerSM);
  k = std::max<int64_t>(k, ceil_div(items, int64_t(INT32_MAX) * 32));  // gridDim.x limit
  // The kernel steps rows in 32 bits (r0 += kFlatRowsInFlight * RS, r0 < rows_g < 2^31):
  // RS <= 2^29 keeps that from wrapping (a small knob on a group of >= 2^30 rows looped).
  k = std::max<int64_t>(k, ceil_div(rows_g, int64_t(1) << 29));
  k = std::min<int64_t>(std::max<int64_t>(k, 1), rows_g);
  cuda::FlatShape fs;
  fs.chunks = chunks;
  fs.row_sets = static_cast<int32_t>(ceil_div(rows_g, k));
  fs.threads = groups * fs.row_sets * chunks;
  int bs = cuda::kFlatMaxThreads;
  while (bs > 32 && ceil_div(fs.threads, bs) < sms) bs /= 2;
  auto kernel = p.interleaved ? cuda::rope_flat_kernel<T, true> : cuda::rope_flat_kernel<T, false>;
  kernel<<<static_cast<unsigned>(ceil_div(fs.threads, bs)), bs, 0, stream>>>(p, fs);
}

// Variant 6 (lean): auto's kernel where the case is one it covers (rope_variants.cuh and
// launch_lean below): every size (16-bit types since the twenty-first session, fp32 since
// the twenty-second), in the memory orders measured past 32 MB (kLeanSmallBytes), and calls
// with few rows a token in blocks of several tokens (launch_lean; the small-block limit
// below where that is not possible). Which access width,
// from the H100 latency suite (bench/NOTES.md issue 19: run 9 for the sizes, run 1 of
// 2026-11-24 for the widths; us, lean at 16 / 8 / 4 bytes, the tiles):
//   bf16 [1,S,32,128]: 0.12 MB 5.4 / 4.8 / 4.8, tiles 5.6; 2 MB 7.5 / 6.7 / 6.7, 7.3;
//                      8 MB 11.2 / 10.5 / 10.9, 10.9; 32 MB 28.6 / 28.5 / 28.2, 28.8;
//   fp32: 0.25 MB 5.3 / 4.8 / 5.0, 6.0; 4 MB 7.9 / 7.5 / 7.7, 8.2; 16 MB 15.8 / 16.5 / 16.9, 17.1;
//   W5 (q + k, 16 tokens) 5.9 / 5.2 / 5.1.
// A 16-byte bf16 thread computes 8 sin/cos, an 8-byte one 4: the chain to the first
// store is shorter (841 vs 500 SASS instructions), and below ~8 MB that chain, not DRAM,
// sets the time. So: 8 bytes for 16-bit types (past 32 MB too: 16 bytes 0.3-0.6 us
// slower at W2a / W2b / 128 MB, run 3 of the twenty-first session); fp32 8 bytes up to 4 MB, 16
// bytes past it (past 16 MB not A/B'd by width). (Measured with per-lane sin/cos; with the block's shared table, the
// default since 2026-11-26 for blocks of several row slots, a thread computes about one pair whatever W: not
// re-measured.)
// ROPE_EXT_LEAN_MAX_BYTES / ROPE_EXT_LEAN_BYTES at import, or set_lean_max_bytes /
// set_lean_bytes (tests: every width and rows-per-thread choice), override them; a size
// of 0 turns lean off (the bench's A/B), -1 restores the defaults (no size limit).
// Rows per thread (set_lean_rows_per_thread), the block's shared sin/cos table
// (set_lean_share, ROPE_EXT_LEAN_SHARE=0: each lane its own), the position-free
// instance (set_lean_plain) and its one-row kernel (set_lean_plain1) are A/B knobs too (bench/lean_sweep.py, bench/lean_ab.py,
// bench/small_rope_study.py; bench/NOTES.md, 2026-11-26).
std::atomic<int64_t> g_lean_max_bytes{[] {
  const char* e = std::getenv("ROPE_EXT_LEAN_MAX_BYTES");
  return e ? std::atoll(e) : int64_t(-1);
}()};
std::atomic<int> g_lean_bytes{[] {
  const char* e = std::getenv("ROPE_EXT_LEAN_BYTES");
  const int w = e ? std::atoi(e) : -1;
  return (w == 4 || w == 8 || w == 16) ? w : -1;
}()};
std::atomic<int> g_lean_rows_per_thread{0};  // 0: launch_lean's rule
std::atomic<int> g_lean_hint{1};              // x's loads with L2's evict_last hint past 32 MB (1 on, the default; 0 off)
std::atomic<int> g_lean_min_block{0};         // fewest threads a block keeps when rows are halved (0: 128)
std::atomic<bool> g_lean_plain{true};  // calls without position tensors take the kPlain instance
std::atomic<bool> g_lean_plain1{true};  // ... and at U = 1, one token a block, rope_lean_plain1_kernel
std::atomic<int> g_lean_tokens_per_block{0};  // 1, 2, 4, 8: forced (at most 128 threads a block); 0: the rule
std::atomic<int> g_lean_rows_per_block{0};    // row slots a block RB forced (any count up to 128 threads); 0: the rule
// Small blocks: lean's block holds one token's rows, so a call with few rows a token
// (one head at B = 1, or with per-batch positions: no fold; two or three heads) gets
// blocks of 16-48 bf16 threads, too few bytes in flight per SM. H100, in turns (bench/lean_shapes.py, twenty-second session, runs 4 and
// 7), us, lean / the tiles / the copy: one bf16 head [B, S, 1, 128] 0.125 MB 5.8 / 6.1 /
// 4.2, 1 MB 8.5 / 7.1 / 4.9, 4 MB 15.9 / 8.9 / 7.1, 32 MB 84.9 / 30.1 / 27.5, 128 MB 321 /
// 100 / 93; two heads 4 MB 11.8 / 9.1, 128 MB 179 / 102; four heads 128 MB 94.1 / 101.6
// (lean ahead from a token's 64 threads); one fp32 head 4 MB 10.5 / 8.1. So past
// g_lean_small_block_bytes (256 KB) of x a call whose block's rows x threads a row are
// fewer than g_lean_min_threads (64) takes the tiles, and rows a thread stop where a block
// would fall under that many (launch_lean; 0 threads: neither). Since the twenty-fourth
// session a token under that many takes its rows in one thread and blocks of several
// tokens (launch_lean), so the limit meets only calls whose blocks stay under it: S without
// the factor of 2-8 tokens that 64 threads need (one bf16 head: S a multiple of 4), grids
// too small to double, rotary dims whose rows are few threads, and one-row 16-bit calls
// past 32 MB whose batch shares positions.
// ROPE_EXT_LEAN_MIN_THREADS="threads[,from_bytes]" at import, set_lean_min_threads.
constexpr int kLeanMinThreads = 64;
constexpr int64_t kLeanSmallBlockBytes = int64_t(256) << 10;
std::atomic<int> g_lean_min_threads{kLeanMinThreads};
std::atomic<int64_t> g_lean_small_block_bytes{kLeanSmallBlockBytes};
// "threads" or "threads,from_bytes", non-negative integers; anything else keeps the defaults
// (with a warning on stderr: a mistyped A/B must not pass for the limit being off).
[[maybe_unused]] const bool g_lean_min_threads_env = [] {
  const char* e = std::getenv("ROPE_EXT_LEAN_MIN_THREADS");
  if (!e) return false;
  char* end = nullptr;
  errno = 0;
  const long long threads = std::strtoll(e, &end, 10);
  long long from = kLeanSmallBlockBytes;
  bool ok = end != e && errno == 0 && threads >= 0 && threads <= INT32_MAX;
  if (ok && *end == ',') {
    const char* b = end + 1;
    from = std::strtoll(b, &end, 10);
    ok = end != b && errno == 0 && from >= 0;
  }
  if (!ok || *end != '\0') {
    std::fprintf(stderr, "rope_ext: ROPE_EXT_LEAN_MIN_THREADS=\"%s\" is not \"threads[,from_bytes]\" (non-negative "
                 "integers); the defaults stay\n", e);
    return false;
  }
  g_lean_min_threads.store(static_cast<int>(threads));
  g_lean_small_block_bytes.store(from);
  return true;
}();
std::atomic<bool> g_lean_share{[] {  // a block shares its token's sin/cos through shared memory
  const char* e = std::getenv("ROPE_EXT_LEAN_SHARE");
  return !(e && std::atoi(e) == 0);
}()};
bool lean_share() { return g_lean_share.load(std::memory_order_relaxed); }
// No size limit: 16-bit types since the twenty-first session (H100, in turns, that
// session's runs 3-5: past 32 MB lean ran level with the copy at W2a, W2b folded, W1 and
// 128 MB bshd, 1.3-3.2 us under the tiles, whose margin over the copy varied 1.2-3.4 us
// between machines), fp32 since the twenty-second (its 16 MB limit until then; run 7, us,
// lean / the tiles / the copy: [1, 2048, 32, 128] 32 MB 26.6 / 28.2 / 27.2, [1, 8192, 32,
// 128] 128 MB 93.4 / 94.4 / 93.5; run 4: [4, 8192, 8, 128] 93.8 / 94.1 / 93.6). Past
// kLeanSmallBytes (the old 16-bit limit) launch_lean takes only the memory orders measured
// there and caps rows a thread at 2.
constexpr int64_t kLeanSmallBytes = int64_t(32) << 20;
constexpr int64_t kLeanXFirstBytes = int64_t(2) << 20;  // (launch_lean's rows a thread for few-row tokens)
int64_t lean_max_bytes() {
  const int64_t v = g_lean_max_bytes.load(std::memory_order_relaxed);
  return v >= 0 ? v : INT64_MAX;
}
// (Past 32 MB, 16-bit tensors at W 16 instead of 8, the hint on: level at W4 and 0.1-0.35
// us behind at W2a / W2b / 128 MB bshd, H100, in turns, run 6 of the twenty-sixth session.)
int lean_bytes(int64_t elem_size, int64_t bytes) {
  const int w = g_lean_bytes.load(std::memory_order_relaxed);
  if (w > 0) return w;
  return (elem_size == 4 && bytes > (int64_t(4) << 20)) ? 16 : 8;
}

// The batch fold: an sbhd call (the batch inside the token: |batch stride| < |sequence
// stride|, and each tensor's batch rows right after each other, batch stride = H x head
// stride, in and out) whose positions do not depend on b runs as one token of B * H rows.
// Unfolded, lean's grid (row blocks, S, B) walks s within each b, and in sbhd consecutive
// blocks are then B * H rows apart: W2b (sbhd bf16 [512, 32, 24, 128], H100) ran 76.7-77.3
// us on unfolded lean (the tiles 73.9, the copy 70.9-71.4, run 3 of the twenty-first
// session) and 71.4 folded (the tiles 73.0, the copy 71.6-71.8, run 4, another machine:
// no A/B of the fold in one run). Folded, the blocks walk memory in order. Not where the
// folded rows would pass lean's 16-bit row count (the unfolded call may still fit).
// One-head fold (on by default since the twenty-third session; set_lean_fold_one_head): a
// call whose every tensor has one head (k alone under MQA, the seed form [B, S, 1, D])
// and whose positions the batch shares also runs as one token of B rows, the batch
// stride standing in for the head stride, in any layout (bshd too). Unfolded, such a
// call's token is 16 bf16 threads (the tiles took it past 256 KB until the twenty-fourth
// session; now blocks of several tokens, but not past the cap below, launch_lean). Folded,
// a block shares its token's sin/cos over B rows; in bshd those rows lie
// S x D elements apart, which did not cost. H100, in turns (bench/lean_shapes.py, run 2 of
// the twenty-third session, rows a thread held to 64-thread blocks), us, fold / the tiles /
// torch.compile / copy, one bf16 head: 4 MB 7.65 / 8.93 / 7.86 / 7.14, 8 MB 10.88 / 11.17 /
// 10.78 / 10.18, 32 MB 27.94 / 30.37 / 27.55 / 27.55, 128 MB 99.0 / 99.2 / 93.4 / 93.7, 256
// MB 194.1 / 196.0 / 190.1 / 181.4; one fp32 head 4 MB 7.23 / 8.03 / 7.81 / 7.38, 512 MB
// 383.2 / 381.3. Over three runs the fold was within -1.0% / +0.6% of the tiles at 256 MB
// and -0.6% / +0.5% at fp32 512 MB, over them in two runs of three at each: past
// kLeanFoldOneHeadBytes (128 MB, where it was under the tiles in every run) the tiles
// keep such calls. B = 1 has nothing to fold.
std::atomic<bool> g_lean_fold_one_head{true};
constexpr int64_t kLeanFoldOneHeadBytes = int64_t(128) << 20;
enum class LeanFold { kNone, kBatch, kOneHead };
// B > 1 rows whose positions the batch shares (their sin/cos computed once would serve B).
bool batch_shares_positions(const RopeParams& p) {
  return p.B > 1 && p.pos_shared_b && !p.offsets.ptr && !(p.positions.ptr && p.pos_stride_b != 0);
}
// bytes: x's (q + k's) bytes, for the one-head fold's size limit.
LeanFold lean_fold_batch(const RopeParams& p, int64_t bytes) {
  if (!batch_shares_positions(p)) return LeanFold::kNone;
  if (p.B * heads_total(p) > INT16_MAX) return LeanFold::kNone;
  bool one_head = g_lean_fold_one_head.load(std::memory_order_relaxed) && bytes <= kLeanFoldOneHeadBytes;
  bool batch = true;
  for (int t = 0; t < p.num_tensors; ++t) {
    const TensorView& v = p.t[t];
    one_head = one_head && v.H == 1;
    if (v.in_stride[0] != v.H * v.in_stride[2] || v.out_stride[0] != v.H * v.out_stride[2] ||
        std::abs(v.in_stride[0]) >= std::abs(v.in_stride[1]))
      batch = false;
  }
  return batch ? LeanFold::kBatch : one_head ? LeanFold::kOneHead : LeanFold::kNone;
}

// one_head_fold: this call is a one-head fold's (in bshd its rows lie S x D apart: past 32
// MB not held to token-major memory, for the knob's A/B).
template <typename T>
bool launch_lean(const RopeParams& p, int device, cudaStream_t stream, bool one_head_fold = false) {
  const int64_t bytes = p.B * p.S * heads_total(p) * p.D * static_cast<int64_t>(sizeof(T));  // (the same folded)
  if (const LeanFold fold = lean_fold_batch(p, bytes); fold != LeanFold::kNone) {  // (B = 1 after: no second fold)
    RopeParams folded = p;
    for (int t = 0; t < folded.num_tensors; ++t) {
      TensorView& v = folded.t[t];
      if (fold == LeanFold::kOneHead) {  // row b of the one head: the batch stride
        v.in_stride[2] = v.in_stride[0];
        v.out_stride[2] = v.out_stride[0];
      }
      v.H *= folded.B;
    }
    folded.B = 1;
    return launch_lean<T>(folded, device, stream, fold == LeanFold::kOneHead);
  }
  const bool cache = p.freq == FreqSource::kCosSinCache;
  if (sizeof(T) == 8 || !(p.freq == FreqSource::kInvFreq || cache) || p.num_axes != 1 || p.cp_size != 1) return false;
  if (p.cu_seqlens.ptr && p.num_seqs != 1) return false;
  if (p.copy_tail && p.R != p.D) return false;
  if (p.B > 65535) return false;  // (S / tokens a block <= 65535: below)
  const int64_t rows = heads_total(p), tokens = p.B * p.S;
  if (bytes > lean_max_bytes()) return false;
  // A GPT-J chunk holds whole pairs: at least 2 elements.
  const int wb = lean_bytes(sizeof(T), bytes);
  const int W = (p.interleaved && wb / int(sizeof(T)) < 2) ? 2 * int(sizeof(T)) : wb;
  const int V = W / int(sizeof(T));
  const int chunks = rot_chunks(p, V);
  if (chunks < 1 || chunks > cuda::kLeanMaxThreads || (chunks & (chunks - 1))) return false;
  if (chunks * V != (p.interleaved ? p.R : p.R / 2)) return false;  // the kernel takes R / 2 = chunks * P
  // 32-bit strides, 16-bit head counts, unit-stride frequencies (LeanParams' layout):
  // other calls take the tiles.
  const auto fits32 = [](int64_t x) { return x >= INT32_MIN && x <= INT32_MAX; };
  if (rows > INT16_MAX || (!cache && p.inv_freq_stride != 1) || !fits32(p.cache_stride_row) ||
      !fits32(p.cache_stride_col) || !fits32(p.cache_rows) || !fits32(p.positions.stride) || !fits32(p.pos_stride_b) ||
      !fits32(p.offsets.stride))
    return false;
  cuda::LeanParams lp{};
  for (int t = 0; t < p.num_tensors; ++t) {
    const TensorView& v = p.t[t];
    // The token offset (b * S + s) * ts + b * bfix: bfix is 0 where the batch stride is
    // S token strides (bshd, thd, and any single-token or single-batch call).
    const int64_t ts = p.S == 1 ? v.in_stride[0] : v.in_stride[1];
    const int64_t bfix = p.B > 1 ? v.in_stride[0] - p.S * ts : 0;
    if (!fits32(ts) || !fits32(bfix) || !fits32(v.in_stride[2])) return false;
    // Past 32 MB, only token-major memory (each token's heads together, the batch outside
    // the sequence or folded into the token: bshd, thd, folded sbhd), where lean was
    // measured; unfolded sbhd ran ~4% over the tiles there (the fold's note), bhsd not timed.
    if (bytes > kLeanSmallBytes && !one_head_fold && (bfix || (v.H > 1 && std::abs(v.in_stride[2]) > std::abs(ts))))
      return false;
    if (bfix) lp.cshift |= cuda::kLeanBatchFix;
    lp.in[t] = v.in;
    lp.in_ts[t] = static_cast<int32_t>(ts);
    lp.in_bfix[t] = static_cast<int32_t>(bfix);
    lp.in_hs[t] = static_cast<int32_t>(v.in_stride[2]);
    lp.out[t] = v.out;
    for (int i = 0; i < 3; ++i) {
      if (!fits32(v.out_stride[i])) return false;
      lp.out_s[t][i] = static_cast<int32_t>(v.out_stride[i]);
    }
  }
  uint16_t flags = 0;
  lp.inv_freq = p.inv_freq;
  if (cache) {
    lp.cache = p.cache;
    lp.cache_dtype = p.cache_dtype;
    lp.cache_rows = static_cast<int32_t>(p.cache_rows);
    lp.cache_stride_row = static_cast<int32_t>(p.cache_stride_row);
    lp.cache_stride_col = static_cast<int32_t>(p.cache_stride_col);
    // Vector loads of a chunk's P cos / sin: unit columns, fp32 or x's own dtype, every
    // chunk start aligned to the load (P elements, at most 16 bytes).
    constexpr DType kT = sizeof(T) == 4 ? DType::kFloat32
                         : std::is_same_v<T, c10::Half> ? DType::kFloat16 : DType::kBFloat16;
    const int P = p.interleaved ? V / 2 : V;
    const int64_t es = p.cache_dtype == DType::kFloat32 ? 4 : 2;
    const int64_t align = std::min<int64_t>(16, P * es);
    if (p.cache_stride_col == 1 && (p.cache_dtype == DType::kFloat32 || p.cache_dtype == kT) &&
        reinterpret_cast<uintptr_t>(p.cache) % 16 == 0 && (p.cache_stride_row * es) % align == 0 &&
        (p.R / 2 * es) % align == 0)
      flags |= cuda::kLeanCacheVec;
  }
  if (p.positions.ptr) {
    lp.positions = p.positions.ptr;
    lp.pos_stride = static_cast<int32_t>(p.positions.stride);
    lp.pos_stride_b = static_cast<int32_t>(p.pos_stride_b);
    flags |= cuda::kLeanPos | (p.positions.is64 ? cuda::kLeanPos64 : 0);
  }
  if (p.offsets.ptr) {
    lp.offsets = p.offsets.ptr;
    lp.off_stride = static_cast<int32_t>(p.offsets.stride);
    flags |= cuda::kLeanOff | (p.offsets.is64 ? cuda::kLeanOff64 : 0);
  }
  if (p.cu_seqlens.ptr) {
    lp.seq_start = p.cu_seqlens.ptr;
    flags |= cuda::kLeanSeq | (p.cu_seqlens.is64 ? cuda::kLeanSeq64 : 0);
  }
  lp.flags = flags;
  lp.offset = p.offset;
  lp.H0 = static_cast<int16_t>(p.t[0].H);
  lp.rows = static_cast<int16_t>(rows);
  int cshift = 0;
  while ((1 << cshift) < chunks) ++cshift;
  lp.cshift |= static_cast<uint8_t>(cshift);
  lp.sin_scale = p.sign * p.scale;
  lp.cos_scale = p.scale;
  // Rows per thread U: the fewest that keep the grid within ~512 threads per SM (each
  // thread computes its chunk's sin/cos once for its U rows). Not more to let one block
  // hold a token's rows (its sin/cos table, where it has several row slots, then computed
  // once per token): U = 4 at 0.12-2
  // MB took 0.4-0.6 us more than U = 1 (ncu, H200, run 4 of 2026-11-26; a thread's U
  // rows' address code runs before its frequency load). Rows per block RB: as many as a
  // block of 128 threads holds (fewer where a token has fewer rows); the halving to
  // cover every SM with small calls is a knob now (set_lean_min_block).
  const int sms = sm_count(device);
  // Past 32 MB (the size 16-bit types stopped at on lean until the twenty-first session;
  // fp32 too since the twenty-second, at 2 rows not A/B'd against others: run 7, 128 MB
  // 93.4 us, the copy 93.5) 2 rows a thread: W2a / 128 MB bshd bf16 93.6 / 93.8 us at U = 2 against 94.9 / 94.4 at
  // the rule's 8 and 95.1 / 95.3 at 4 (H100, in turns, run 3 of that session; the tiles
  // 96.5 / 97.1, the copy 93.1-93.7); run 4: 1 row level with 2 (W2b 71.5 / 71.4, W1 93.6
  // / 93.6), 4 rows 0.5-0.6 us slower. W4 (q + k thd, 40 rows a token, random positions: 20
  // row slots in blocks of 8, the third block half idle) in place: U = 2 59.39-59.71 us
  // against U = 1 68.06-68.48 (5 blocks a token, none idle), 2 tokens a block 65.82-66.46
  // (none idle, sin/cos per lane), U = 4 60.48-60.83 (H100, in turns, three passes,
  // bench/latency_rows.py --knobs u1,tpb2,u4, thirtieth session run 5): the idle slots cost
  // less than more blocks (or lanes) computing each token's sin/cos. ncu after a 256 MB
  // write (scripts/ncu_w4.sh, thirty-first session; its 17 replays for the sections are
  // not flushed between, so part of x may be in L2): U = 1 / 2 / 4 66.1 / 57.4 / 56.5 us,
  // 49.2 / 38.9 / 29.9 M warp instructions at 0.72 / 0.65 / 0.51 a cycle a scheduler (U = 1
  // near issue-bound); U = 4 ran there without the hint, which stops at U = 2 (below).
  // In the graphs with the hint (instances at U = 4 and 8 built for the A/B, run 1 of the
  // thirty-second session, three passes in turns, us, in place / out of place): auto
  // 59.18-59.42 / 59.76-59.90, U = 4 59.39-59.60 / 59.62-59.89 (64 registers), U = 8 in one
  // block of 5 slots a token 60.35-60.48 / 60.32-60.54 (80 registers); and auto's instance
  // under __launch_bounds__(128, 12) (40 registers, 8 bytes of spill, 12 blocks a SM
  // instead of 10) 61.28-61.41 / 61.52-61.76. U = 4 tied; U = 8 was timed only in blocks
  // of 5 slots (which cost 2.3 us at U = 2) and the bound only with its spill, so neither
  // is a clean reading of more rows a thread or more occupancy. Removed (bench/NOTES.md
  // has the diff's shape).
  const int min_threads = g_lean_min_threads.load(std::memory_order_relaxed);
  int U = g_lean_rows_per_thread.load(std::memory_order_relaxed);
  // A token under min_threads at one row a thread (one to three bf16 or fp32 heads at D 128
  // past 4 MB, one fp32 head below; more at small rotary dims): its blocks take several tokens (below), and a thread all of
  // the token's rows, so that each pair's sin/cos is computed once for them. A one-row
  // 16-bit token past kLeanXFirstBytes takes U = 2 all the same: that instance loads x
  // before the frequencies (kFreqFirst is U = 1's). H100, in turns (bench/lean_shapes.py,
  // run 2 of the twenty-fourth session), us, U covering the rows / one row a thread (both at
  // 64-thread blocks of several tokens): two bf16 heads B = 1 4 MB 7.65 / 8.80, B = 2 4 MB
  // 7.58 / 8.74, B = 16 32 MB 27.65 / 36.83 (the tiles 31.07, torch.compile 27.90), B = 64
  // 128 MB 94.16 (the tiles 102.30); one bf16 head B = 1 (U = 2 / 1) 4 MB 8.35 / 8.80, 32 MB
  // 34.21 / 37.30, 122 MB 116.6 / 126.5, but 1 MB 5.79 / 5.63 (so U = 1 up to 2 MB); one
  // fp32 head 4 MB 7.78 / 7.58 (run 1: U = 8 7.87-8.06 against 7.39), so fp32 keeps U = 1.
  // Past 32 MB too (unlike many-row tokens' U, capped at 2 there, below): three bf16 heads
  // [16, 4096, 3, 128] 48 MB 38.88 us at U = 4, 4 tokens a block, against the tiles' 42.21
  // (torch.compile 39.36, copy 38.21; run 1 of the twenty-fifth session; run 8 of the
  // twenty-fourth had 42.8 at U = 2, 2 row slots x 2 tokens); three fp32 heads 48 MB 38.37
  // against 40.34; six bf16 heads at D 64 48 MB 38.88 against 41.41 (U = 8, 8 tokens).
  // Untimed: these tokens where a block keeps one (calls up to 256 KB; past it the limit
  // below).
  const bool few_rows = rows * chunks < min_threads, forced_u = U > 0;  // (the knob keeps U in {0, 1, 2, 4, 8})
  if (!forced_u && few_rows) {
    U = sizeof(T) == 2 && bytes > kLeanXFirstBytes ? 2 : 1;
    while (U < 8 && U < rows) U *= 2;
  } else if (!forced_u) {
    U = 1;
    while (U < 8 && tokens * ceil_div(rows, int64_t(U)) * chunks > int64_t(sms) * 512) U *= 2;
    if (bytes > kLeanSmallBytes) U = std::min(U, 2);
    // Nor past a block of g_lean_min_threads: U rows a thread leave rows / U row slots, and
    // a token of few rows then ran one 16-thread slot. H100, in turns (bench/lean_shapes.py,
    // twenty-third session), us, 64-thread blocks / one 16-thread slot (sin/cos per lane
    // there, run 3) / the tiles: four bf16 heads 4 MB 7.44 / 8.35 / 8.98, 32 MB 27.65 /
    // 31.70 / 29.47 (with the table, the rule before: 10.11 / 37.52, run 2); the one-head
    // fold 4 MB 7.74 / 8.32 / 8.86; but 8 MB 10.75 / 10.46-10.62 / 11.14 (the one row where
    // the slot did not lose).
    while (U > 1 && ceil_div(rows, int64_t(U)) * chunks < min_threads) U /= 2;
  }
  const int64_t rows_u = ceil_div(rows, int64_t(U));
  int RB = cuda::kLeanMaxThreads / chunks;
  while (RB > 1 && RB / 2 >= rows_u) RB /= 2;
  // Halving rows per block to cover the SMs stops at 128 threads: smaller blocks lost
  // (bench/small_rope_study.py, H200, bf16 out of place: blocks of 32 threads at 0.12 MB
  // 4.99 us against 4.77 with 128; 2 MB 5.92 against 5.73; equal at 0.5 and 8 MB).
  const int min_block_knob = g_lean_min_block.load(std::memory_order_relaxed);
  const int min_block = min_block_knob > 0 ? min_block_knob : cuda::kLeanMaxThreads;
  while (RB > 1 && (RB / 2) * chunks >= min_block && tokens * ceil_div(rows_u, int64_t(RB)) < sms) RB /= 2;
  // Tokens a block forced (the knob, below): it takes the block's room from the row slots
  // (a bench A/B of blocks of few row slots and several tokens at many rows a token).
  const int forced_tpb = g_lean_tokens_per_block.load(std::memory_order_relaxed);  // (0, 1, 2, 4 or 8)
  if (forced_tpb > 1)
    while (RB > 1 && p.S % forced_tpb == 0 && RB * chunks * forced_tpb > cuda::kLeanMaxThreads) RB /= 2;
  // Row slots a block forced (the knob; any count, the kernel steps rows by RB). W4 in
  // place, auto's 3 blocks of 8 slots a token (the third half idle) against blocks without
  // an idle slot, H100, in turns, three passes (bench/latency_rows.py --knobs, run 1 of the
  // thirty-second session), us: auto 59.18-59.42; 5 blocks of 4 slots 59.62-59.78; 4 of 5
  // 61.54-61.73; 3 of 7 60.61-60.64 (the copy 60.42-60.77). Filling the idle slots gained
  // nothing; rows a block off a power of 2 lost 1.2-2.4 us (not measured why: their last
  // warp half empty at 80 and 112 threads, a block's 2.5 / 3.5 KB of rows across the 2 / 4
  // KB spans the power-of-2 blocks keep to, or its rows across the q / k boundary at row
  // 32). A forced RB overrides the room set_lean_tokens_per_block made (tokens a block
  // then shrink to fit 128 threads, below).
  const int forced_rb = g_lean_rows_per_block.load(std::memory_order_relaxed);
  if (forced_rb > 0 && forced_rb * chunks <= cuda::kLeanMaxThreads) RB = forced_rb;
  lp.rows_per_block = static_cast<uint8_t>(RB);
  const int threads = RB * chunks;
  const int64_t row_blocks = ceil_div(rows_u, int64_t(RB));
  // Tokens a block (blockDim.y): a token of few rows (one to three heads unfolded: B = 1,
  // per-batch positions; its rows in one thread, above) is a block of 16 bf16 threads, too few bytes in flight a SM
  // at 32 blocks (the small-block limit's measurements above). Consecutive tokens then
  // share a block, up to g_lean_min_threads (64; 128 where S / 64 threads' tokens is past
  // the grid's 65535), while the grid keeps a block per SM and S divides evenly (the
  // kernel takes S = gridDim.y * blockDim.y); sin/cos per lane (each row slot its own
  // token). H100, in turns (bench/lean_shapes.py, run 1 of the twenty-fourth session), us,
  // 4 tokens a block / the tiles / torch.compile / copy, one bf16 head B = 1: 1 MB 5.50 /
  // 7.14 / 5.95 / 4.96, 4 MB 8.74 / 12.06 / 10.48 / 7.01, 32 MB 36.98 / 53.95 / 49.86 /
  // 27.17 (nothing shares a pair's sin/cos there: a bf16 thread computes one for every 8
  // bytes it moves); two heads B = 1 4 MB (2 tokens) 8.54 / 9.82 / 9.31; one fp32 head 4 MB
  // (2 tokens) 7.39 / 9.54 / 10.82 (these at one row a thread, U = 1; U above). Not for
  // one-row 16-bit calls past 32 MB whose batch shares its positions (B > 1; the one-head
  // fold's cap): the tiles share each pair's sin/cos over the batch there, and unfolded
  // lean lost, the seed form bf16 [128, 8192, 1, 128] 256 MB 256.6 against the tiles' 200.1
  // (fp32 gained: 512 MB 359.3 against 387.4, copy 444; two bf16 heads share theirs in a
  // thread, U = 2: B = 64 128 MB 94.2 against the tiles' 102.3). Nor where U rows a thread
  // do not cover a few-row token (more than 8 rows, at small rotary dims): its rows would
  // take several row slots at several tokens a block, the launch three bf16 heads lost with
  // (above; why that block shape lost is not settled: 2 rows a thread in one row slot x 8
  // tokens ran 39.0 there too), so such calls keep the tiles past 256 KB.
  const bool one_token = (sizeof(T) == 2 && bytes > kLeanSmallBytes && rows == 1 && batch_shares_positions(p)) ||
                         (few_rows && rows_u > 1 && !forced_u);  // (the two exclusions above)
  int tpb = forced_tpb > 0 ? forced_tpb : 1;
  if (forced_tpb > 0) {
    while (tpb > 1 && (p.S % tpb || threads * tpb > cuda::kLeanMaxThreads)) tpb /= 2;
  } else if (!one_token) {
    const auto can_double = [&] {
      return tpb < 8 && threads * 2 * tpb <= cuda::kLeanMaxThreads && p.S % (2 * tpb) == 0;
    };
    while (can_double() && threads * tpb < min_threads && row_blocks * (p.S / (2 * tpb)) * p.B >= sms) tpb *= 2;
    while (tpb > 1 && can_double() && p.S / tpb > 65535) tpb *= 2;  // (to fit the grid)
  }
  if (p.S / tpb > 65535) return false;
  // A block's rows x threads a row at one row a thread (its bytes in flight): a token's
  // rows x tokens a block.
  if (rows * chunks * tpb < min_threads && bytes > g_lean_small_block_bytes.load(std::memory_order_relaxed))
    return false;
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(p.S / tpb), static_cast<unsigned>(p.B));
  const dim3 block(static_cast<unsigned>(threads), static_cast<unsigned>(tpb));
  last_lean_launch() = LeanLaunch{grid.x, grid.y, grid.z, U, W, tpb};
  // The block's sin/cos table (kSource 1), where the block has more than one row slot: with
  // one (rows_u = 1: one head, or U rows a thread covering the token) a lane's sin/cos serve
  // its own U rows only, and the table added a barrier, a shared-memory round trip and (a
  // block narrower than R / 2) lean_table_rest. H100, in turns (bench/lean_shapes.py, run 2
  // of the twenty-third session), us, per-lane / the table, one slot: one bf16 head 0.125 MB
  // 4.77 / 5.60 (torch.compile 4.48), 1 MB 7.04 / 8.32; four heads at U = 4, 4 MB 8.35 /
  // 10.11, 32 MB 32.10 / 37.52; two heads at U = 8, 128 MB 162.3 / 180.3. With several slots,
  // same U, level: 32 / 8 / 4 bf16 heads at 128 MB 93.34 / 93.38, 93.50 / 93.57, 93.73 /
  // 94.11; 32 fp32 heads at 32 MB 26.80 / 26.56. (rows_u > 1 is the block's RB > 1 at the
  // default min block and up to 64 chunks a row; under set_lean_min_block or
  // set_lean_rows_per_block an RB of 1 keeps the table, untimed.)
  // (Plain calls at U = 1 and one token a block run rope_lean_plain1_kernel, per lane: below.)
  const bool table = !cache && lean_share() && rows_u > 1 && tpb == 1;  // (the table holds one token's)
  // No position tensor (none of the position flags): the instance without the position
  // code (kPlain).
  const bool no_pos_tensors = !(flags & (cuda::kLeanPos | cuda::kLeanOff | cuda::kLeanSeq));
  const bool plain = !cache && no_pos_tensors && g_lean_plain.load(std::memory_order_relaxed);
  // Plain calls at one row a thread and one token a block (up to ~1 MB of 32 bf16 heads)
  // without the batch correction: rope_lean_plain1_kernel (rope_variants.cuh has why; a
  // call the L2 hint takes, past 32 MB, keeps rope_lean_kernel). H100, in turns
  // (bench/latency_rows.py --knobs noplain1, three passes, twenty-eighth session), us, it /
  // the kPlain instances / torch.compile: bf16 [1, 16, 32, 128] 4.32-4.45 / 4.61-4.70 /
  // 4.32-4.45; [1, 64, 32, 128] 4.69-4.83 / 4.80-4.99 / 4.61-4.67; [1, 128, 32, 128] 5.12-5.25 /
  // 5.18-5.28 / 5.28-5.31.
  // Such calls with a contiguous cos_sin_cache whose chunks load as vectors too (kSource 2 /
  // 3: x's and the row's loads together, as torch.compile's kernel of the cached formula;
  // 0.35-0.67 us under the cache instance pass by pass at 0.125-0.5 MB, level with
  // torch.compile: the kernel's comment has the numbers).
  // (A contiguous table: its pointer in inv_freq's slot, its row stride R; the kernel has why.
  // Its rows s + offset, s < S, checked here, free: on CUDA the host's value checks are
  // opt-in, and a call reaching past the table keeps the cache instance, whose rows out of
  // range come out NaN.)
  const bool plain1_cache = cache && no_pos_tensors && (flags & cuda::kLeanCacheVec) && p.cache_stride_row == p.R &&
                            p.offset >= 0 && p.offset < p.cache_rows && p.S <= p.cache_rows - p.offset &&
                            g_lean_plain.load(std::memory_order_relaxed);
  const bool plain1 = (plain || plain1_cache) && U == 1 && tpb == 1 && !(lp.cshift & cuda::kLeanBatchFix) &&
                      g_lean_plain1.load(std::memory_order_relaxed);
  if (plain1 && cache) lp.inv_freq = static_cast<const float*>(p.cache);
  // x's loads with L2's evict_last hint, each line demoted after use (kHint,
  // rope_variants.cuh; off with set_lean_l2_hint(False)), for calls past 32 MB (U <= 2, W >=
  // 8 there) whose every line of x some chunk starts: 128-byte aligned inputs, token, head
  // and batch strides, and halves (neox) or rows (GPT-J); else a line could stay held.
  // H100, in turns (bench/latency_rows.py --hint, run 3 of the twenty-sixth session), us,
  // plain loads -> the hint, two passes, out of place / in place: W2a 93.66, 93.74 ->
  // 92.61, 92.51 / 93.38, 93.42 -> 92.30, 92.18 (torch.compile 92.83-92.93, the copy
  // 93.12-93.44); W2b 71.87, 71.82 -> 70.59, 70.58 / 71.36, 71.52 -> 70.38, 70.53
  // (torch.compile 70.45-70.66); 128 MB bshd 93.84, 93.76 -> 92.51, 92.53 / 93.57, 93.34 ->
  // 92.19, 92.16; W4 60.61, 60.82 -> 59.86, 59.84 / 60.72, 60.86 -> 59.49, 59.71 (the copy
  // 60.05-60.45). After a hinted call a 30 MB read stays in L2 (17.4 us; after a plain call
  // 16.7, after none 18.0; after torch.compile's undemoted hint 21.7 in the twentieth
  // session): consistent with no line left held, within the probe's ~1 us spread; the
  // alignment rule is what guarantees it (each hinted line is demoted by the warp that
  // loaded it, after its stores). The tiles had the same pair in the
  // twentieth session (removed: bench/NOTES.md has why; lean has taken these calls since).
  // (sm_80 and later: the hint's PTX; older devices run plain loads and report none.)
  bool hint = g_lean_hint.load(std::memory_order_relaxed) && bytes > kLeanSmallBytes && !cache && U <= 2 && W >= 8 &&
              cuda_launch::device_attribute<cudaDevAttrComputeCapabilityMajor>(device) >= 8;
  if (hint) {
    const int64_t es = sizeof(T);
    hint = ((p.interleaved ? p.R : p.R / 2) * es) % 128 == 0;
    for (int t = 0; t < p.num_tensors; ++t)
      hint = hint && reinterpret_cast<uintptr_t>(lp.in[t]) % 128 == 0 && (lp.in_ts[t] * es) % 128 == 0 &&
             (p.t[t].H == 1 || (lp.in_hs[t] * es) % 128 == 0) && (lp.in_bfix[t] * es) % 128 == 0;
  }
  last_lean_hint() = hint;
  if constexpr (sizeof(T) <= 4) {  // (no fp64 instances: it returned above)
    // Access width W (16, 8 or 4 bytes), pairing, rows per thread U (1, 2, 4, 8). An fp32
    // 4-byte word holds one element: neox only (GPT-J took W = 8 above).
    auto go = [&]<int kW>() {
      ROPE_BOOL_SWITCH(p.interleaved, kInterleaved, [&] {
        constexpr int P = kInterleaved ? kW / int(sizeof(T)) / 2 : kW / int(sizeof(T));
        if constexpr (P >= 1) {
          // The frequency source is the kernel's fifth template argument, kPlain its last
          // (rope_variants.cuh).
          ROPE_POW2_UPTO8_SWITCH(U, kU, [&] {
            const size_t smem = 2 * sizeof(float) * (p.R / 2);  // the table: sin, then cos, of R / 2 pairs
            // kHint instances only at U <= 2 and W >= 8 with computed sin/cos (the calls past
            // 32 MB it is taken for: below).
            const auto run = [&]<int kS, bool kP>() {
              const size_t sm = kS == 1 ? smem : 0;
              if constexpr (kU <= 2 && kW >= 8 && kS != 2) {
                if (hint) {
                  cuda::rope_lean_kernel<T, kInterleaved, kU, kW, kS, kP, true><<<grid, block, sm, stream>>>(lp);
                  return;
                }
              }
              cuda::rope_lean_kernel<T, kInterleaved, kU, kW, kS, kP><<<grid, block, sm, stream>>>(lp);
            };
            if constexpr (kU == 1) {
              if (plain1 && !hint) {
                if (cache && p.cache_dtype == DType::kFloat32)
                  cuda::rope_lean_plain1_kernel<T, kInterleaved, kW, 3><<<grid, block, 0, stream>>>(lp);
                else if (cache)  // (x's dtype: kLeanCacheVec)
                  cuda::rope_lean_plain1_kernel<T, kInterleaved, kW, 2><<<grid, block, 0, stream>>>(lp);
                else
                  cuda::rope_lean_plain1_kernel<T, kInterleaved, kW><<<grid, block, 0, stream>>>(lp);
                return;
              }
            }
            if (cache)
              run.template operator()<2, false>();
            else if (table && plain)
              run.template operator()<1, true>();
            else if (table)
              run.template operator()<1, false>();
            else if (plain)
              run.template operator()<0, true>();
            else
              run.template operator()<0, false>();
          });
        }
      });
    };
    if (W == 16) go.template operator()<16>();
    else if (W == 8) go.template operator()<8>();
    else go.template operator()<4>();
  }
  return true;
}

template <typename T>
void launch(const RopeParams& p, Impl impl, int device, cudaStream_t stream) {
  const size_t smem = sizeof(float) * std::max(1, p.R / 2);  // frequency table
  const int64_t tokens_rows = p.B * p.S * heads_total(p);
  if (tokens_rows == 0) return;
  if (impl == Impl::kNaive) {
    constexpr int kThreads = 256;
    cuda::rope_naive_kernel<T><<<flat_grid(tokens_rows * p.D, kThreads, device), kThreads, 0, stream>>>(p);
  } else if (impl == Impl::kFp32) {
    constexpr int kThreads = 256;
    const int64_t items = p.R / 2 + (p.copy_tail ? p.D - p.R : 0);
    cuda::rope_fp32_kernel<T><<<flat_grid(tokens_rows * items, kThreads, device), kThreads, smem, stream>>>(p);
  } else if (impl == Impl::kFp32x4Tile) {
    launch_tile<T>(p, device, stream);
  } else if (impl == Impl::kAuto) {  // run_cuda's choice: lean where it applies, else the tiles
    if (!launch_lean<T>(p, device, stream)) launch_tile<T>(p, device, stream);
  } else if (impl == Impl::kFlat) {
    launch_flat<T>(p, device, stream);
  } else {
    const int chunks = row_chunks(p, 16 / sizeof(T));
    const int64_t rows = rows_per_group(p), groups = num_groups(p);
    // x: the chunks of a row (a warp of bf16 neox D=128 covers 4 rows).
    const int bx = std::min(chunks, cuda::kMaxThreads);
    // y: about kRowsPerThread rows per thread (each thread recomputes its chunk's
    // sin/cos per group, so fewer, longer threads do less of that), at least a warp.
    const int by = static_cast<int>(std::max<int64_t>(
        std::max(1, 32 / bx), std::min<int64_t>(ceil_div(rows, cuda::kRowsPerThread), cuda::kMaxThreads / bx)));
    // Few tokens (decode): split each group's rows over more blocks to fill the SMs.
    const int64_t want_blocks = 2L * sm_count(device) * std::max(1, 2048 / (bx * by));
    int64_t gy = 1;
    if (groups < want_blocks)
      gy = std::min<int64_t>({ceil_div(want_blocks, groups), ceil_div(rows, by), 65535});
    auto kernel = p.interleaved ? cuda::rope_fp32x4_kernel<T, true> : cuda::rope_fp32x4_kernel<T, false>;
    // One wave of resident blocks, each walking several groups (the frequency table
    // and the block start are paid once per block, not once per token); gy blocks
    // share a group's rows.
    const int64_t resident = sm_count(device) * resident_blocks(kernel, bx * by, smem, device);
    const int64_t gx = std::max<int64_t>(1, std::min<int64_t>(groups, ceil_div(resident, gy)));
    kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), dim3(bx, by), smem, stream>>>(p);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

bool& last_lean_hint() {
  thread_local bool h = false;
  return h;
}
void set_lean_l2_hint(bool on) { g_lean_hint.store(on ? 1 : 0); }
LeanLaunch& last_lean_launch() {
  static thread_local LeanLaunch l;
  return l;
}
void set_lean_max_bytes(int64_t n) { g_lean_max_bytes.store(n < 0 ? -1 : n); }
void set_lean_bytes(int64_t w) { g_lean_bytes.store((w == 4 || w == 8 || w == 16) ? int(w) : -1); }
void set_lean_share(bool on) { g_lean_share.store(on); }
void set_lean_plain(bool on) { g_lean_plain.store(on); }
void set_lean_plain1(bool on) { g_lean_plain1.store(on); }
void set_lean_rows_per_block(int n) { g_lean_rows_per_block.store(n > 0 && n <= 128 ? n : 0); }
void set_lean_tokens_per_block(int n) { g_lean_tokens_per_block.store((n == 1 || n == 2 || n == 4 || n == 8) ? n : 0); }
void set_lean_min_threads(int threads, int64_t from_bytes) {  // -1: the defaults
  g_lean_min_threads.store(threads < 0 ? kLeanMinThreads : threads);
  g_lean_small_block_bytes.store(from_bytes < 0 ? kLeanSmallBlockBytes : from_bytes);
}
void set_lean_fold_one_head(bool on) { g_lean_fold_one_head.store(on); }
void set_lean_min_block(int n) { g_lean_min_block.store(n < 0 ? 0 : n); }  // 1: the old rule (down to RB = 1)
void set_lean_rows_per_thread(int n) { g_lean_rows_per_thread.store((n == 1 || n == 2 || n == 4 || n == 8) ? n : 0); }
void set_tile_rows_per_thread(int n) { g_tile_rows_per_thread.store(n < 0 ? 0 : n); }
void set_flat_rows_per_thread(int n) { g_flat_rows_per_thread.store(n < 0 ? 0 : n); }

void run_cuda(const RopeParams& p, Impl impl, at::ScalarType dtype, c10::Device device) {
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  last_lean_launch() = LeanLaunch{};  // (tests: zeros unless this call launches lean)
  last_lean_hint() = false;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_ext_cuda", [&] {
    Impl chosen = impl;
    // auto: lean (variant 6) where it applies, else the tiles (flat lost
    // on the H100: issue 19); fp32 where the 16-byte path does not apply. kAuto reaching
    // launch() means "vector-eligible, lean or tiles".
    if (impl == Impl::kAuto && !vector_eligible(p, sizeof(scalar_t), nullptr)) chosen = Impl::kFp32;
    launch<scalar_t>(p, chosen, device.index(), stream);
  });
}

}  // namespace rope_ext
