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
// plain RoPE reach the copy bandwidth (rope_variants.cuh): a block owns a short tile
// of consecutive rows (token-group-major) and exits. It fills a shared table of
// sin/cos for the tile's token groups and the fp32 weights (+ offset), one barrier,
// then each team of TPR threads takes whole rows: loads the row, reduces mean(x^2)
// with shuffles inside the team, normalises, rotates from the table, stores. A row
// is read once and written once; sin/cos are computed once per (token, pair), not
// per head.
//
// Work unit: V pairs of the rotary part (neox: V features of each half; GPT-J: 2V
// consecutive features), or 2V consecutive pass-through features of [R, D). Unit u
// covers pairs [uV, uV + V) in both conventions. Lane l of a team owns units
// l, l + TPR, ...: the same features for every row it handles, so the backward's
// dw partial sums stay in registers until the block reduces them in shared memory
// and writes one [D] row per block (the op layer sums the rows).
#pragma once
#include "../norm_rope_params.h"
#include "primitives.cuh"  // Vec, load_vec/store_vec, fill_sincos_table

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
};

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
#pragma unroll
  for (int j = 0; j < V; ++j) {
    int a, b;
    pair_slots<kInterleaved, V>(j, &a, &b);
    const float x0 = e[a], x1 = e[b], c = ct[i0 + j], sn = st[i0 + j];
    e[a] = rot_y0(x0, x1, c, sn);
    e[b] = rot_y1(x0, x1, c, sn);
  }
}

template <typename T, int V>
__device__ __forceinline__ void load_segment(const T* base, int64_t stride, int f, int D, float* dst) {
  if constexpr (V == 1) {
    dst[0] = f < D ? static_cast<float>(base[f * stride]) : 0.f;
  } else {
    const Vec<T, V> v = load_vec<Vec<T, V>>(base + f);
#pragma unroll
    for (int j = 0; j < V; ++j) dst[j] = static_cast<float>(v.v[j]);
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
    store_vec(base + f, v);
  }
}

// Sum over the TPR lanes of a team (teams are aligned groups of TPR lanes of a warp).
__device__ __forceinline__ float team_sum(float v, int tpr) {
  for (int o = tpr / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o, tpr);
  return v;
}

// kMaxU: units per thread kept in registers (2V floats each).
template <typename T, int V, int kMaxU, bool kInterleaved, bool kBwd>
__global__ void __launch_bounds__(kNormRopeThreads) norm_rope_kernel(const __grid_constant__ NormRopeParams np,
                                                                     const NormRopeShape sh) {
  constexpr int E = 2 * V;  // elements of a unit
  const RopeParams& p = np.rope;
  extern __shared__ float smem[];
  float* cos_tab = smem;
  float* sin_tab = smem + sh.table_stride;
  float* w_s = smem + 2 * sh.table_stride;  // [num_tensors][D]: weight + offset
  float* dw_s = w_s + p.num_tensors * p.D;  // backward: [num_tensors][D]
  const int half = p.R / 2, D = p.D, nt = p.num_tensors;
  const int tid = threadIdx.x, nthreads = blockDim.x;

  const int64_t rows_g = rows_per_group(p), NB = batches_per_group(p);
  const int64_t total = num_groups(p) * rows_g;
  const int64_t r_begin = static_cast<int64_t>(blockIdx.x) * sh.rows;
  const int64_t n = min(total, r_begin + sh.rows) - r_begin;
  const int64_t g_first = r_begin / rows_g;
  const int groups = static_cast<int>((r_begin + n - 1) / rows_g - g_first + 1);

  fill_sincos_table(p, g_first, groups, cos_tab, sin_tab);
  for (int i = tid; i < nt * D; i += nthreads) {
    const int t = i / D, d = i - t * D;
    const void* wp = t ? np.weight[1] : np.weight[0];
    const DType wd = t ? np.weight_dtype[1] : np.weight_dtype[0];
    w_s[i] = load_float(wp, wd, d * (t ? np.weight_stride[1] : np.weight_stride[0])) + np.weight_offset;
    if (kBwd) dw_s[i] = 0.f;
  }
  __syncthreads();

  const int tpr = sh.tpr, lane = tid % tpr, team = tid / tpr, nteams = nthreads / tpr;
  float acc[2][kMaxU][E];  // backward: dw partial sums per tensor (registers)
  if (kBwd) {
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int k = 0; k < kMaxU; ++k)
#pragma unroll
        for (int j = 0; j < E; ++j) acc[t][k][j] = 0.f;
  }

  // Every thread runs the same number of iterations: the team reductions are warp
  // shuffles, so idle teams take part with zeros.
  for (int64_t lr0 = 0; lr0 < n; lr0 += nteams) {
    const int64_t lr = lr0 + team;
    const bool active = lr < n;
    int t = 0;
    int64_t gl = 0;
    const T* xrow = nullptr;   // x (forward input, backward's saved x)
    const T* grow = nullptr;   // backward: dy
    T* orow = nullptr;
    int64_t xs3 = 1, gs3 = 1, os3 = 1;
    if (active) {
      const int64_t r = r_begin + lr;
      const int64_t g = r / rows_g;
      gl = g - g_first;
      int64_t b0, s;
      group_token(p, g, &b0, &s);
      const RowCoord c = row_coord(p, NB, b0, r - g * rows_g);
      t = c.t;
      // Selects, not p.t[c.t]: a runtime index into the parameters made older
      // compilers copy them to local memory (rope_variants.cuh, step 1 of variant 6).
      const TensorView& v = t ? p.t[1] : p.t[0];
      const T* in = static_cast<const T*>(v.in) + c.b * v.in_stride[0] + s * v.in_stride[1] + c.h * v.in_stride[2];
      orow = static_cast<T*>(v.out) + c.b * v.out_stride[0] + s * v.out_stride[1] + c.h * v.out_stride[2];
      os3 = v.out_stride[3];
      if (kBwd) {
        const int64_t* xs = t ? np.x_stride[1] : np.x_stride[0];
        xrow = static_cast<const T*>(t ? np.x[1] : np.x[0]) + c.b * xs[0] + s * xs[1] + c.h * xs[2];
        xs3 = xs[3];
        grow = in;
        gs3 = v.in_stride[3];
      } else {
        xrow = in;
        xs3 = v.in_stride[3];
      }
    }

    float e[kMaxU][E];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxU; ++k) {
      const int u = lane + k * tpr;
      if (active && u < sh.units) {
        int fa, fb;
        unit_segments(p, u, sh.rot_units, V, &fa, &fb);
        load_segment<T, V>(xrow, xs3, fa, D, e[k]);
        load_segment<T, V>(xrow, xs3, fb, D, e[k] + V);
#pragma unroll
        for (int j = 0; j < E; ++j) ss += e[k][j] * e[k][j];
      }
    }
    ss = team_sum(ss, tpr);
    const float rstd = 1.f / sqrtf(ss / D + np.eps);
    const float* w = w_s + t * D;
    const float* ct = cos_tab + gl * half;
    const float* st = sin_tab + gl * half;

    if (!kBwd) {
#pragma unroll
      for (int k = 0; k < kMaxU; ++k) {
        const int u = lane + k * tpr;
        if (!active || u >= sh.units) continue;
        int fa, fb;
        unit_segments(p, u, sh.rot_units, V, &fa, &fb);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          e[k][j] *= rstd * w[fa + j];
          e[k][V + j] *= rstd * (fb + j < D ? w[fb + j] : 0.f);
        }
        if (u < sh.rot_units) rotate_unit<kInterleaved, V>(e[k], u * V, ct, st);
        store_segment<T, V>(orow, os3, fa, D, e[k]);
        store_segment<T, V>(orow, os3, fb, D, e[k] + V);
      }
      continue;
    }

    // Backward: g = R(-theta) dy (the table holds -sin), gw = g * w, n = x * rstd;
    // dx = rstd * (gw - n * mean(gw * n)); dw += g * n.
    float gr[kMaxU][E];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxU; ++k) {
      const int u = lane + k * tpr;
      if (!active || u >= sh.units) continue;
      int fa, fb;
      unit_segments(p, u, sh.rot_units, V, &fa, &fb);
      load_segment<T, V>(grow, gs3, fa, D, gr[k]);
      load_segment<T, V>(grow, gs3, fb, D, gr[k] + V);
      if (u < sh.rot_units) rotate_unit<kInterleaved, V>(gr[k], u * V, ct, st);
#pragma unroll
      for (int j = 0; j < E; ++j) {
        const int f = j < V ? fa + j : fb + j - V;
        const float wf = f < D ? w[f] : 0.f;
        dot += gr[k][j] * wf * e[k][j];
      }
    }
    const float mean = team_sum(dot, tpr) * rstd / D;
#pragma unroll
    for (int k = 0; k < kMaxU; ++k) {
      const int u = lane + k * tpr;
      if (!active || u >= sh.units) continue;
      int fa, fb;
      unit_segments(p, u, sh.rot_units, V, &fa, &fb);
      float dx[E];
#pragma unroll
      for (int j = 0; j < E; ++j) {
        const int f = j < V ? fa + j : fb + j - V;
        const float wf = f < D ? w[f] : 0.f;
        const float nx = e[k][j] * rstd;
        dx[j] = rstd * (gr[k][j] * wf - nx * mean);
        if (t) acc[1][k][j] += gr[k][j] * nx; else acc[0][k][j] += gr[k][j] * nx;
      }
      store_segment<T, V>(orow, os3, fa, D, dx);
      store_segment<T, V>(orow, os3, fb, D, dx + V);
    }
  }

  if (kBwd) {
    // Block reduction of the dw partial sums: shared atomics, one row per block.
#pragma unroll
    for (int k = 0; k < kMaxU; ++k) {
      const int u = lane + k * tpr;
      if (u >= sh.units) continue;
      int fa, fb;
      unit_segments(p, u, sh.rot_units, V, &fa, &fb);
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

}  // namespace cuda
}  // namespace rope_ext
