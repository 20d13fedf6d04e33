// CPU implementation: every variant name runs this one path (the variants are CUDA
// kernel strategies). Same helpers as the kernels (rope_math.h): sin/cos once per
// token group, reused across the batch and the heads of q and k.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <vector>

#include "../dispatch.h"
#include "../rope_math.h"

namespace rope_ext {
namespace {

template <typename T>
void rope_cpu_impl(const RopeParams& p) {
  const int half = p.R / 2;
  std::vector<float> freq(half);
  for (int i = 0; i < half; ++i) freq[i] = inv_freq_of(p, i);
  const int64_t NB = batches_per_group(p), rows = rows_per_group(p);
  const int64_t row_elems = std::max<int64_t>(1, rows * p.D);
  at::parallel_for(0, num_groups(p), std::max<int64_t>(1, 32768 / row_elems), [&](int64_t g0, int64_t g1) {
    std::vector<float> sn(half), cs(half);
    for (int64_t g = g0; g < g1; ++g) {
      int64_t b0, s;
      group_token(p, g, &b0, &s);
      int64_t pos[kMaxAxes];
      for (int a = 0; a < p.num_axes; ++a) pos[a] = position_of(p, b0, s, a);
      for (int i = 0; i < half; ++i) pair_sincos(p, pos[axis_of_pair(p, i)], i, freq[i], &sn[i], &cs[i]);
      for (int64_t r = 0; r < rows; ++r) {
        const RowOffsets o = row_offsets(p, NB, b0, s, r);
        const TensorView& v = p.t[o.t];
        for (int i = 0; i < half; ++i) rotate_pair<T>(p, v, o, i, sn[i], cs[i]);
        if (p.copy_tail)
          for (int d = p.R; d < p.D; ++d) copy_feature<T>(v, o, d);
      }
    }
  });
}

}  // namespace

void run_cpu(const RopeParams& p, Impl /*impl*/, at::ScalarType dtype) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "rope_ext_cpu",
                                  [&] { rope_cpu_impl<scalar_t>(p); });
}

}  // namespace rope_ext
