// CUDA dispatch of the attention family: launchers for csrc/cuda/attention_variants.cuh
// (variants 1-4) and decode_mma.cuh (variant 5), and the split heuristic. Every launch runs on the
// current stream of the tensors' device under a device guard, followed by a launch check.
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>

#include "launch_utils.h"
#include "static_switch.h"
#include "../attention.h"
#include "attention_variants.cuh"
#include "decode_mma.h"

namespace rope_ext {
namespace {

using cuda_launch::ceil_div;
using cuda_launch::sm_count;



// ---------------------------------------------------------------------------- 1. append_kv
bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// 16-byte vectors need: unit feature strides, aligned pointers, strides in whole
// vectors, and rows that split into whole vectors (rotary halves / pairs, the tail).
bool append_vector_ok(const AppendParams& p, int64_t elem_size) {
  const int64_t V = 16 / elem_size;
  const RopeParams& r = p.rope;
  if (r.D % V || p.Dv % V || (r.D - r.R) % V || (r.interleaved ? r.R % V : (r.R / 2) % V)) return false;
  if (!aligned16(p.k) || !aligned16(p.v) || !aligned16(p.cache.k) || !aligned16(p.cache.v)) return false;
  if (p.q && !aligned16(p.q)) return false;
  const int64_t* in[3] = {p.k_stride, p.v_stride, p.q ? p.q_stride : p.k_stride};
  for (const int64_t* s : in)
    if (s[3] != 1 || s[0] % V || s[1] % V || s[2] % V) return false;
  for (int d = 0; d < 3; ++d)
    if (p.cache.k_stride[d] % V || p.cache.v_stride[d] % V) return false;
  return true;
}

// A token's input elements: its K and V rows of every kv head, and its Q row (p.Hq is 0
// without q).
int64_t append_token_elems(const AppendParams& p) {
  return p.cache.Hk * (p.rope.D + p.Dv) + p.Hq * p.rope.D;
}

// The kernels' FastDiv divisors (AppendParams::Dividers) for chunks of V elements; the
// kernels' indices are 32-bit. Returns the work items per token of kernel 1.
int64_t set_append_dividers(AppendParams& p, int V) {
  const int half = p.rope.R / 2;
  // A token's elements bound its items (append_items counts them in 32 bits).
  const int64_t token_elems = append_token_elems(p);
  TORCH_CHECK_VALUE(p.num_tokens < (int64_t(1) << 31) && token_elems < (int64_t(1) << 30),
                    "rope_ext: append_kv: too many tokens or heads for one launch (the kernel's indices are 32-bit)");
  const cuda::AppendItems n = cuda::append_items(p, V);
  p.div.per_tok = FastDiv(static_cast<uint32_t>(n.per_tok));
  p.div.k_rot = FastDiv(static_cast<uint32_t>(n.n_rot));
  p.div.k_tail = FastDiv(static_cast<uint32_t>(n.n_tail));
  p.div.v_chunks = FastDiv(static_cast<uint32_t>(n.v_chunks));
  p.div.n_rot = FastDiv(static_cast<uint32_t>(n.n_rot));
  p.div.T = FastDiv(static_cast<uint32_t>(std::min<int64_t>(p.T, INT32_MAX)));
  p.div.half = FastDiv(static_cast<uint32_t>(std::max(half, 1)));
  p.div.rot_tok = FastDiv(static_cast<uint32_t>(((p.rotate_k ? p.cache.Hk : 0) + p.Hq) * n.n_rot));
  return n.per_tok;
}

// The append kernels' shapes (set_append_shape picks one: bench A/B, tests; -1 auto):
// kernel 1 (items per thread, blocks per SM) 0 = (4, 3), 1 = (2, 4), 2 = (1, 6); kernel 1b
// (bulk) with ~8 KB (3) or ~16 KB (4) of input rows per block (T = 8192: 29.9 / 30.6 us,
// ~32 KB 32.0; with q 74.7 / 74.9; runs 3 and 4 of 2026-11-25); 5 kernel 1c (lean). Auto:
// 3 where the bulk kernel applies (append_bulk_ok) and there are >= 2 tokens per SM, else
// 5 where the lean kernel applies, else 1 (a shape that does not apply takes 1). Measured (H100, run 3 of 2026-11-24 evening,
// CUDA graph, cold L2; T = 8192 / with q / fp8 / fp8 with q, us): (4, 3) 34.5 / 76.4 /
// 45.1 / 86.3; (2, 4) 34.1 / 75.5 / 41.5 / 77.2; (1, 6) 35.3 / 76.5 / 44.6 / 83.1; T = 16
// 6.9-7.4 for all. So (2, 4) for kernel 1: the bf16 rows within 1%, fp8 8-11% faster.
// Kernel 1 did not lift bf16 T = 8192 above ~77% of a same-size copy (35.5 us against
// 27.4, run 1 of 2026-11-25; 33.3 with FastDiv, run 2).
std::atomic<int> g_append_shape{-1};
// The lean append kernel's fewest threads per block when its rows are halved to cover
// the SMs (0: down to one row per block; the rope op's lean stops at 128, where smaller
// blocks lost: bench/NOTES.md, issue 19). An A/B knob (set_append_lean_min_block).
std::atomic<int> g_append_lean_min_block{0};
// The lean append kernel's chunk bytes (W; 0: launch_append_lean's rule). A/B knob and
// tests (set_append_lean_bytes).
std::atomic<int> g_append_lean_bytes{0};

template <typename T, bool kInterleaved, bool kVec, bool kFp8, int kItems, int kMinBlocks>
void launch_append_shape(const AppendParams& params, int device, cudaStream_t stream) {
  AppendParams p = params;
  const int half = p.rope.R / 2;
  // Tokens per block: the block's threads own kItems items each (every item of a
  // token stays in one block), at least 2 blocks per SM where the token count allows,
  // and a sin/cos table that fits in 32 KB.
  constexpr int V = kVec ? 16 / static_cast<int>(sizeof(T)) : (kInterleaved ? 2 : 1);
  const int64_t per_token = set_append_dividers(p, V);
  const int64_t cap = int64_t(cuda::kAppendThreads) * kItems;  // items a block holds at once
  int64_t tpb = std::max<int64_t>(1, cap / std::max<int64_t>(1, per_token));
  tpb = std::min<int64_t>(tpb, std::max<int64_t>(1, p.num_tokens / (2 * sm_count(device))));
  tpb = std::min<int64_t>(tpb, std::max<int64_t>(1, 32 * 1024 / (8 * std::max(1, half))));
  const size_t smem = cuda::append_tables_bytes(p, static_cast<int>(tpb), cuda::kAppendThreads);
  const int64_t blocks = ceil_div(p.num_tokens, tpb);
  TORCH_CHECK_VALUE(blocks < (int64_t(1) << 31), "rope_ext: append_kv: too many tokens for one launch");
  cuda::append_kv_kernel<T, kInterleaved, kVec, kFp8, kItems, kMinBlocks>
      <<<static_cast<unsigned>(blocks), cuda::kAppendThreads, smem, stream>>>(p, static_cast<int>(tpb));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Kernel 1b's staged rows per token (bytes): K, V and Q (if given) rows of every head,
// and for an fp8 cache the quantized K and V rows.
int64_t append_bulk_row_bytes(const AppendParams& p, int64_t elem_size) {
  return append_token_elems(p) * elem_size + (p.cache.fp8 ? p.cache.Hk * (p.rope.D + p.Dv) : 0);
}

// Kernel 1b applies: 16-byte vectors (append_vector_ok), sm_90, a token's heads contiguous
// in k, v and q (one bulk load per row), the cache's heads adjacent (one bulk store per
// row) or apart (one per head), a token's rows within 40 KB; an fp8 cache's rows, heads
// and slots also in whole 16-byte units.
bool append_bulk_ok(const AppendParams& p, int64_t elem_size, int device) {
  if (cuda_launch::device_attribute<cudaDevAttrComputeCapabilityMajor>(device) < 9) return false;
  const int64_t Hk = p.cache.Hk, D = p.rope.D;
  // The inputs: a token's heads one run (one bulk load per row). The cache: heads adjacent
  // (one bulk store per token row) or not (one per head, e.g. head-major caches).
  if (Hk > 1 && (p.k_stride[2] != D || p.v_stride[2] != p.Dv)) return false;
  const bool cache_heads_apart = Hk > 1 && (p.cache.k_stride[2] != D || p.cache.v_stride[2] != p.Dv);
  // Every bulk store 16-byte aligned (16-bit caches: append_vector_ok's strides).
  if (p.cache.fp8 && ((Hk * D) % 16 || (Hk * p.Dv) % 16 || p.cache.k_stride[0] % 16 || p.cache.k_stride[1] % 16 ||
                      p.cache.v_stride[0] % 16 || p.cache.v_stride[1] % 16))
    return false;
  if (p.cache.fp8 && cache_heads_apart && (D % 16 || p.Dv % 16 || p.cache.k_stride[2] % 16 || p.cache.v_stride[2] % 16))
    return false;
  if (p.q && p.Hq > 1 && p.q_stride[2] != D) return false;
  return append_bulk_row_bytes(p, elem_size) <= 40 * 1024 && p.rope.R <= 512;  // one token within 48 KB
}

template <typename T, bool kInterleaved, bool kFp8>
void launch_append_bulk(const AppendParams& params, int device, cudaStream_t stream, int64_t target_bytes) {
  AppendParams p = params;
  set_append_dividers(p, 16 / static_cast<int>(sizeof(T)));
  const int64_t row = append_bulk_row_bytes(p, sizeof(T));
  // Tokens per block: ~target_bytes of input rows (an fp8 cache's staged rows not
  // counted: at 8 KB with them, one token per block, fp8 T = 8192 took 36.7 us against
  // 32.3 with two, run 5 of 2026-11-25), at most 16, and >= 2 blocks per SM where the
  // token count allows.
  const int64_t in_row = append_token_elems(p) * int64_t(sizeof(T));
  int64_t tpb = std::clamp<int64_t>(target_bytes / in_row, 1, 16);
  tpb = std::min<int64_t>(tpb, std::max<int64_t>(1, p.num_tokens / (2 * sm_count(device))));
  auto smem_of = [&](int64_t n) {  // rows, the mbarrier (16 bytes: the tables stay aligned), the tables
    return static_cast<size_t>(n * row + 16) + cuda::append_tables_bytes(p, static_cast<int>(n), cuda::kAppendBulkThreads);
  };
  while (tpb > 1 && smem_of(tpb) > 48 * 1024) --tpb;  // no opt-in to more dynamic shared memory
  const size_t smem = smem_of(tpb);
  const int64_t blocks = ceil_div(p.num_tokens, tpb);
  TORCH_CHECK_VALUE(blocks < (int64_t(1) << 31), "rope_ext: append_kv: too many tokens for one launch");
  TORCH_CHECK(smem <= 48 * 1024, "rope_ext: append_kv: internal error: bulk block of ", smem, " bytes");
  cuda::append_kv_bulk_kernel<T, kInterleaved, kFp8>
      <<<static_cast<unsigned>(blocks), cuda::kAppendBulkThreads, smem, stream>>>(p, static_cast<int>(tpb));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Kernel 1c (lean): the cases it covers (attention_variants.cuh) with 16-byte vectors
// (append_vector_ok: the W-byte chunks are aligned), at most 128 chunks a row, every
// index and stride within 32 bits and 2 Hk + Hq within 16 (AppendLeanParams' fields).
// Returns false (nothing launched) otherwise.
template <typename T, bool kInterleaved, bool kFp8, int W>
bool launch_append_lean_w(const AppendParams& p, int device, cudaStream_t stream) {
  const RopeParams& r = p.rope;
  constexpr int V = W / static_cast<int>(sizeof(T));
  if (r.R != r.D || p.Dv != r.D || !p.rotate_k || r.freq != FreqSource::kInvFreq || r.num_axes != 1 || r.cp_size != 1)
    return false;
  if (p.varlen && p.B > 31) return false;  // lanes 0..B hold cu_seqlens
  const int chunks = rot_chunks(r, V);
  if (chunks < 1 || chunks > 128 || (chunks & (chunks - 1)) || (r.interleaved ? r.D % V : (r.R / 2) % V)) return false;
  const int64_t rows = 2 * p.cache.Hk + p.Hq, tokens = p.num_tokens;
  const int64_t gy = p.varlen ? tokens : p.T, gz = p.varlen ? 1 : p.B;
  if (gy > 65535 || gz > 65535 || rows > INT16_MAX) return false;
  const auto fits = [](int64_t x) { return x >= INT32_MIN && x <= INT32_MAX; };
  const KVCacheView& c = p.cache;
  for (int d = 0; d < 3; ++d)
    if (!fits(p.k_stride[d]) || !fits(p.v_stride[d]) || !fits(p.q_stride[d]) || !fits(c.k_stride[d]) ||
        !fits(c.v_stride[d]))
      return false;
  if (!fits(r.inv_freq_stride) || !fits(r.pos_stride_b) || !fits(c.capacity) || !fits(c.block_size) ||
      !fits(c.num_blocks) || !fits(c.bt_stride_b) || !fits(c.k_scale_stride) || !fits(c.v_scale_stride) ||
      !fits(c.seqlens.stride) || !fits(r.cu_seqlens.stride) || !fits(r.positions.stride) || !fits(r.offsets.stride) ||
      !fits(c.block_table.stride))
    return false;
  cuda::AppendLeanParams lp{};
  uint16_t flags = c.seqlens.is64 ? cuda::kALLen64 : 0;
  lp.rows = static_cast<uint16_t>(rows);
  lp.Hk = static_cast<uint16_t>(c.Hk);
  lp.half = static_cast<uint16_t>(r.R / 2);
  lp.nseq = p.varlen ? static_cast<uint16_t>(p.B) : 0;
  const int64_t* in_s[3] = {p.k_stride, p.v_stride, p.q_stride};
  for (int t = 0; t < 3; ++t)
    for (int d = 0; d < 3; ++d) lp.in_s[t][d] = static_cast<int32_t>(in_s[t][d]);
  lp.in[0] = p.k;
  lp.in[1] = p.v;
  lp.in[2] = p.q;
  lp.cache[0] = c.k;
  lp.cache[1] = c.v;
  for (int d = 0; d < 3; ++d) {
    lp.cache_s[0][d] = static_cast<int32_t>(c.k_stride[d]);
    lp.cache_s[1][d] = static_cast<int32_t>(c.v_stride[d]);
  }
  lp.seqlens = c.seqlens.ptr;
  lp.seqlens_stride = static_cast<int32_t>(c.seqlens.stride);
  lp.inv_freq = r.inv_freq;
  lp.inv_freq_stride = static_cast<int32_t>(r.inv_freq_stride);
  lp.sin_scale = r.sign * r.scale;  // pair_sincos's
  lp.cos_scale = r.scale;
  lp.capacity = static_cast<int32_t>(c.capacity);
  if (p.varlen) {
    lp.cu_seqlens = r.cu_seqlens.ptr;
    lp.cu_stride = static_cast<int32_t>(r.cu_seqlens.stride);
    if (r.cu_seqlens.is64) flags |= cuda::kALCu64;
  }
  if (r.positions.ptr) {
    lp.positions = r.positions.ptr;
    lp.pos_stride = static_cast<int32_t>(r.positions.stride);
    lp.pos_stride_b = static_cast<int32_t>(r.pos_stride_b);
    flags |= cuda::kALPos | (r.positions.is64 ? cuda::kALPos64 : 0);
  }
  if (c.paged) {
    lp.block_table = c.block_table.ptr;
    lp.bt_stride = static_cast<int32_t>(c.block_table.stride);
    lp.bt_stride_b = static_cast<int32_t>(c.bt_stride_b);
    lp.block_size = static_cast<int32_t>(c.block_size);
    lp.num_blocks = static_cast<int32_t>(c.num_blocks);
    flags |= cuda::kALPaged | (c.block_table.is64 ? cuda::kALBt64 : 0);
  }
  if (r.offsets.ptr) {
    lp.offsets = r.offsets.ptr;
    lp.off_stride = static_cast<int32_t>(r.offsets.stride);
    flags |= cuda::kALOff | (r.offsets.is64 ? cuda::kALOff64 : 0);
  }
  lp.offset = r.offset;
  lp.scale[0] = c.k_scale;
  lp.scale[1] = c.v_scale;
  lp.scale_stride[0] = static_cast<int32_t>(c.k_scale_stride);
  lp.scale_stride[1] = static_cast<int32_t>(c.v_scale_stride);
  lp.flags = flags;
  while ((1 << lp.cshift) < chunks) ++lp.cshift;
  // Rows per block: as many as 128 threads hold, halved while the grid leaves SMs idle;
  // packed sequences keep a whole warp (the ballot's lanes 0..B).
  const int sms = sm_count(device);
  int RB = 128 / chunks;
  while (RB > 1 && RB / 2 >= rows) RB /= 2;
  const int min_block = std::max(p.varlen ? 32 : 1, g_append_lean_min_block.load(std::memory_order_relaxed));
  while (RB > 1 && tokens * ceil_div(rows, int64_t(RB)) < sms && (RB / 2) * chunks >= min_block) RB /= 2;
  if (p.varlen && RB * chunks < 32) return false;
  lp.rows_per_block = RB;
  const dim3 grid(static_cast<unsigned>(ceil_div(rows, int64_t(RB))), static_cast<unsigned>(gy),
                  static_cast<unsigned>(gz));
  cuda::append_kv_lean_kernel<T, kInterleaved, kFp8, W><<<grid, RB * chunks, 0, stream>>>(lp);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  last_append_lean_bytes() = W;
  return true;
}

// Chunk bytes W: 8, or 4 (a thread's pairs halved: 2 for bf16 / fp16 neox). A Triton
// kernel of the same work took 4.26 us at 2 pairs a thread and 4.90 at 4 (run 3 of the
// eighth session of 2026-11-26), but the lean kernel's sin/cos of 4 pairs already
// interleave. Measured (H100, us in turns, W 8 -> 4): run 4, T = 16 paged(16) with q
// 5.31-5.41 -> 5.18-5.22, fp8 with q 5.34-5.41 -> 5.02-5.22, the bf16 rows within 0.15;
// batched with q T = 64 5.34-5.44 -> 5.50-5.63, T = 256 7.39-7.52 -> 8.64-8.80 (twice the
// threads); run 7 (the final code, auto against forced 8) T = 16 varlen 4.67 / 4.70, with q
// 4.86 / 4.86, batched 4.70 / 4.83, batched with q 4.88 / 5.02, paged with q 5.22 / 5.34, fp8
// with q 5.06 / 5.38. So 4 bytes while the doubled thread count stays <= 32K (T = 16 with q
// at Hq 32, Hk 8, D 128: 24,576 threads), never slower there; 8 above, and where 4 does not
// apply (a GPT-J fp32 chunk holds no whole pair; more than 128 chunks a row: the call
// takes W 8 then, not kernel 1).
// (Tried, run 6: instances without the index-tensor / block-table code for plain calls,
// 864 -> 536 SASS instructions at W 8: no gain in turns (-0.06 to +0.19 us against the
// general instance at W 8), though ncu had put the kernel's 0.67 us over a minimal Triton
// one on instruction fetch; the skipped code was not what the warps fetched. Not kept.)
// (Tried, ninth session of 2026-11-26, runs 1-3: kernel 1d, this work as straight-line
// code: the row's source and strides by a register index into the parameters (nvcc 13
// keeps a __grid_constant__ array indexed at run time in the constant bank: one LDC),
// 32-bit offsets, the index loads predicated instead of behind branches on the lane and
// the flags, the form a template argument. Every load went out by instruction ~150 with
// no branch before it, yet T = 16 was level with this kernel in turns (-0.2 to +0.2 us over
// two runs; ncu batched 3.74-3.81 vs 3.87-3.90) and T = 64 / 256 lost 0.3 (ncu T = 64 4.93
// vs 4.48, long-scoreboard stalls doubled). Not kept.)
// (Tried, nineteenth session of 2026-11-27, run 4: AppendLeanParams' fields laid out
// again, every field the top reads by ULDC in the first constant line and the stores'
// fields in a line the top reads by LDC, so no line was first read after the loads'
// wait on a plain call (SASS; layout 0 reads bytes 112-175 there; bench/sass_lines.py
// --trace). Bit-equal (92 lean cases), but in turns on the H100, us: T = 16 varlen 4.80
// -> 4.77, batched 4.80 -> 4.80, paged(16) 5.25 -> 5.47; the copy of the bytes with q
// 4.64. One cold constant line less on the chain, as the SASS counts it, bought nothing:
// not kept.)
// (Tried, twenty-sixth session of 2026-11-27, run 2: the kernel's work after its loads run
// twice, first on stand-ins with the stores off while the loads were in flight, so that
// its code was fetched during the round trip (a pass-count loop; SASS: no read of a
// load's destination inside it). Bit-equal (every lean case), but in turns on the H100,
// us, without / with: T = 16 varlen 4.93, 4.83 / 4.96, 5.06; batched 4.74, 4.61 / 4.74,
// 4.64; paged with q 5.18, 5.25 / 5.38, 5.25: level or slower. The code after the loads
// is not where this kernel's time over the minimal one goes. Not kept.)
constexpr int64_t kAppendLeanNarrowThreads = 32 * 1024;
template <typename T, bool kInterleaved, bool kFp8>
bool launch_append_lean(const AppendParams& p, int device, cudaStream_t stream) {
  if constexpr (!kInterleaved || sizeof(T) == 2) {
    const int forced = g_append_lean_bytes.load(std::memory_order_relaxed);
    const int64_t threads4 = p.num_tokens * (2 * p.cache.Hk + p.Hq) * rot_chunks(p.rope, 4 / int(sizeof(T)));
    const bool narrow = forced ? forced == 4 : threads4 <= kAppendLeanNarrowThreads;
    if (narrow && launch_append_lean_w<T, kInterleaved, kFp8, 4>(p, device, stream)) return true;
  }
  return launch_append_lean_w<T, kInterleaved, kFp8, 8>(p, device, stream);
}

template <typename T, bool kInterleaved, bool kVec, bool kFp8>
void launch_append(const AppendParams& p, int device, cudaStream_t stream) {
  const int forced = g_append_shape.load(std::memory_order_relaxed);
  int shape = forced >= 0 && forced < 6 ? forced : 3;
  // Auto takes the bulk kernel from 2 tokens per SM up: at T = 16 (16 blocks of one token)
  // kernel 1 was level with it for bf16 (6.5 us) and ahead for fp8 (7.6 against 8.3), its
  // chain shorter by the mbarrier wait (run 5 of 2026-11-25). Below, the lean kernel 1c
  // where it applies, else kernel 1: T = 16 4.7 us against kernel 1's 6.9 (fp8 5.6 / 7.6;
  // in turns, since its raw index loads, 4.8 / 7.0 and fp8 5.1 / 7.8: run C of the seventh
  // session of 2026-11-26); forced at T = 8192 it loses (with q 96.4 us against the bulk kernel's 75.7: one 8-byte
  // chunk per thread keeps too few bytes in flight), run 1 of the night of 2026-11-25.
  if (forced < 0 && p.num_tokens < 2 * sm_count(device)) shape = 5;
  if constexpr (kVec) {
    if (shape == 5 && launch_append_lean<T, kInterleaved, kFp8>(p, device, stream)) {
      last_append_kernel() = 3;
      return;
    }
    if (shape >= 3 && shape <= 4 && append_bulk_ok(p, sizeof(T), device)) {
      last_append_kernel() = 2;
      return launch_append_bulk<T, kInterleaved, kFp8>(p, device, stream, shape == 3 ? 8 * 1024 : 16 * 1024);
    }
  }
  last_append_kernel() = 1;
  switch (shape) {
    case 0: return launch_append_shape<T, kInterleaved, kVec, kFp8, 4, 3>(p, device, stream);
    case 2: return launch_append_shape<T, kInterleaved, kVec, kFp8, 1, 6>(p, device, stream);
    default: return launch_append_shape<T, kInterleaved, kVec, kFp8, 2, 4>(p, device, stream);
  }
}

template <typename T>
void append_typed(const AppendParams& p, int device, cudaStream_t stream) {
  ROPE_BOOL_SWITCH(p.cache.fp8, kFp8, [&] {
    ROPE_BOOL_SWITCH(p.rope.interleaved, kInterleaved, [&] {
      ROPE_BOOL_SWITCH(append_vector_ok(p, sizeof(T)), kVec, [&] {
        launch_append<T, kInterleaved, kVec, kFp8>(p, device, stream);
      });
    });
  });
}

// ---------------------------------------------------------------------------- 2-5. decode
// Variant 2/3 (attention_variants.cuh): rows per CTA (template kRows), G * q_len rows are
// cut into groups of this many. Variant 5 (decode_mma.cuh) always takes 16 (the MMA's M).
constexpr int kRowChoices[] = {1, 4, 8};
// The smallest key range worth a split of its own: below it the split's fixed cost
// (Q load + rotation, the merge, a combine row) outweighs the parallelism gained.
// Variant 5: one 16-key tile per warp.
constexpr int64_t kMinKeysPerSplit = 128;
constexpr int64_t kMinKeysPerSplitMma = cuda::mma_decode::kWarps * cuda::mma_decode::kTileKeys;
// Variant 5 at short contexts (measured, H100 run 4 of issue 18, B = 1, Hk = 8): 8
// splits beat 1 and 7 at ctx 512 (14.3 us vs 18.8 / 15.7) and beat 1 and 28 at ctx
// 2048 (18.0 vs 44.3 / 19.6); at B = 8, ctx 512, 1 split (19.6) and 4 (the efficiency
// rule, 20.1) beat 8 (24.1). So while ~kShortCtas CTAs give splits of at most
// kShortSplitKeys keys (the measured range), aim at ~kShortCtas CTAs; else the
// efficiency rule. Either way splits are sized in whole 16-key tiles per warp (64
// keys), so the 4 warps of a CTA finish together (7 splits of 74 keys left one warp
// with 2 tiles and the others with 1).
constexpr int64_t kShortCtas = 64;
constexpr int64_t kShortSplitKeys = 256;
constexpr int kMaxSplits = 256;
constexpr int64_t kFp8Ctas = 128;
constexpr int64_t kFp8SplitKeys = 128;
// The cluster merge's limit of keys per split (cluster_merge_pays below).
constexpr int64_t kClusterSplitKeys = 512;
// Variant 5 after the lean issue path (runs 2-3 of the night of 2026-11-24, H100, Hq 32 /
// Hk 8 / D 128, contiguous): with the grid at >= 45% of the SMs (B = 8: 64 CTAs) and at
// most kNoSplitKeys keys, one split beat the efficiency rule's 4 + combine (ctx 512:
// 15.8 vs 17.3-19.6 us; ctx 2048: 37.9 vs 40.8; at ctx 8192 4 splits won, 107.9 vs 109.0):
// a split's fixed cost (its own Q prologue and merge, the combine) outweighs the SMs it
// adds. And up to 8 x kClusterShortKeys keys the cluster aims at ~kShortCtas CTAs, at
// least 4 splits (decode_plan; Hk 8 at B = 1: 8 splits, ctx 2048 13.5-13.7 us vs 16 splits
// 14.3-14.6, ctx 512 10.8 vs 11.8).
constexpr int64_t kNoSplitKeys = 2048;
// ... and at D = 64 and 128 a grid of 90-100% of the SMs (B = 16 at Hk 8: 128 CTAs) at any
// length (Hq 32, one query token, in turns, us; one split against the efficiency rule's 2
// (D 128) or 4 (D 64) + combine). More CTAs than SMs take the other rules (at D 128 past 2048
// keys the wave rule, kWaveEff): B = 20 (160 CTAs) ctx 16384 3 splits 457.66 against one
// split's 515.54; B = 24 534.88 against 573.14 (run 2 of the fifteenth). D 128 (runs 5-6 of the fourteenth session of 2026-11-26,
// run 1 of the fifteenth): B = 16 ctx 4096 103.38 against 105.60; 8192 189.63 against 192.14
// (the plain read 191.68); 16384 360.74 against 365.54; 32768 704.98 against 713.84;
// paged(16) ctx 4096 105.78 against 2 splits' 108.88, 8192 194.11 against 196.86. D 64 (run
// 1 of the fifteenth): ctx 4096 62.18 against 65.31; 8192 105.63 against 111.26. D 256 was
// not measured; more query rows take it as the 45% rule above does.
constexpr int64_t kClusterShortKeys = 256;
// ... and at D = 128 from there up to kShortRuleKeys keys, for grids of at most 16 CTAs per
// split (kLongerCtas): ~kShortCtas CTAs and at least kLongerSplits splits where one wave of the
// SMs holds them, through the combine kernel where
// a split is longer than the cluster takes (decode_plan). Measured with the splits in 4-tile
// chunks, Hq 32 Hk 8, in turns, us. B = 1 (runs 4-5 of the thirteenth session of
// 2026-11-26): ctx 4096 8 splits 16.16-16.22 against the old rule's 16 in a cluster 17.49;
// ctx 8192 24.64-24.90 against 26.11; ctx 16384 38.91 against 39.87 (the old rule's 32
// splits; the plain read 38.37); paged(16) ctx 8192 25.6 against 27.0. B = 2 (16 CTAs per
// split; run 1 of the fourteenth session): ctx 4096 8 in a cluster 24.43 (4: 24.56); ctx
// 8192 8 + combine 39.17 against the old plan's 16 + combine 39.87 (4: 39.02; 4 led 16 by
// 0.8-1 us in runs 4 and 7 of the thirteenth too); ctx 16384 8 62.5-62.6 against 16's 63.3
// (4: 63.95). B = 4 (32 CTAs per split) keeps its plan (ctx 8192 8 + combine 62.6, within
// 0.4 of the best). Run 2 (auto on 8 splits): ctx 8192 39.02 (16: 39.78), ctx 16384 62.61
// (16: 62.90). Not at D = 64: B = 1 ctx 8192 8 splits 19.2-19.3 against 16's 16.8-17.0
// (run 5 of the thirteenth); D = 256 was not measured.
constexpr int64_t kShortRuleKeys = 16384;
constexpr int64_t kLongerCtas = 16;
constexpr int64_t kLongerSplits = 8;
// Few CTAs per split (decode_plan): at most kFewCtas of them (a cluster's 16 splits then
// fill at most kShortCtas SMs) and kFewCtasKeys..kFewCtasMaxKeys keys (the measured range)
// take at least kFewCtasSplits splits (~kShortCtas CTAs in all where that is more),
// within one wave, merged by the combine kernel.
constexpr int64_t kFewCtas = kShortCtas / cuda::kMaxClusterSplits;
constexpr int64_t kFewCtasKeys = 8192;
constexpr int64_t kFewCtasMaxKeys = 32768;
constexpr int kFewCtasSplits = 32;
// fp8 caches take two kv heads per CTA (decode_kv_per_cta) from kPairKeys keys up, and
// from kPairShortKeys with at least kPairHeads (b, kv head) pairs (past it, since the
// sixteenth session, from 2 x kWaveMinPairCtas).
constexpr int64_t kPairKeys = 8192;
constexpr int64_t kPairShortKeys = 2048;
constexpr int64_t kPairHeads = 64;
// ... and at any length from kPairGridHeads (b, kv head) pairs up. Since the fifteenth
// session their split counts come from the wave rule below (past kPairShortKeys keys at D
// 128; at D 64 too since the sixteenth) and fp8_short_kv (at most that many keys) picks one kv head or two per CTA over
// large grids; what led there: one split of pairs at B 32 and 64 (runs 2 and 4 of the
// fourteenth session of 2026-11-26, Hq 32 Hk 8, in turns, us; pairs with one split against
// the plan before:
// pairs (one head below 2048 keys) with 4 splits + combine). D = 64: B = 64 ctx 512 22.66
// against 33.12, ctx 2048 63.87 against 69.14, ctx 8192 201.26 against 210.24; B = 32 ctx
// 2048 37.54 against 42.21. D = 128: B = 64 ctx 512 37.50 against
// 46.40 (one head, one split 43.39); ctx 2048 105.86 against 114.86 (run 1; the plain read
// 104.37), paged(16) 107.14 against 119.15; ctx 4096 192.94 against 202.03; ctx 8192
// 364.98 against 376.74 (97.9% of copy). B = 32 (128 CTAs): ctx 2048 63.46 against 68.74,
// ctx 8192 193.26 against 198.00. B = 16 (64 CTAs of pairs): one head per CTA with one split
// (128 CTAs) was level at ctx 2048 (40.21 against 40.78) and 2% ahead at 4096 (62.94
// against 64.29), pairs with one split 1% and 12% behind that (kFp8OneWaveKeys). With one
// head per CTA (the pairs not allowed: odd Hk, a head-major cache, the one-call step) the split
// count at up to kPairShortKeys keys stays the fp8 rule's (past them the wave rule, since the
// eighteenth session: kFp8FittedRows' note): at B = 64 ctx 2048 one head per CTA with one split
// took 123.60 against 4 splits' 116.26 (run 1).
constexpr int64_t kPairGridHeads = 256;
// Smaller pair grids (runs 1-2 of the fifteenth session of 2026-11-27, Hq 32 Hk 8 D 128, in
// turns, us; the plan before: at least 4 splits, >= kFp8Ctas CTAs): a pair CTA streams two
// heads' rows, so ~100-128 of them read at the plain read's pace, and more than one per SM
// leaves a tail (B = 6, 24 pair CTAs, ctx 8192: 5 splits 54.70 against 6's 61.65). Where
// the wave rule does not apply (B <= 2, <= kPairShortKeys keys; D 64 until the sixteenth
// session): at most kFp8Ctas CTAs, as many splits as that allows (D 64 measured at B = 16 only: ctx 8192 2 splits 65.89
// against 4's 68.90, level at 4096; at B 3-7 from 8192 keys it takes 10 / 8 / 6 / 5 / 4
// splits where the rule before took 12 / 8 / 8 / 7 / 6: run 9, ctx 16384, B 3 33.34 against
// 35.33, B 5 48.24 against 49.23, B 7 64.08 against 61.95). Rows that led to the wave rule: B =
// 24 (96 CTAs) ctx 4096 one split 86.72 against 4's 91.71, ctx 8192 150.62 against 2's
// 166.21; B = 12 (48) ctx 4096 2 splits 53.26 against 3's 60.27 and 4's 55.09; B = 16 (64) 2
// splits level with 4 at ctx 2048-4096 (41.25 / 40.88, 64.43 / 64.45), 0.3-0.6% ahead at 8192
// / 16384 (108.21 / 108.83, 195.02 / 196.19), one split level at 2048 (40.64) and 9-32%
// behind from 4096; B = 20 (80) ctx 4096 one split 75.73 against 2's 86.10 (the wave rule
// takes 3 there: 80 CTAs are < 70% of the SMs; run 7: 3 splits 77.30 against one's 76.43,
// at ctx 16384 245.46 against 261.28).
// One kv head per CTA at D = 128 where that grid is one wave of one CTA per SM on >= 90%
// of the SMs (B = 16 at Hk 8 on 132) up to kFp8OneWaveKeys keys: one split, and no pairs
// (decode_kv_per_cta). Same run, B = 16: ctx 2048 40.10 against pairs' 4 splits 41.04 (2:
// 41.25); ctx 4096 63.07 against 64.51 (the fourteenth session's run 2: 40.21 / 40.78,
// 62.94 / 64.29); at ctx 8192 one split of one head lost (113.79 against pairs' 108.21).
// And where that grid is one wave of all the CTA slots (3 per SM) on >= 90% of them: B = 48
// (384 CTAs on 396 slots) ctx 4096 one head, one split 154.0 us against pairs' 4 splits 157.6
// (Hq 32; run 7 of the fifteenth session: 154.0 / 157.4), 162.6 (Hq 64) and 163.5 (paged(16);
// run 3 of the sixteenth); at ctx 16384 pairs' 4 splits led (552.5 against 563.2, Hq 64).
// On 132 SMs at Hk 8 it takes B 45-49 (B 46 and 48 measured: run 4).
constexpr int64_t kFp8OneWaveKeys = 4096;
// The wave rule (wave_splits; 42 points each of bf16 and fp8 caches, ctx 1024 / 4096 / 16384,
// B 2-64, forced 1-32 splits, runs 5-6 of the fifteenth session of 2026-11-27,
// bench/decode_cold.py --sweep; the same times within 0.5% at two cache placements). A grid's
// time followed how evenly its CTAs load the SMs more than its split count: with more CTAs
// than SMs, grids of 144 / 160 / 192 / 288 / 320 CTAs (some SMs holding one more CTA than
// the rest, or a few in a last wave) took 7-15% longer than their neighbours, at every B;
// with at most one CTA per SM, ~60% of the SMs (bf16) or ~70% (fp8 kv-head pairs) read at
// the plain read's pace. So: the fewest splits whose grid has a wave efficiency of at least
// kWaveEff (wave_efficiency); fp8 pairs first take the most splits that keep one CTA per SM
// where those cover kWaveSatPair of the SMs (kWaveSatNarrow at D 64; splits of at least
// kPairFillKeys keys; rule_splits). Run 7 (auto on the rule, B 3-64
// at ctx 4096 / 16384, and B 7, 9, 14, 17, 28 and 40, which the rule was not fitted on):
// auto's loss to the fastest forced count, mean / worst, against the rules before (their
// counts' forced rows in the same run). bf16, fitted sizes 1.0% / 4.9% (before 3.8% /
// 11.8%: B 5 ctx 16384 142.2 -> 127.9 us, B 6 167.3 -> 156.0, B 10 259.6 -> 232.6, B 48 1107.5
// -> 1056.7; lost: B 4 and 12 at ctx 16384, 96 CTAs, 4.9% / 4.6% behind 128 / 576 CTAs, where
// the rules before were level with the best); not fitted 1.7% / 3.7% (before 4.2% / 11.0%:
// B 40 ctx 16384 978.8 -> 909.9). fp8 pairs, the wave rule alone: fitted 0.8% / 3.1% (the
// session's run-3 rule 2.0% / 11.1%: B 48 ctx 16384 604.8 -> 544.3, B 20 261.3 -> 245.5), not
// fitted 1.4% / 2.7% (5.8% / 22.6%: B 17 ctx 16384 256.8 -> 211.2, B 40 557.9 -> 466.5). The
// one-CTA-per-SM step, from the same forced rows: mean 0.8% against the wave rule's 0.9%,
// and B 8 keeps its 4 splits (the suites' rows) where the wave rule took 3.
constexpr double kWaveEff = 0.9;
constexpr double kWaveSat16 = 0.6;      // 16-bit caches; fp8 at short contexts (fp8_short_kv)
constexpr double kWaveSatPair = 0.7;    // fp8 kv-head pairs
constexpr int64_t kWaveMinCtas = 24;    // 16-bit: B >= 3 at Hk 8 (B <= 2: the short rules)
constexpr int64_t kWaveMinPairCtas = 12;  // fp8 pairs: B >= 3 at Hk 8
// D = 64 (sixteenth session of 2026-11-27, run 1, bench/decode_cold.py --sweep, Hq 32 Hk 8,
// ctx 4096 / 16384, B 2-64): a CTA streams 128-byte key rows (bf16; fp8 pairs), half a D
// 128 CTA's bytes in flight, and one per SM no longer reads at the DRAM's pace below ~all
// the SMs: bf16 B = 8 (64 CTAs) ctx 16384 one split 167.1 us against 2's 105.5 (128 CTAs),
// B = 10 (80) 168.7 against 134.6; fp8 pairs B = 24 (96) 210.7 against 4 splits' 162.1. The
// plans before (the efficiency rule; for pairs at most kFp8Ctas CTAs) were 4.3% (bf16) and
// 5.1% (fp8) behind the fastest forced count on average, up to 12.9% and 30%. Their times
// followed the per-SM balance, not the balance of the 3-4 CTA slots per SM the D 128 model
// also asks for: B = 12 (96 CTAs) ctx 16384, 4 splits (384 CTAs, 73% of the slots) 157.2 us,
// level with the fastest (16 splits, 156.3); so wave_efficiency takes one slot per SM there.
constexpr double kWaveSatNarrow = 0.9;
// The pairs' one-CTA-per-SM step takes splits of >= kPairFillKeys keys: B = 3 (12 pair CTAs)
// at ctx 4096 took 11 splits (132 CTAs of 384 keys), auto 22.86 / 24.66 / 23.31 us against 8
// splits' (512 keys) 21.73 / 22.91 / 22.58 (Hq 32 / Hq 64 / paged(16); runs 2-3 of the
// sixteenth session of 2026-11-27); ctx 3072 (Hq 32): 6 splits 19.25 / 19.63 (runs 1 / 2)
// against auto's 10 20.26 (run 2; 8: 18.64 / 18.99). Below 4096 keys it cuts the count with
// the length where the best stayed at 6-8 (run 6): D 64 B 3 ctx 3072 6 splits in clusters
// 15.33 against 8's 14.08; D 128 B 3 ctx 2560 5 splits 17.46 against 6's 16.69 (B 4 there:
// 5, the best). Since the seventeenth session the count has a floor (kPairFillMin below).
constexpr int64_t kPairFillKeys = 512;
// ... but not fewer than kPairFillMin (D 128) / kPairFillMin64 (D 64) splits where one CTA per
// SM allows that many (run 1 of the seventeenth session of 2026-11-27, pairs in turns, us, the
// 512-key count -> the floor's): D 128 B = 3 ctx 2560 5 splits in clusters 17.25 -> 6 16.54
// (8: 16.96), B = 4 5 19.20 -> 6 19.28; D 64 B = 3 ctx 2560 5 15.17 -> 8 13.34, ctx 3072 6
// 15.34 -> 8 13.92, B = 4 ctx 2560 5 15.22 -> 8 14.61, ctx 3072 6 15.60 -> 8 15.66. A D 64
// pair CTA streams half the bytes of a D 128 one, so it takes more of them (kWaveSatNarrow).
constexpr int64_t kPairFillMin = 6;
constexpr int64_t kPairFillMin64 = 8;
// fp8 with one kv head per CTA past kPairShortKeys keys, where pairs are not allowed (GQA 16,
// MQA, D 256, G x q_len > 8, odd Hk, head-major caches, the one-call step): the wave rule,
// the slots' balance included, saturating at 90% of the SMs (one head's fp8 key row is 128
// bytes at D 128, as a D 64 bf16 row). The fp8 rule (>= 4 splits, ~kFp8Ctas CTAs) was fitted at
// Hq 32 Hk 8 and took 4 splits of grids that fill the SMs alone (run 1 of the seventeenth
// session of 2026-11-27, bench/decode_cold.py --sweep, in turns, us, 4 splits -> the wave
// rule's count): GQA 16 (Hq 32 Hk 2) B = 64 ctx 4096 (128 CTAs) 81.50 -> one split 63.94, ctx
// 16384 242.18 (512 CTAs: 1.3 waves of the 396 slots) -> 219.54 (3 splits, one wave: 210.86),
// B = 32 ctx 4096 43.33 -> 2 splits 40.54; D 256 (Hq 16) B = 16 / 32 ctx 4096 114.48 / 211.06
// -> one split 107.31 / 195.36; MQA B = 64 ctx 4096 42.18 -> 2 splits 39.90; four query tokens
// (Hq 32 Hk 8) B = 16 ctx 4096 81.73 -> one split 65.63, B = 32 129.78 -> 110.62. Over 18
// points of GQA 16 / MQA / D 256 fitted offline, mean / worst loss to the fastest forced
// count 4.4% / 27.5% -> 0.6% / 4.1%; sat 0.6 (the 16-bit D 128 value) 3.7% / 17.9%.
constexpr double kWaveSatFp8One = 0.9;
// G 4 with one query token (CTAs of 4 rows) took the fp8 rule until the eighteenth session, where
// pairs are not allowed (head-major caches, the one-call step): its 4 splits of 128-256 CTAs
// left a partial wave of the slots (run 3 of the eighteenth session of 2026-11-27, `plan_survey.sh
// fp8hnd`, in turns, us, 4 splits -> the wave rule's count, head-major / step): B = 16 ctx 4096
// 73.76 / 76.14 -> one split 63.47 / 64.99, ctx 16384 232.90 / 234.90 -> 6 splits 198.37 /
// 205.06; B = 32 ctx 4096 115.47 / 122.06 -> one 107.49 / 109.81; B = 8 ctx 4096 41.20 / 42.74 ->
// 2 39.10 / 41.63. Over the 14 points of each (B 1-64, ctx 4096 / 16384), offline from the
// forced rows, mean / worst loss to the fastest forced count 3.7% / 17.5% (head-major) and
// 4.0% / 17.2% (step) -> 0.1% / 1.6% and 0.4% / 2.9%.
// The change also reaches one-head CTAs of 1-4 rows the survey did not time (G 1-2 or q_len 2-4
// head-major or in the step, odd Hk at G 4) and G 4 at B 5-7 and 17-63 but for B 24 and 48.
// The cluster fit and the few-CTA rule (clusters_fit, decode_plan's few8) apply past
// kFp8FittedRows query rows: with 4 (one head at Hq 32 Hk 8) the clusters that share SMs were
// level with the combine kernel or ahead (clusters_fit's note).
constexpr int kFp8FittedRows = 4;
// ... and a grid of at most one CTA per SM takes at least one split per kFp8OneSplitKeys keys
// (at most kFp8OneMinSplits): run 2 of the seventeenth session, ctx 16384, us, the wave rule
// alone -> the floor's count: GQA 16 B = 32 (64 CTAs) 2 splits 118.54 -> 4 116.37, B = 64
// (128) one split 219.12 -> 6 212.74 (3: 210.46); four query tokens B = 8 (64) 120.37 ->
// 115.70, B = 16 (128) 218.08 -> 211.82; MQA B = 64 (64) 115.60 -> 111.76; D 256 B = 16 (128)
// 367.76 -> 372.18 (the one loss). Past one CTA per SM one split led at 16384 keys (four query
// tokens B = 32, 256 CTAs: 381.57 against 4 splits' 420.45). Fitted on 26 points of GQA 16 / MQA /
// D 256 / four query tokens (offline: each count's time read off the surveys' forced rows,
// docs/h100_plan_sweep_fp8.txt): mean loss to the fastest forced count
// 0.1-0.8% per shape. D 64 with one kv head per CTA (64-byte rows) keeps the fp8 rule: the wave
// rule took 2 splits where 4-16 led by 18-52% (run 2, Hq 28 Hk 7).
constexpr int64_t kFp8OneSplitKeys = 4096;
constexpr int64_t kFp8OneMinSplits = 4;
// fp8 at short contexts (<= kPairShortKeys keys, D 128, where pairs are allowed): a grid of
// at least kWaveSat16 of the SMs in one kv head per CTA takes one split, with one kv head or
// two per CTA, whichever grid's wave_efficiency is higher (fp8_short_kv). Run 7, ctx 1024,
// us, the plan before (its forced row) -> auto: B 12 one head, 4 splits 23.44 -> 21.28 (one
// head), B 20 32.30 -> 27.39 (pairs), B 24 36.03 -> 31.30 (pairs), B 48 pairs, one split
// 53.62 -> 50.93 (one head); B 16, 32 and 64 kept their plans; B 10 (80 CTAs, at the
// threshold) takes one head with one split where it took 4 splits (run 5: 20.99 against
// 21.17; run 6 20.74 / 20.91 against 20.86 / 21.18). ctx 2048 was measured at B 12-48 (run 7,
// auto within 0.8% of the best forced row), not at B 10. The wave rules model CTA counts:
// they take other head counts, group sizes, query lengths and paged caches as they come
// (measured: Hq 32 Hk 8, one query token, contiguous; paged at B 16).

template <typename T, int D, int kRows, bool kFull>
void launch_decode_kernel(const DecodeParams& p, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = cuda::decode_smem_bytes<D, kRows>();
  static_assert(smem <= 48 * 1024, "decode: shared memory within the default 48 KB");
  cuda::decode_kernel<T, D, kRows, kFull><<<grid, cuda::kDecodeThreads, smem, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Calls f.template operator()<T, D, kRows, kFull>() for the variant 2/3 instance that
// serves (dtype, head dim, rows per CTA, variant): the one place that lists them.
template <typename F>
void visit_decode(at::ScalarType dtype, int D, int rows, bool full, F&& f) {
  ROPE_HALF_TYPES_SWITCH(dtype, T, [&] {
    ROPE_BOOL_SWITCH(full, kFull, [&] {
      ROPE_HEADDIM_SWITCH(D, kD, [&] {
        // Rows per CTA: one of kRowChoices (1, 4, 8).
        if (rows == 1) f.template operator()<T, kD, 1, kFull>();
        else if (rows == 4) f.template operator()<T, kD, 4, kFull>();
        else f.template operator()<T, kD, 8, kFull>();
      });
    });
  });
}

// Variant 5's instances live in one file per (dtype, cache dtype, head dim)
// (decode_mma_<dtype>[_fp8]_hd<D>.cu, compiled in parallel); f.template operator()<T, D,
// kFp8>() is called for the one that serves.
template <typename F>
void visit_decode_mma(at::ScalarType dtype, int D, bool fp8, F&& f) {
  ROPE_HALF_TYPES_SWITCH(dtype, T, [&] {
    ROPE_BOOL_SWITCH(fp8, kFp8, [&] { ROPE_HEADDIM_SWITCH(D, kD, [&] { f.template operator()<T, kD, kFp8>(); }); });
  });
}

// Resident CTAs per SM of a variant 2/3 instance on a device (asked once per pair: two
// different GPUs in one process get their own answers).
template <typename K>
int resident_ctas(K kernel, int threads, size_t smem, int device) {
  return cuda_launch::resident_ctas(reinterpret_cast<const void*>(kernel), threads, smem, device);
}

// The number of key splits (flash-decoding) for `ctas` CTAs per split, `slots` resident
// CTA slots (SMs x CTAs per SM), from shapes only. flash-attention's rule: no split when
// the grid already fills 80% of the slots; else the smallest count whose wave efficiency
// (busy fraction of the slots over the waves) is within 85% of the best count's, no split
// shorter than `min_keys` keys of the longest possible sequence. (Variant 2's first rule
// was "within 0.05 of the best" in absolute terms: at B = 1, ctx 512 every count idled
// > 90% of the GPU, so all were "within 0.05", and it took one split: 8 CTAs, 38 us.)
int choose_splits(int64_t ctas, double slots, int64_t max_keys, int64_t min_keys) {
  ctas = std::max<int64_t>(1, ctas);
  if (ctas >= 0.8 * slots) return 1;
  const int64_t hi = std::max<int64_t>(1, std::min<int64_t>(ceil_div(max_keys, min_keys), kMaxSplits));
  auto efficiency = [&](int64_t s) {
    const double waves = static_cast<double>(ctas * s) / slots;
    return waves / std::max(1.0, std::ceil(waves));
  };
  double best = 0;
  for (int64_t s = 1; s <= hi; ++s) best = std::max(best, efficiency(s));
  for (int64_t s = 1; s <= hi; ++s)
    if (efficiency(s) >= 0.85 * best) return static_cast<int>(s);
  return 1;
}

// Variant 4: merges the splits. With PDL (sm_90+) it is launched while the decode kernel
// still runs (that kernel triggers at its start) and waits for it on the device
// (griddepcontrol.wait): the launch gap leaves the critical path.
void launch_combine(const DecodeParams& p, at::ScalarType dtype, int device, cudaStream_t stream) {
  const int major = cuda_launch::device_attribute<cudaDevAttrComputeCapabilityMajor>(device);
  // The shape the op layer chose (DecodeParams::combine_*: the one last_decode_combine reports).
  TORCH_CHECK(p.combine_loads == 4 || p.combine_loads == 8 || p.combine_loads == 16,
              "rope_ext: internal: combine shape not set (", p.combine_loads, " loads)");
  int lw = 0;
  while ((1 << lw) < p.combine_warps) ++lw;
  const int rows_per_block = (cuda::kCombineThreads / 32) >> lw;
  const int64_t rows = p.B * p.q_len * p.Hq;
  ROPE_HALF_TYPES_SWITCH(dtype, T, [&] {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(ceil_div(rows, rows_per_block)));
    cfg.blockDim = dim3(cuda::kCombineThreads);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = major >= 9 ? 1 : 0;
    CombineParams c;
    c.o = p.o;
    c.lse = p.lse;
    c.ws_o = p.ws_o;
    c.ws_lse = p.ws_lse;
    c.B = p.B;
    c.q_len = p.q_len;
    c.Hq = p.Hq;
    c.num_splits = p.num_splits;
    c.D = p.rope.D;
    c.log2_warps = lw;
    // combine_shape's loads per warp: 4, 8 or 16; kH = 2 feature groups per lane at D 256.
    auto launch = [&](auto kh) {
      constexpr int kH = decltype(kh)::value;
      auto* k = p.combine_loads == 4   ? cuda::decode_combine_kernel<T, kH, 4>
                : p.combine_loads == 8 ? cuda::decode_combine_kernel<T, kH, 8>
                                       : cuda::decode_combine_kernel<T, kH, 16>;
      C10_CUDA_CHECK(cudaLaunchKernelEx(&cfg, k, c));
    };
    if (c.D > 128) launch(std::integral_constant<int, 2>{});
    else launch(std::integral_constant<int, 1>{});
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace

void append_kv_cuda(const AppendParams& p, at::ScalarType dtype, c10::Device device) {
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  if (dtype == at::kFloat) append_typed<float>(p, device.index(), stream);
  else if (dtype == at::kHalf) append_typed<c10::Half>(p, device.index(), stream);
  else append_typed<c10::BFloat16>(p, device.index(), stream);
}

int decode_rows_per_cta(int64_t rows, DecodeImpl impl) {
  if (impl == DecodeImpl::kHybrid) return cuda::mma_decode::kRows;
  for (int k : kRowChoices)
    if (rows <= k) return k;
  return kRowChoices[sizeof(kRowChoices) / sizeof(int) - 1];
}

namespace {
std::atomic<bool> g_cluster_merge{true};
std::atomic<int> g_kv_pair{0};  // set_decode_kv_pair: 0 auto, 1 never, 2 wherever allowed
std::atomic<int> g_combine_loads{0};  // set_decode_combine_loads: 0 auto, else 4, 8 or 16
std::atomic<int> g_split_chunk{-1};   // set_decode_split_chunk: -1 the rule, else forced

// CTAs per split: (b, kv head or pair of them, row group).
int64_t grid_ctas(const DecodeParams& p) {
  return std::max<int64_t>(1, p.B * (p.cache.Hk / p.kv_per_cta) * p.row_groups);
}

// Whether a pair instance serves this call (decode_mma_launch.cuh, has_pair): fp8 at D =
// 64 and 128, the two heads' rows side by side (the interleaved [.., slot, Hk, D] layout),
// one row group, and not the decode step in one launch (its new tile is built per kv head).
bool pair_allowed(const DecodeParams& p, DecodeImpl impl) {
  const KVCacheView& c = p.cache;
  const int64_t D = p.rope.D;
  return impl == DecodeImpl::kHybrid && c.fp8 && (D == 64 || D == 128) && c.Hk % 2 == 0 && c.k_stride[2] == D &&
         c.v_stride[2] == D && p.k_new == nullptr && 2 * p.G * p.q_len <= cuda::mma_decode::kRows;
}

// The wave rule's model of n equal CTAs on `sms` SMs holding up to `occ` each: within one
// CTA per SM, the share of the SMs that reads at the DRAM's pace (n / (sat x SMs), at most
// 1); past it, the per-SM balance (n / SMs over its ceiling) and, below two waves of `occ`
// per SM, that wave's balance too. With `resident` (fp8 one-head CTAs, 3 per SM) the slots'
// waves count from one wave of them to three: a grid that is all resident at once has no
// slot waves (four query tokens B = 32 ctx 4096, 256 CTAs: one split 110.88 us against 3
// splits' 120.90, run 2 of the seventeenth session of 2026-11-27); 2.6 waves of the 396 slots
// lost as 1.3 did (512 CTAs, 2 splits: four query tokens B = 64 ctx 16384 813.25 against 3 / 4
// splits' 786.14 / 766.29, run 3; head-major G 4 B = 64 ctx 4096 208.13 against 201.07 /
// 198.99, run 3 of the eighteenth session); 5.2 waves did not (4 splits of 512 CTAs, balance
// 0.86, led at 8192-16384 keys: head-major ctx 16384 730.24 against 3's 744.77, run 4). Where
// this form moved a count of the form before (slots' waves below two only), run 6 timed both
// (head-major G 4, us): 160 CTAs ctx 4096 / 16384 6 -> 7 splits 81.49 -> 78.38 / 262.02 ->
// 249.50, 320 3 -> 4 141.87 -> 138.80, 416 2 -> 3 178.94 -> 174.30, 832 1 -> 2 331.41 -> 323.65,
// 1024 384.48 -> 379.23; 352 3 -> 4 level at 4096 keys, 1.2% behind at 16384; 0-3.8% behind the
// best forced count at those grids. The fits before the seventeenth session keep the first form.
double wave_efficiency(int64_t n, int sms, int occ, double sat, bool resident = false) {
  if (n <= sms) return std::min(1.0, static_cast<double>(n) / (sat * sms));
  auto balance = [](double w) { return w / std::ceil(w); };
  double e = balance(static_cast<double>(n) / sms);
  const int64_t slots = int64_t(sms) * occ;
  if (resident ? n > slots && n < 3 * slots : n < 2 * slots) e = std::min(e, balance(static_cast<double>(n) / slots));
  return e;
}
// The fewest splits (lo..hi) whose grid reaches kWaveEff; else the most efficient.
int64_t wave_splits(int64_t ctas, int64_t hi, int sms, int occ, double sat, int64_t lo = 1, bool resident = false) {
  int64_t best = lo;
  double best_e = -1;
  for (int64_t s = lo; s <= hi; ++s) {
    const double e = wave_efficiency(ctas * s, sms, occ, sat, resident);
    if (e >= kWaveEff) return s;
    if (e > best_e) best_e = e, best = s;
  }
  return best;
}
// Resident CTAs per SM of variant 5's instance for this call with kv_per_cta heads per CTA.
int mma_occupancy(const DecodeParams& p, int kv_per_cta, at::ScalarType dtype, int dev) {
  int occ = 1;
  visit_decode_mma(dtype, p.rope.D, p.cache.fp8, [&]<typename T, int D, bool kFp8>() {
    occ = decode_mma_ctas_per_sm<T, D, kFp8>(p.G * kv_per_cta * p.q_len, kv_per_cta, dev);
  });
  return occ;
}
// kFp8OneWaveKeys: `ctas` CTAs of one kv head each are one wave of one per SM on >= 90% of
// the SMs, or one wave of every CTA slot on >= 90% of them, in a call that could pair its heads.
bool fp8_one_wave(const DecodeParams& p, int64_t ctas, int64_t max_keys, DecodeImpl impl, at::ScalarType dtype,
                  int dev) {
  if (!pair_allowed(p, impl) || p.rope.D != 128 || max_keys > kFp8OneWaveKeys) return false;
  const int64_t sms = sm_count(dev);
  const int64_t slots = sms * mma_occupancy(p, 1, dtype, dev);
  return (10 * ctas >= 9 * sms && ctas <= sms) || (10 * ctas >= 9 * slots && ctas <= slots);
}
// Whether the wave rule plans this fp8 call (rule_splits), past kPairShortKeys keys: kv-head
// pairs at D 64 / 128 from kWaveMinPairCtas CTAs, one kv head per CTA (kWaveSatFp8One) from
// kWaveMinCtas at D 128 and 256. decode_plan's cluster
// branch (as many splits as one CTA per SM allows) leaves the count to it, and the cluster
// merges where it pays (the end of decode_plan): B = 3 (12 pair CTAs) took 11 splits in
// clusters there, ctx 4096 22.94 us against 8 splits' 22.05 (through the combine kernel; 11:
// 22.50; run 4 of the sixteenth session of 2026-11-27).
bool fp8_wave_rule(const DecodeParams& p, int64_t ctas, int64_t max_keys) {
  if (!p.cache.fp8 || max_keys <= kPairShortKeys) return false;
  return p.kv_per_cta == 2 ? (p.rope.D == 128 || p.rope.D == 64) && ctas >= kWaveMinPairCtas
                           : (p.rope.D == 256 || p.rope.D == 128) && ctas >= kWaveMinCtas;
}
// kWaveSat16's short-context rule for fp8 caches: 1 or 2 kv heads per CTA with one split,
// or 0 where it does not apply.
int fp8_short_kv(const DecodeParams& p, int64_t max_keys, DecodeImpl impl, at::ScalarType dtype, int dev) {
  const int sms = sm_count(dev);
  const int64_t one = p.B * p.cache.Hk;  // one row group (pair_allowed)
  if (!pair_allowed(p, impl) || p.rope.D != 128 || max_keys > kPairShortKeys ||
      static_cast<double>(one) < kWaveSat16 * sms)
    return 0;
  const double e1 = wave_efficiency(one, sms, mma_occupancy(p, 1, dtype, dev), kWaveSat16);
  const double e2 = wave_efficiency(one / 2, sms, mma_occupancy(p, 2, dtype, dev), kWaveSat16);
  return e2 > e1 ? 2 : 1;
}

// The number of key splits, from shapes only (variant 5: the cluster merge's choice
// and the no-split case come first in decode_plan below).
int rule_splits(const DecodeParams& p, int64_t max_keys, int dev, at::ScalarType dtype, DecodeImpl impl) {
  int occ = 1;
  const int64_t ctas = grid_ctas(p);
  const int sms = sm_count(dev);
  if (impl == DecodeImpl::kHybrid) {
    occ = mma_occupancy(p, p.kv_per_cta, dtype, dev);
    const double slots = static_cast<double>(sms) * occ;
    const int64_t short_s = ceil_div(kShortCtas, ctas);
    int64_t s = ceil_div(max_keys, short_s) <= kShortSplitKeys
                    ? short_s : choose_splits(ctas, slots, max_keys, kMinKeysPerSplitMma);
    if (p.cache.fp8) {
      // fp8 caches (forced splits, bench/fp8_splits.py, H100 run 3 of issue 20, Hq 32 Hk 8
      // D 128): the fastest count was 4 at B = 8 (ctx 2048-32768) and B = 64 (ctx 8192:
      // 409 us vs 458 with the rule above's 1 split), 16 at B = 1 (ctx 2048, 8192: 22.2
      // us vs 36.0 with 43). Half the bytes per key make a split's fixed cost relatively
      // dearer but leave the wave tail the same, so: at least 4 splits, ~128 CTAs, and at
      // least kFp8SplitKeys keys per split. Pairs of kv heads: at most kFp8Ctas CTAs (the
      // note above kFp8OneWaveKeys). Past kPairShortKeys keys the wave rule below plans pairs
      // at D 64 / 128 and one head per CTA at D 128 / 256 (D 64 one head keeps this rule).
      s = p.kv_per_cta == 2 ? std::max<int64_t>(1, kFp8Ctas / ctas) : std::max<int64_t>(4, ceil_div(kFp8Ctas, ctas));
      s = std::min<int64_t>(s, std::max<int64_t>(1, max_keys / kFp8SplitKeys));
    }
    // The wave rule (kWaveEff) past kNoSplitKeys / kPairShortKeys keys: 16-bit caches at D 64
    // and 128 from kWaveMinCtas CTAs per split, fp8 kv-head pairs (D 64 / 128) from
    // kWaveMinPairCtas, fp8 with one kv head per CTA from kWaveMinCtas (fp8_wave_rule); D 64
    // CTAs (128-byte key rows) saturate at kWaveSatNarrow, fp8 one-head CTAs (D 128 / 256) at
    // kWaveSatFp8One.
    const bool wave16 =
        (p.rope.D == 128 || p.rope.D == 64) && !p.cache.fp8 && ctas >= kWaveMinCtas && max_keys > kNoSplitKeys;
    const bool wave8 = fp8_wave_rule(p, ctas, max_keys);
    const int64_t hi = std::min<int64_t>(kMaxSplits, std::max<int64_t>(1, max_keys / kFp8SplitKeys));
    // (D 64: the per-SM balance alone, kWaveSatNarrow's note.)
    const int wocc = p.rope.D == 64 ? 1 : occ;
    if (wave16) {
      s = wave_splits(ctas, hi, sms, wocc, p.rope.D == 64 ? kWaveSatNarrow : kWaveSat16);
    } else if (wave8 && p.kv_per_cta == 1) {
      const int64_t lo = ctas <= sms ? std::min<int64_t>(kFp8OneMinSplits, ceil_div(max_keys, kFp8OneSplitKeys)) : 1;
      s = wave_splits(ctas, hi, sms, occ, kWaveSatFp8One, lo, true);  // (hi >= 16 > lo past 2048 keys)
    } else if (wave8) {
      // Pairs: the most splits that keep one CTA per SM where those reach the saturation
      // share of the SMs (D 128, kWaveSatPair: B = 8 4 splits, 128 CTAs, 0.1-1.9% ahead of the
      // wave rule's 3; B = 4: 8 against its 6, 1.5-3%; B = 6: 5 against its 4, 3.4% behind), in
      // splits of at least kPairFillKeys keys but at least kPairFillMin (the rounding below can
      // take one fewer, e.g. 7 of 8 at D 64 at 2049-2240 keys); else the wave rule.
      const double sat = p.rope.D == 64 ? kWaveSatNarrow : kWaveSatPair;
      const int64_t fill = sms / ctas;
      const int64_t least = p.rope.D == 64 ? kPairFillMin64 : kPairFillMin;
      s = fill >= 1 && static_cast<double>(ctas * fill) >= sat * sms
              ? std::min({fill, hi, std::max<int64_t>(least, max_keys / kPairFillKeys)})
              : wave_splits(ctas, hi, sms, wocc, sat);
    }
    if (s <= 1) return 1;
    // Whole tiles per warp: t = the tiles per warp s splits would give (rounded down, at
    // least 1; up for pairs and the wave rules, which then take at most their count: a wave
    // count can drop by one, below kWaveEff, e.g. 68 one-head CTAs at 2560 keys 11 -> 10),
    // then the fewest splits with at most t.
    const int64_t tiles = kMinKeysPerSplitMma * s;
    const int64_t t = wave16 || wave8 || (p.cache.fp8 && p.kv_per_cta == 2) ? ceil_div(max_keys, tiles)
                                                                    : std::max<int64_t>(1, max_keys / tiles);
    return static_cast<int>(std::min<int64_t>(kMaxSplits, ceil_div(max_keys, kMinKeysPerSplitMma * t)));
  }
  visit_decode(dtype, p.rope.D, p.rows_per_group, impl == DecodeImpl::kFullFusion,
               [&]<typename T, int D, int kRows, bool kFull>() {
    occ = resident_ctas(cuda::decode_kernel<T, D, kRows, kFull>, cuda::kDecodeThreads,
                        cuda::decode_smem_bytes<D, kRows>(), dev);
  });
  const double slots = static_cast<double>(sms) * occ;
  return choose_splits(ctas, slots, max_keys, kMinKeysPerSplit);
}

// Of n resident clusters, how many an automatic plan counts on: over fp8 caches with more than
// kFp8FittedRows query rows per CTA (G x q_len x kv heads per CTA), those that fit at one CTA
// per SM (n / the SM's CTA slots). More clusters than that share SMs and cost more than the
// combine kernel (runs 1 and 5 of the seventeenth session of 2026-11-27, in turns, us, clusters
// -> the same count through the combine kernel; one head's fp8 CTA holds 3 slots, 7 clusters of
// 16 and 15 of 8 fit one per SM): GQA 16 (Hq 32 Hk 2) ctx 4096 B = 4, 8 clusters of 16: 18.03
// -> 14.83, B = 8, 16 of 8: 20.70 -> 18.91; four query tokens B = 1 (8 of 16) 18.53 -> 15.44, B
// = 2 (16 of 8) 21.44 -> 19.25; MQA B = 8 (8 of 16) 15.04 -> 14.18, B = 16 (16 of 8) 18.45 ->
// 17.95; kv-head pairs (8 rows at G 4) B = 2 ctx 8192, 8 clusters of 16: Hq 32 28.94 -> 26.30,
// Hq 64 31.36 -> 27.23. Where they fit the cluster led: GQA 16 B = 1 / 2 (2 / 4 of 16) 14.61 /
// 14.72 against 14.85 / 14.91; pairs at Hq 32 B = 1 ctx 8192 (4 of 16) 18.02 against 19.30.
// With at most kFp8FittedRows rows per CTA the shared SMs did not cost (one head at Hq 32 Hk 8,
// B = 1, 8 clusters of 16, run 2: ctx 2048 12.24 us against the combine's 12.32-12.85, ctx
// 4096 13.71 against 14.05-14.10; B = 2, 16 clusters of 8: 13.57 against 13.78), nor over
// 16-bit caches (bf16 B = 2, 16 clusters of 8, level with the combine kernel: 24.72 / 24.74 us,
// run 5 of the fifteenth session): those keep n.
int clusters_fit(const DecodeParams& p, int n, int dev, at::ScalarType dtype) {
  return p.cache.fp8 && p.G * p.q_len * p.kv_per_cta > kFp8FittedRows ? n / mma_occupancy(p, p.kv_per_cta, dtype, dev)
                                                                      : n;
}

// How many clusters of `s` CTAs of this call's variant 5 instance can be resident at once.
int mma_max_clusters(at::ScalarType dtype, int D, bool fp8, int64_t rows, int kv_per_cta, int s, int dev) {
  int n = 0;
  visit_decode_mma(dtype, D, fp8, [&]<typename T, int kD, bool kFp8>() {
    n = decode_mma_max_clusters<T, kD, kFp8>(rows, kv_per_cta, s, dev);
  });
  return n;
}
int max_clusters(const DecodeParams& p, int s, int dev, at::ScalarType dtype) {
  return mma_max_clusters(dtype, p.rope.D, p.cache.fp8, p.G * p.kv_per_cta * p.q_len, p.kv_per_cta, s, dev);
}

// Whether `s` splits may merge in a thread-block cluster. Measured (H100, runs 1 and 3 of
// the session of 2026-11-24 evening, Hq 32 / Hk 8 / D 128): at B = 1 (64-128 CTAs, one per
// SM) it beat the combine kernel by 1.6-3.2 us at ctx 512-8192; with two CTAs per SM (B =
// 8, 4 splits, 256 CTAs) it lost 25-35% (27.3 vs 20.2 us at ctx 512, 533 vs 393 paged at ctx
// 32768: ncu allows 30 active clusters of 8 for this kernel, fewer CTAs than a plain
// launch keeps resident), and with 2048 keys per split at B = 1 ctx 32768 it lost too
// (80.7 vs 68.8 for 32 splits + combine). one_wave (the automatic choices): every cluster
// of the grid resident at once. A cluster lives in one GPC; at D = 256 (one CTA per SM)
// fewer GPCs hold 16 free SMs than B = 1's 8 kv heads need, so clusters of 16 ran in two
// waves: 51.5 us at ctx 8192 against 39.5 for clusters of 8 (run 4 of the fourth session
// of 2026-11-26). A forced split count keeps its cluster wherever one fits.
bool cluster_merge_pays(const DecodeParams& p, int s, int64_t max_keys, int dev, at::ScalarType dtype,
                        bool one_wave) {
  const int64_t ctas = grid_ctas(p);
  if (!g_cluster_merge.load(std::memory_order_relaxed) || s < 2 || s > cuda::kMaxClusterSplits ||
      ctas * s > sm_count(dev) || ceil_div(max_keys, s) > kClusterSplitKeys)
    return false;
  const int n = max_clusters(p, s, dev, dtype);
  return n > 0 && (!one_wave || clusters_fit(p, n, dev, dtype) >= ctas);
}
}  // namespace

void set_decode_cluster_merge(bool on) { g_cluster_merge.store(on); }
int decode_max_clusters(at::ScalarType dtype, int64_t D, bool fp8, int64_t rows, int64_t splits, int device) {
  TORCH_CHECK_VALUE(D == 64 || D == 128 || D == 256, "rope_ext: decode_max_clusters: D must be 64, 128 or 256");
  TORCH_CHECK_VALUE(device >= 0 && device < c10::cuda::device_count(), "rope_ext: decode_max_clusters: no device ",
                    device);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  return mma_max_clusters(dtype, static_cast<int>(D), fp8, rows, 1,
                          static_cast<int>(std::clamp<int64_t>(splits, 0, 1024)), device);
}
void set_decode_kv_pair(int mode) { g_kv_pair.store(mode == 1 || mode == 2 ? mode : 0); }
bool set_decode_split_chunk(int k) {
  if (k < -1 || k > 12) return false;
  g_split_chunk.store(k);
  return true;
}
// The splits take chunks of 4 tiles (64 keys) round-robin rather than one range each, so
// every CTA of the call reads within a window of splits x 64 keys that moves through the
// cache. H100, in turns, Hq 32 Hk 8 D 128 (bench/decode_cold.py --chunks, run 1 of the
// thirteenth session of 2026-11-26, bench/NOTES.md), one range -> 4-tile chunks: bf16 B = 1
// ctx 8192 26.56 -> 26.37 us, ctx 32768 63.50 -> 62.54; B = 8 ctx 8192 106.26 -> 105.54,
// ctx 32768 366.08 -> 364.48; fp8 B = 1 ctx 32768 41.09 -> 40.67, B = 8 ctx 8192 65.22 ->
// 64.42, ctx 32768 197.18 -> 194.00. Chunks of 16 tiles were slower at B = 1 ctx 32768
// (64.69), of 64 tiles far slower (74.14: 2048 tiles are 32 chunks of 64 over 31 splits,
// so one split reads twice the keys of the others).
int decode_split_chunk() {
  const int k = g_split_chunk.load(std::memory_order_relaxed);
  return k >= 0 ? k : 3;
}
bool set_decode_combine_loads(int loads) {
  if (loads != 0 && loads != 4 && loads != 8 && loads != 16) return false;
  g_combine_loads.store(loads);
  return true;
}

CombineShape combine_shape(int num_splits) {
  // Splits a warp loads at once: 4 up to 4 splits, 8 up to 64 (2-8 warps per row past 8),
  // then 16 (8 warps; past 128 splits, rounds). H100, in turns (run B of the sixth session
  // of 2026-11-26, us at 4 / 8 / 16 / 32 loads): the suite's B = 8 ctx 8192 (4 splits)
  // 106.3 / 106.5 / 106.8 / 107.2; B = 1 ctx 32768 (31 splits; 8 / 4 / 2 / 1 warps) 63.7 /
  // 63.7 / 65.6 / 64.5; MQA B = 1 ctx 32768 (64 splits) - / 18.3 / 18.2 / 19.5. Fewer loads
  // per warp (no row loaded twice) and more warps were level or ahead; one warp of 32
  // loads (the form before the fifth session's) was never ahead and left the code.
  int loads = g_combine_loads.load(std::memory_order_relaxed);
  if (loads == 0) loads = num_splits <= 4 ? 4 : num_splits <= 64 ? 8 : 16;
  int warps = 1;
  while (warps < 8 && int64_t(loads) * warps < num_splits) warps *= 2;
  return {loads, warps};
}

int decode_kv_per_cta(const DecodeParams& p, int64_t max_keys, c10::Device device, at::ScalarType dtype,
                      DecodeImpl impl) {
  const KVCacheView& c = p.cache;
  const int mode = g_kv_pair.load(std::memory_order_relaxed);
  if (!pair_allowed(p, impl) || mode == 1) return 1;
  const c10::cuda::CUDAGuard guard(device);  // the occupancy queries read the current device
  if (mode == 0) {  // short contexts over many CTAs: kWaveSat16's rule
    if (const int kv = fp8_short_kv(p, max_keys, impl, dtype, device.index())) return kv;
  }
  // Auto: where it was measured faster (Hq 32, Hk 8, runs C and D of the fifth session of
  // 2026-11-26, us, single -> pair at their plans): B = 1 ctx 32768 46.1 -> 44.2, B = 8 ctx
  // 8192 69.2 -> 67.1, ctx 32768 210.3 -> 198.9 (90% of copy), B = 64 ctx 8192 400.4 ->
  // 381.0, B = 8 ctx 2048 28.3 -> 26.7; not at B = 1 ctx 2048 (12.2 -> 12.5). The 128-byte
  // rows of one fp8 head, 1 KB apart, were what held the interleaved cache ~5% under the
  // head-major one. D = 64 (64-byte rows of one head, run C of the sixth session, auto
  // splits): B = 1 ctx 32768 30.5 -> 26.5, B = 8 ctx 8192 43.3 -> 39.9, ctx 32768 120.7 ->
  // 111.8, B = 64 ctx 8192 224.0 -> 214.4; the same rule (short contexts not measured there).
  // Not where one kv head per CTA is one wave of one per SM or of every CTA slot
  // (kFp8OneWaveKeys; one row group: pair_allowed).
  // Past kPairShortKeys keys from the wave rule's kWaveMinPairCtas pair CTAs (B >= 3 at Hk 8;
  // run 1 of the sixteenth session of 2026-11-27, the fastest forced rows at B 3-7 against
  // one kv head per CTA with the fp8 rule's splits, us: D 128 ctx 4096 B 3 pairs 8 splits 21.90
  // against 23.04, B 7 37.41 against 38.32, ctx 6144 B 6 44.05 against 46.30; D 64 ctx 4096
  // B 3 16.35 against 17.42, B 4 18.72 against 19.82).
  const bool pays = (max_keys >= kPairKeys || (max_keys >= kPairShortKeys && p.B * c.Hk >= kPairHeads) ||
                     (max_keys > kPairShortKeys && p.B * c.Hk >= 2 * kWaveMinPairCtas) ||
                     p.B * c.Hk >= kPairGridHeads) &&
                    !fp8_one_wave(p, p.B * c.Hk, max_keys, impl, dtype, device.index());
  return mode == 2 || pays ? 2 : 1;
}
void set_append_shape(int shape) { g_append_shape.store(shape); }
void set_append_lean_min_block(int n) { g_append_lean_min_block.store(n < 0 ? 0 : n); }
bool set_append_lean_bytes(int w) {
  if (w != 0 && w != 4 && w != 8) return false;
  g_append_lean_bytes.store(w);
  return true;
}
int& last_append_lean_bytes() {
  static thread_local int w = 0;
  return w;
}
int& last_append_kernel() {
  static thread_local int kernel = 0;
  return kernel;
}

DecodePlan decode_plan(const DecodeParams& p, int64_t max_keys, int64_t forced_splits, c10::Device device,
                       at::ScalarType dtype, DecodeImpl impl) {
  const c10::cuda::CUDAGuard guard(device);  // the occupancy queries read the current device
  const int dev = device.index();
  const bool hybrid = impl == DecodeImpl::kHybrid;
  // D = 256 over 16-bit caches: automatic plans merge through the combine kernel (below).
  const bool combine_only = !p.cache.fp8 && p.rope.D >= 256;
  if (forced_splits > 0) {
    const int s = static_cast<int>(std::min<int64_t>(forced_splits, 1024));
    return {s, hybrid && cluster_merge_pays(p, s, max_keys, dev, dtype, false)};
  }
  if (hybrid) {
    // Few kv heads in the grid (B = 1): as many splits as one CTA per SM allows (<= 16, >=
    // 64 keys each), merged in their cluster, where that measured fastest (ctx 512: 8
    // splits 10.8 us vs 16 splits 11.8; ctx 2048: 8 splits 13.7 vs 16 14.3; ctx 8192: 16
    // splits 26.4 vs 32 + combine 27.3, before the short rule below reached 8192 keys at D =
    // 128 and took 8 splits + combine there). Paged caches need >= 4 of them: at B = 8 ctx 512
    // paged, 2 splits in a cluster took 21.1-21.2 us against the rule's 4 splits + combine
    // 20.2-20.4 (first kernel, runs 2 and 3 of the evening). A grid of >= 45% of the SMs
    // takes no split at short contexts (kNoSplitKeys; run 4 had "half", which 64 CTAs on
    // 132 SMs missed).
    const int64_t ctas = grid_ctas(p);
    const int sms = sm_count(dev);
    if (!p.cache.fp8 && 20 * ctas >= 9 * sms && max_keys <= kNoSplitKeys) return {1, false};
    if (!p.cache.fp8 && p.rope.D <= 128 && 10 * ctas >= 9 * sms && ctas <= sms) return {1, false};
    // fp8 at short contexts over many CTAs (fp8_short_kv, the heads per CTA it chose): one split.
    // (Heads per CTA forced otherwise, set_decode_kv_pair, fall to the rules below.)
    if (p.cache.fp8 && fp8_short_kv(p, max_keys, impl, dtype, dev) == p.kv_per_cta) return {1, false};
    // fp8, one kv head per CTA in one wave of one per SM or of every slot (kFp8OneWaveKeys): one split.
    if (p.cache.fp8 && p.kv_per_cta == 1 && fp8_one_wave(p, ctas, max_keys, impl, dtype, dev)) return {1, false};
    // Few CTAs per split at long contexts (16-bit caches; B * Hk * row groups <= 4, as B = 1
    // with GQA 16 or MQA): a cluster's 16 splits are <= 64 CTAs, so kShortCtas CTAs, at
    // least kFewCtasSplits splits, through the combine kernel, within one wave (Hq 32, Hk 2:
    // ctx 8192 32 + combine 15.8-16.6 us, 16 in a cluster 17.7-18.1, 64 + combine 17.0;
    // ctx 32768 26.8-27.6, 36.8, 27.6; Hq 8, Hk 1: ctx 8192 64 splits 13.8 us, 32 14.8, 128
    // 13.5; ctx 32768 18.7, 23.6, 18.5; runs 4-6 of the fourth session of 2026-11-26 and run
    // C of the fifth, the last with the combine kernel of one round trip). Longer contexts
    // were not measured: they keep the rules below.
    if (!p.cache.fp8 && ctas <= kFewCtas && max_keys >= kFewCtasKeys && max_keys <= kFewCtasMaxKeys &&
        ctas * kFewCtasSplits <= sms) {
      const int64_t few = std::min<int64_t>(std::max<int64_t>(kFewCtasSplits, kShortCtas / ctas), sms / ctas);
      return {static_cast<int>(few), false};
    }
    int sc = static_cast<int>(std::min<int64_t>({cuda::kMaxClusterSplits, sms / ctas,
                                                  ceil_div(max_keys, kMinKeysPerSplitMma)}));
    // Short contexts: ~kShortCtas CTAs in all, at least 4 splits (up to 8 x
    // kClusterShortKeys keys; at D = 128 up to kShortRuleKeys). Hk 8 at B = 1: 8 splits (64
    // CTAs); Hk 2 at B = 8 ctx 2048: 4 splits (64 CTAs) 17.2-17.5 us against 8's 18.9-19.3;
    // Hk 2 at B = 1 ctx 2048: 16 (32 CTAs) 13.1-13.2 against 8's 13.9-14.1 (runs 4-5 of the
    // fourth session of 2026-11-26).
    // Past 2048 keys (`longer`) only where it was measured to pay (kShortRuleKeys): D = 128,
    // grids of <= kLongerCtas CTAs per split, at least kLongerSplits splits where one wave holds
    // them (B = 2 at Hk 8: 8).
    const bool longer = !p.cache.fp8 && p.rope.D == 128 && max_keys > 8 * kClusterShortKeys &&
                        max_keys <= kShortRuleKeys && ctas <= kLongerCtas && ctas * kLongerSplits <= sms;
    const bool short_ctx = (!p.cache.fp8 && max_keys <= 8 * kClusterShortKeys) || longer;
    if (short_ctx) sc = std::min<int64_t>(sc, std::max<int64_t>(longer ? kLongerSplits : 4, kShortCtas / ctas));
    const int short_sc = sc;
    // Clusters that cannot all be resident run in waves: halve them, to 4 at least
    // (cluster_merge_pays). Not over fp8 caches with one kv head per CTA past kPairShortKeys
    // keys, whose rule's count through the combine kernel led the halved clusters (D 256 B = 1
    // ctx 4096, 16 splits 18.90 us, 8 in clusters 21.23, run 1 of the seventeenth session;
    // shorter contexts were not measured).
    const bool halve = !(p.cache.fp8 && p.kv_per_cta == 1 && max_keys > kPairShortKeys);
    while (halve && sc > 4 && max_clusters(p, sc, dev, dtype) < ctas) sc = std::max(4, sc / 2);
    // D = 256, 16-bit caches (one CTA per SM): the split count the cluster would take,
    // through the combine kernel, which was level with the cluster or ahead at every count
    // measured (Hq 16, Hk 8, B = 1, 8 splits: ctx 512 12.5-12.8 us vs 13.1-13.6, ctx 2048
    // 17.6-18.2 vs 18.6-19.1, ctx 8192 39.4-39.6 vs 39.1-39.5; runs 4-6 of the fourth session
    // of 2026-11-26). Where the cluster would not be taken (too long splits, not one wave,
    // no sm_90, set_decode_cluster_merge(false)) it falls to the efficiency rule, as before.
    // fp8 with more than kFp8FittedRows query rows per kv head and at most kFewCtas CTAs per
    // split (GQA 16 at B 1-2, MQA at B 1-4, kv-head pairs at G 8, B 1-2) past kPairShortKeys keys:
    // the fp8 rule's count (kFp8Ctas / CTAs, at most one split per kFp8SplitKeys keys: 32 at ctx
    // 4096) through the combine kernel led the cluster's 16 splits (runs 3-4
    // of the seventeenth session of 2026-11-27, us, ctx 4096 / 8192: GQA 16 B 1 13.18 / 14.19
    // against 14.40 / 17.98 in clusters, MQA B 1 12.29 / 12.86 against 13.18 / 16.32; pairs at Hq
    // 32 Hk 4 B 1 ctx 8192: 64 splits 16.00 against 16 in clusters 20.26). G 4 kept the cluster
    // (its best forced rows: pairs at B 1 ctx 8192 16 splits in clusters 18.08, fourteenth
    // session; one head ctx 4096 13.71 against 16 through the combine kernel 14.05, run 2).
    const bool few8 = p.cache.fp8 && p.G * p.q_len > kFp8FittedRows && ctas <= kFewCtas && max_keys > kPairShortKeys;
    if ((!p.cache.paged || sc >= 4) && !fp8_wave_rule(p, ctas, max_keys) && !few8 &&
        cluster_merge_pays(p, sc, max_keys, dev, dtype, true))
      return {sc, !combine_only};
    // The longer short contexts where the cluster does not take them (splits past its
    // kClusterSplitKeys keys; or no cluster at all: merge off, before sm_90, not resident):
    // the short rule's count through the combine kernel.
    if (longer) return {short_sc, false};
  }
  const int s = rule_splits(p, max_keys, dev, dtype, impl);
  return {s, hybrid && !combine_only && cluster_merge_pays(p, s, max_keys, dev, dtype, true)};
}

bool decode_cache_aligned(const KVCacheView& c, int64_t elem_size, std::string* why) {
  const int64_t V = 16 / elem_size;
  if (!aligned16(c.k) || !aligned16(c.v)) {
    if (why) *why = "a cache's data pointer is not 16-byte aligned";
    return false;
  }
  for (int d = 0; d < 3; ++d)
    if (c.k_stride[d] % V || c.v_stride[d] % V) {
      if (why) *why = "a cache stride (dims 0-2) is not a multiple of " + std::to_string(V) + " elements (16 bytes)";
      return false;
    }
  return true;
}

void attention_decode_cuda(const DecodeParams& p, at::ScalarType dtype, c10::Device device, DecodeImpl impl) {
  TORCH_CHECK_VALUE(p.B <= 65535 && p.cache.Hk <= 65535, "rope_ext: attention_decode supports B <= 65535 and Hk <= 65535");
  // 32-bit key indices with headroom: the kernels round a split up (by num_splits - 1 <=
  // 1023, variant 5 then to whole 16-key tiles) and variant 2's key loop steps up to 64
  // keys past the last one; either would overflow an int just below 2^31.
  TORCH_CHECK_VALUE(p.cache.capacity <= (int64_t(1) << 31) - 4096, "rope_ext: attention_decode indexes keys in 32 bits: the "
                    "cache capacity (slots per sequence) must be at most 2^31 - 4096");
  TORCH_CHECK_VALUE(static_cast<int64_t>(p.num_splits) * p.row_groups < (int64_t(1) << 31),
                    "rope_ext: attention_decode: too many splits x row groups");
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  TORCH_CHECK(p.kv_per_cta >= 1 && p.cache.Hk % p.kv_per_cta == 0 && (p.kv_per_cta == 1 || p.k_new == nullptr),
              "rope_ext: internal: kv_per_cta");  // (the pair instances do not build the step's new tile)
  const dim3 grid(static_cast<unsigned>(p.num_splits * p.row_groups), static_cast<unsigned>(p.cache.Hk / p.kv_per_cta),
                  static_cast<unsigned>(p.B));
  if (impl == DecodeImpl::kHybrid) {
    visit_decode_mma(dtype, p.rope.D, p.cache.fp8, [&]<typename T, int D, bool kFp8>() {
      launch_decode_mma<T, D, kFp8>(p, grid, stream, device.index());
    });
  } else {
    visit_decode(dtype, p.rope.D, p.rows_per_group, impl == DecodeImpl::kFullFusion,
                 [&]<typename T, int D, int kRows, bool kFull>() { launch_decode_kernel<T, D, kRows, kFull>(p, grid, stream); });
  }
  if (p.num_splits > 1 && !p.cluster_merge) launch_combine(p, dtype, device.index(), stream);
}

}  // namespace rope_ext
