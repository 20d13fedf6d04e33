// CUDA dispatch of the fused RMSNorm + RoPE (csrc/cuda/norm_rope_variants.cuh): picks
// the access width, sizes the tiles, launches on the current stream of x's device.
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>

#include "launch_utils.h"
#include "../norm_rope.h"
#include "norm_rope_variants.cuh"

namespace rope_ext {
namespace {

using cuda_launch::ceil_div;
using cuda_launch::sm_count;


// tests/bench: rows per team of a tile (0: the plan's rule; -1: one resident wave).
std::atomic<int> g_rows_per_team{0};
// tests/bench: rows in flight per team in the tile variant (0: the rule; 1: no ring
// (16-bit: the next row in registers; fp32: no prefetch); 2-4: the shared-memory ring
// of that depth, lowered to what fits a block's shared memory).
std::atomic<int> g_stages{0};
// tests: the depth the last launch of each direction ran with (process-wide: autograd
// runs CUDA backward nodes on its own worker thread).
std::atomic<int> g_last_stages[2] = {};

// Registers per thread: kMaxU units of 2V floats = 16 floats of x (and as many of dy
// and of each dw sum in the backward). 32 lanes x kMaxU units bound the row: D <= 512.
constexpr int max_units(int V) { return 8 / V; }

// The ring's depth where it fits (the plan's rule). H100, Qwen3 q [1, 8192, 32, 128] +
// k [.., 8, ..] (bench/norm_rope_tiles.py), us by depth 1 (no ring) / 2 / 3 / 4: at the
// backward's one-wave tiles (runs 1-4 of the eleventh session of 2026-11-26) backward bf16
// 115.8-116.2 / 110.3-110.5 / 111.0-111.4 / 111.5-111.8, at 512 tokens 22.9 / 21.2 / 22.4 /
// 23.2, fp32 203.6 / 204.2 / (3: past the budget, one block per SM) 208.8; at the forward's
// tiles of 4 rows per team (run 4 of the twelfth session) forward bf16 - / 65.4 / 64.3 /
// 66.6 (512 tokens: 10.8 / 11.4 / 11.8), fp32 (3 blocks per SM: depth 4 does not fit) - /
// 125.2 / 121.1. Small calls, whose tiles the SM count cuts below 4 rows per team (run 7;
// the rule takes depth 2 for any 16-bit forward tile of < 4 rows per team),
// depth 2 / 3: bf16 256 tokens 9.1 / 9.5, 512 10.8 / 11.3 (runs 4-5: 10.8 / 11.4, 10.5 /
// 11.3), from 1024 (4 rows per team) 14.8 / 14.5, 4096 37.3 / 36.9; fp32 (16 teams) depth 3
// at every size (256 tokens 10.7 / 10.5, 512 14.7 / 14.2, 4096 66.7 / 63.6). (At the old
// one-wave forward tiles the depths were within ~1 us: the ring took ncu's long-scoreboard
// stalls from 5.9 (bf16) and 12.3 (fp32) to 0.5-0.9 per issue.)
constexpr int rule_stages(bool bwd, bool short_16bit_tile) { return bwd || short_16bit_tile ? 2 : 3; }

// Shared memory a block may take with `min_blocks` blocks resident per SM (the device's
// per-SM capacity less the per-block reservation), within the per-block opt-in limit.
size_t smem_budget(int device, int min_blocks) {
  using cuda_launch::device_attribute;
  const size_t per_sm = device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(device);
  const size_t reserved = device_attribute<cudaDevAttrReservedSharedMemoryPerBlock>(device);
  const size_t optin = device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device);
  return std::min(per_sm / min_blocks - std::min(reserved, per_sm / min_blocks), optin);
}

struct Plan {
  int device;
  int V;
  cuda::NormRopeShape sh;
  size_t smem;
  int64_t blocks;
};

// The forward's rows per team of a tile (the tile rule in plan()).
constexpr int64_t kFwdRowsPerTeam = 4;

Plan plan(const NormRopeParams& np, NormRopeImpl impl, int64_t elem_size, int device) {
  const RopeParams& p = np.rope;
  Plan pl;
  pl.device = device;
  pl.V = impl == NormRopeImpl::kTile ? static_cast<int>(16 / elem_size) : 1;
  const int V = pl.V, kmax = max_units(V);
  cuda::NormRopeShape& sh = pl.sh;
  sh.rot_units = p.R / (2 * V);
  sh.units = sh.rot_units + (p.D - p.R) / (2 * V);
  int tpr = 1;
  while (tpr < 32 && tpr * kmax < sh.units) tpr *= 2;
  // A team for every unit when the row is short (more rows in flight, fewer idle lanes).
  while (tpr < 32 && tpr < sh.units) tpr *= 2;
  sh.tpr = tpr;
  const int64_t rows_g = rows_per_group(p);
  const int64_t total = num_groups(p) * rows_g;
  const int teams = cuda::kNormRopeThreads / tpr;
  sh.stages = 1;
  if (total == 0) {  // nothing to launch (every tensor empty: rows_g may be 0, a divisor below)
    sh.rows = 1;
    sh.table_stride = 0;
    pl.blocks = 0;
    pl.smem = 0;
    return pl;
  }
  // Tiles: kFwdRowsPerTeam rows per team forward, fewer when that would leave SMs idle,
  // never a token group of up to 2 rows per team cut. The backward: 2 rows per team the
  // same way, but at least one resident wave's share (its table, weights and dw reduction
  // then come once per SM slot). H100, Qwen3 q [1, 8192, 32, 128] + k [.., 8, ..]
  // (bench/norm_rope_tiles.py, tenth session of 2026-11-26), bf16 us by rows per team 1 /
  // 2 / 4 / 8 / one wave, before the ring: forward 96.7 / 78.7 / 74.3 / 76.2 / 73.0,
  // backward (2 / 4 / 8 / 16 / wave) 294.5 / 213.3 / 173.2 / 184.4 / 135.0. With the ring
  // (bench/tile_waves.py, runs 2-3 of the twelfth session) the forward by 2 / 4 / 6 / 8 /
  // 12 / 16 / wave: bf16 75.7 / 67.2 / 67.1 / 67.5 / 69.4 / 78.8 / 69.2, fp32 145.3 /
  // 120.9 / 121.5 / 122.4 / 125.2 / 128.0 / 130.9 (copy 60.3 / 115.3; at the depth rule of
  // then, 4 / fp32 3): one wave of long tiles (~160 KB each in bf16) spreads ~4 x 132
  // streams over the whole tensors and loses ~8% of HBM bandwidth (the plain RoPE tile
  // kernel too: 95.5% of copy at its 2 rows a thread, 87.6% at one wave); short tiles
  // launched in order keep the resident blocks on neighbouring rows, but below ~4 rows
  // per team each block's table, weights and barrier dominate. A table that fits in 32 KB.
  // The knob (set_norm_rope_rows_per_team, tests and bench) sets rows per team exactly,
  // past the SM rule, or -1: one wave (of the launch bound's blocks per SM). (A 16-bit
  // forward tile of < 4 rows per team, the knob's included, takes the ring depth of
  // small calls: rule_stages.)
  const int knob = g_rows_per_team.load();
  const int64_t sms = sm_count(device);
  const int half = p.R / 2;
  auto table_rows = [&](int64_t t) { return (t + rows_g - 2) / rows_g + 1; };
  auto size_tiles = [&](int min_blocks) {
    const int64_t wave = ceil_div(total, sms * min_blocks);
    int64_t tile;
    if (knob < 0) {
      tile = wave;
    } else if (knob > 0) {
      tile = int64_t{knob} * teams;
    } else {
      tile = std::min<int64_t>((np.backward ? 2 : kFwdRowsPerTeam) * teams, ceil_div(total, 2 * sms));
      tile = std::max<int64_t>(tile, std::min<int64_t>(rows_g, 2 * teams));
      if (np.backward) tile = std::max(tile, wave);
    }
    tile = std::max<int64_t>(tile, 1);
    while (tile > 1 && table_rows(tile) * half * 8 > 32 * 1024) tile = (tile + 1) / 2;
    tile = std::max<int64_t>(tile, ceil_div(total, INT32_MAX));
    sh.rows = tile;
    sh.table_stride = static_cast<int32_t>((table_rows(tile) * half + 3) / 4 * 4);
    pl.blocks = ceil_div(total, tile);
  };
  const int segs = cuda::norm_rope_ring_segs(np.backward, kmax);
  auto smem_at = [&](int stages) {
    return cuda::norm_rope_smem(sh.table_stride, p.num_tensors, p.D, np.backward, stages, segs,
                                cuda::kNormRopeThreads).bytes;
  };
  // Rows in flight per team (tile variant): the ring's depth where it fits beside the
  // table with the launch bound's blocks still resident (smem_budget), else no ring
  // (stages 1, its own launch bound: tiles re-sized for it where they depend on the
  // wave). The knob (set_norm_rope_stages) sets the depth, lowered to what fits one block.
  const int knob_s = g_stages.load();
  const bool ring = V > 1 && knob_s != 1;
  size_tiles(cuda::norm_rope_min_blocks(np.backward, ring, elem_size));
  if (ring) {
    const size_t budget = knob_s > 1 ? smem_budget(device, 1)
                                     : smem_budget(device, cuda::norm_rope_min_blocks(np.backward, true, elem_size));
    const bool short16 = elem_size == 2 && sh.rows < kFwdRowsPerTeam * teams;
    for (int s = knob_s > 1 ? knob_s : rule_stages(np.backward, short16); s >= 2 && sh.stages == 1; --s)
      if (smem_at(s) <= budget) sh.stages = s;
    if (sh.stages == 1) size_tiles(cuda::norm_rope_min_blocks(np.backward, false, elem_size));
  }
  pl.smem = smem_at(sh.stages);
  return pl;
}

template <typename T, int V, bool kInterleaved, bool kBwd>
void launch(const NormRopeParams& np, const Plan& pl, cudaStream_t stream) {
  auto kernel = pl.sh.stages > 1 ? cuda::norm_rope_kernel<T, V, max_units(V), kInterleaved, kBwd, V != 1>
                                 : cuda::norm_rope_kernel<T, V, max_units(V), kInterleaved, kBwd, false>;
  if (pl.smem > 48 * 1024) cuda_launch::allow_max_dynamic_smem(reinterpret_cast<const void*>(kernel), pl.device);
  kernel<<<static_cast<unsigned>(pl.blocks), cuda::kNormRopeThreads, pl.smem, stream>>>(np, pl.sh);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int V>
void launch_width(const NormRopeParams& np, const Plan& pl, cudaStream_t stream) {
  const bool il = np.rope.interleaved, bwd = np.backward;
  if (il) {
    bwd ? launch<T, V, true, true>(np, pl, stream) : launch<T, V, true, false>(np, pl, stream);
  } else {
    bwd ? launch<T, V, false, true>(np, pl, stream) : launch<T, V, false, false>(np, pl, stream);
  }
}

NormRopeImpl resolve(const NormRopeParams& np, NormRopeImpl impl, int64_t elem_size) {
  if (impl != NormRopeImpl::kAuto) return impl;
  return norm_rope_tile_eligible(np, elem_size, nullptr) ? NormRopeImpl::kTile : NormRopeImpl::kWarp;
}

}  // namespace

bool norm_rope_tile_eligible(const NormRopeParams& np, int64_t elem_size, std::string* why) {
  const RopeParams& p = np.rope;
  const int64_t V = 16 / elem_size;
  auto fail = [&](const std::string& m) {
    if (why) *why = m;
    return false;
  };
  if (p.interleaved ? p.R % (2 * V) : (p.R / 2) % V)
    return fail("rotary_dim " + std::to_string(p.R) + " does not split into 16-byte chunks");
  if ((p.D - p.R) % (2 * V))
    return fail("the pass-through features D - rotary_dim = " + std::to_string(p.D - p.R) +
                " do not split into pairs of 16-byte chunks");
  auto aligned = [&](const void* ptr, const int64_t* st) {
    if (st[3] != 1 || reinterpret_cast<uintptr_t>(ptr) % 16) return false;
    for (int d = 0; d < 3; ++d)
      if (st[d] % V) return false;
    return true;
  };
  for (int t = 0; t < p.num_tensors; ++t) {
    const TensorView& v = p.t[t];
    if (!aligned(v.in, v.in_stride) || !aligned(v.out, v.out_stride) || (np.backward && !aligned(np.x[t], np.x_stride[t])))
      return fail("a tensor's rows are not 16-byte aligned with unit feature stride");
  }
  return true;
}

void run_norm_rope_dw_sum_cuda(const NormRopeDwSum& a, c10::Device device) {
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  const dim3 grid(static_cast<unsigned>(ceil_div(a.D, int64_t{32})), static_cast<unsigned>(a.num_tensors));
  cuda::norm_rope_dw_sum_kernel<<<grid, dim3(32, cuda::kDwSumStripes), 0, stream>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void set_norm_rope_rows_per_team(int rows) { g_rows_per_team.store(rows); }
// (Checked in registration.cpp: a c10::ValueError thrown from this file crashed the
// process on the GPU box, as decode_max_clusters' did.)
void set_norm_rope_stages(int stages) { g_stages.store(std::clamp(stages, 0, kNormRopeMaxStages)); }
int last_norm_rope_stages(bool backward) { return g_last_stages[backward ? 1 : 0].load(); }

int64_t norm_rope_cuda_partial_rows(const NormRopeParams& np, NormRopeImpl impl, int64_t elem_size, int device) {
  return plan(np, resolve(np, impl, elem_size), elem_size, device).blocks;
}

void run_norm_rope_cuda(const NormRopeParams& np, NormRopeImpl impl, at::ScalarType dtype, c10::Device device) {
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_ext_norm_rope_cuda", [&] {
    if constexpr (std::is_same<scalar_t, double>::value) {
      TORCH_CHECK_TYPE(false, "rope_ext: the fused norm + rope runs float64 on the CPU only");
    } else {
      const NormRopeImpl chosen = resolve(np, impl, sizeof(scalar_t));
      const Plan pl = plan(np, chosen, sizeof(scalar_t), device.index());
      g_last_stages[np.backward ? 1 : 0].store(pl.blocks ? pl.sh.stages : 0);
      if (pl.blocks == 0) return;
      // The partial-sum buffer was sized by an earlier plan (norm_rope_cuda_partial_rows):
      // a knob changed in between would write past it or leave rows unwritten.
      TORCH_CHECK(!np.backward || pl.blocks == np.dweight_rows, "rope_ext: norm_rope backward planned ",
                  np.dweight_rows, " partial rows but launches ", pl.blocks, " blocks (a tuning knob changed mid-call?)");
      if (chosen == NormRopeImpl::kTile)
        launch_width<scalar_t, 16 / sizeof(scalar_t)>(np, pl, stream);
      else
        launch_width<scalar_t, 1>(np, pl, stream);
    }
  });
}

}  // namespace rope_ext
