// CPU implementation of the fused RMSNorm + RoPE (forward and backward), with the same
// helpers as the kernels (rope_math.h): sin/cos once per token group, reused by every
// row (heads of q and k, the batch when positions are shared).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "../norm_rope.h"
#include "../rope_math.h"

namespace rope_ext {
namespace {

template <typename T>
void norm_rope_cpu_impl(const NormRopeParams& np) {
  using A = acc_t<T>;  // double for float64 x (gradcheck), else float
  const RopeParams& p = np.rope;
  const int half = p.R / 2, D = p.D;
  std::vector<float> freq(half);
  for (int i = 0; i < half; ++i) freq[i] = inv_freq_of(p, i);
  std::vector<A> w[kMaxTensors];
  for (int t = 0; t < p.num_tensors; ++t) {
    w[t].resize(D);
    for (int d = 0; d < D; ++d) {
      const int64_t off = d * np.weight_stride[t];
      // float64 weights (with float64 x, for gradcheck) keep their precision.
      const A wd = np.weight_dtype[t] == DType::kFloat64 ? static_cast<A>(static_cast<const double*>(np.weight[t])[off])
                                                         : static_cast<A>(load_float(np.weight[t], np.weight_dtype[t], off));
      w[t][d] = wd + static_cast<A>(np.weight_offset);
    }
  }
  const int64_t NB = batches_per_group(p), rows = rows_per_group(p), groups = num_groups(p);
  const int64_t chunk = norm_rope_cpu_groups_per_chunk(np);
  const int64_t nchunks = (groups + chunk - 1) / chunk;
  at::parallel_for(0, nchunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> sn(half), cs(half);
    std::vector<A> x(D), g(D);
    // Rotates a row in place by the group's table (sn holds -sin in the backward).
    auto rotate = [&](std::vector<A>& r) {
      for (int i = 0; i < half; ++i) {
        int d0, d1;
        pair_dims(p, i, &d0, &d1);
        const A a = r[d0], b = r[d1];
        r[d0] = a * cs[i] - b * sn[i];
        r[d1] = b * cs[i] + a * sn[i];
      }
    };
    for (int64_t c = c0; c < c1; ++c) {
      A* dw[kMaxTensors] = {nullptr, nullptr};
      for (int t = 0; t < p.num_tensors; ++t)
        if (np.backward) {
          dw[t] = static_cast<A*>(np.dweight_partial[t]) + c * D;
          std::fill(dw[t], dw[t] + D, 0.f);
        }
      for (int64_t gi = c * chunk; gi < std::min(groups, (c + 1) * chunk); ++gi) {
        int64_t b0, s;
        group_token(p, gi, &b0, &s);
        int64_t pos[kMaxAxes];
        for (int a = 0; a < p.num_axes; ++a) pos[a] = position_of(p, b0, s, a);
        for (int i = 0; i < half; ++i) pair_sincos(p, pos[axis_of_pair(p, i)], i, freq[i], &sn[i], &cs[i]);
        for (int64_t r = 0; r < rows; ++r) {
          const RowCoord rc = row_coord(p, NB, b0, r);
          const TensorView& v = p.t[rc.t];
          const T* in = static_cast<const T*>(v.in) + rc.b * v.in_stride[0] + s * v.in_stride[1] + rc.h * v.in_stride[2];
          T* out = static_cast<T*>(v.out) + rc.b * v.out_stride[0] + s * v.out_stride[1] + rc.h * v.out_stride[2];
          const int64_t* xs = np.x_stride[rc.t];
          const T* xp = np.backward ? static_cast<const T*>(np.x[rc.t]) + rc.b * xs[0] + s * xs[1] + rc.h * xs[2] : in;
          const int64_t xd = np.backward ? xs[3] : v.in_stride[3];
          double ss = 0;
          for (int d = 0; d < D; ++d) {
            x[d] = static_cast<A>(xp[d * xd]);
            ss += static_cast<double>(x[d]) * x[d];
          }
          const A rstd = A(1) / std::sqrt(static_cast<A>(ss / D) + static_cast<A>(np.eps));
          const A* wt = w[rc.t].data();
          if (!np.backward) {
            for (int d = 0; d < D; ++d) g[d] = x[d] * rstd * wt[d];
            rotate(g);
            for (int d = 0; d < D; ++d) out[d * v.out_stride[3]] = static_cast<T>(g[d]);
            continue;
          }
          // Backward: g = R(-theta) dy (the table holds -sin), then the RMSNorm backward.
          for (int d = 0; d < D; ++d) g[d] = static_cast<A>(in[d * v.in_stride[3]]);
          rotate(g);
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += static_cast<double>(g[d] * wt[d]) * (x[d] * rstd);
          const A mean = static_cast<A>(dot / D);
          for (int d = 0; d < D; ++d) {
            const A n = x[d] * rstd;
            out[d * v.out_stride[3]] = static_cast<T>(rstd * (g[d] * wt[d] - n * mean));
            dw[rc.t][d] += g[d] * n;
          }
        }
      }
    }
  });
}

}  // namespace

int64_t norm_rope_cpu_groups_per_chunk(const NormRopeParams& np) {
  // Enough rows per chunk to amortise the table; chunks are the dw partial-sum rows.
  const int64_t rows = std::max<int64_t>(1, rows_per_group(np.rope));
  return std::max<int64_t>(1, 4096 / rows);
}

void run_norm_rope_cpu(const NormRopeParams& np, at::ScalarType dtype) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_ext_norm_rope_cpu",
                                  [&] { norm_rope_cpu_impl<scalar_t>(np); });
}

}  // namespace rope_ext
