// What the rope op layer (rope_ops.cpp) offers the registration file and the other op
// families (fused norm + RoPE, attention): the frequency sources and the eager path.
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

#include "dispatch.h"
#include "rope_options.h"
#include "rope_params.h"

namespace rope_ext {

// The layouts of the rope API, in code order (rope_direct's `layout` argument): name, the
// caller's dims, the permutation to the kernels' [B, S, H, D] view (each its own inverse;
// none for bshd; thd [T, H, D] takes a leading 1 instead) and the head dim. rope_ext/_args.py
// builds LAYOUTS, its permutations and the codes from _C.layouts(): one list for both.
struct LayoutInfo {
  const char* name;
  const char* dims;
  bool permuted;
  int64_t perm[4];
  int64_t head_dim;
};
inline constexpr LayoutInfo kLayouts[] = {
    {"bshd", "[B, S, H, D]", false, {0, 1, 2, 3}, 2},
    {"sbhd", "[S, B, H, D]", true, {1, 0, 2, 3}, 2},
    {"bhsd", "[B, H, S, D]", true, {0, 2, 1, 3}, 1},
    {"thd", "[T, H, D]", false, {0, 1, 2, 3}, 1},
};
inline constexpr int64_t kNumLayouts = sizeof(kLayouts) / sizeof(kLayouts[0]);
inline constexpr int64_t kLayoutTHD = 3;


// Validates q/k (ins, 4-D [B, S, H, D] views) with their outputs (outs[i] may be ins[i]
// in place) and the options, and fills the params: positions, frequencies, strides.
// The other op families (fused norm + RoPE) build on it.
RopeParams make_params(const std::vector<at::Tensor>& ins, const std::vector<at::Tensor>& outs,
                       const Options& o, bool inplace, Impl* impl_out);

// Drops the tensors with 0 heads from p (q and k share B, S and D, so an empty tensor
// next to a non-empty one has no heads), so that the kernels and their launchers only
// see tensors with rows. kept[j]: the original index of the j-th tensor left. Returns
// how many are left (0 only when every tensor was empty: callers return before).
int drop_empty_tensors(RopeParams& p, int kept[kMaxTensors]);

// HF's float32 default frequencies of `base` (cached; bit-identical to transformers).
const std::vector<float>& hf_default_freqs(double base, int64_t R);

// Validates the frequency source (one of base, inv_freq, cos_sin_cache) against x and
// p.R, and fills the frequency fields of p. base_as_tensor: on CUDA, hand the kernels
// kBase frequencies as the cached device tensor rather than the params' table (the
// rope and norm+rope ops: measured a little faster; the attention kernels: slower,
// bench/NOTES.md issue 19, run 8).
void fill_frequencies(RopeParams& p, const at::Tensor& x, const std::optional<at::Tensor>& inv_freq,
                      const std::optional<at::Tensor>& cos_sin_cache, double base, bool base_as_tensor = false);

// The rotary options every family shares, validated once (rope_ops.cpp; make_params
// and the attention ops call these):
//  - fill_rotary: the head dim D, rotary_dim (R, default D), the pairing, the frequency
//    source (fill_frequencies) and attention_factor (p.scale);
//  - fill_offsets: per-sequence offsets [n] (int tensor) or the scalar offset, neither
//    with explicit positions (which are absolute); `per` names a sequence in the message;
//  - check_position_values (index values: op_utils.h says when they run): explicit
//    positions >= 0, offsets >= 0, and every position used below the rows of a
//    cos_sin_cache; last_index: per sequence (or one for all), the largest index that
//    takes a default position (offset + index), negative where none does.
void fill_rotary(RopeParams& p, const at::Tensor& x, int64_t D, int64_t rotary_dim, bool interleaved,
                 const std::optional<at::Tensor>& inv_freq, const std::optional<at::Tensor>& cos_sin_cache, double base,
                 double attention_factor, bool base_as_tensor = false);
void fill_offsets(RopeParams& p, bool has_positions, const std::optional<at::Tensor>& offsets, int64_t offset, int64_t n,
                  const char* per, const at::Tensor& x, const char* xname);
void check_position_values(const RopeParams& p, const std::optional<at::Tensor>& positions,
                           const std::optional<at::Tensor>& offsets, int64_t offset, const at::Tensor& last_index);

// x's [B, S, H, D] form (to_bshd) or, from it, layout `layout`'s, without the dispatcher
// (rope_ops.cpp: the eager entries' internal forms and fresh outputs only).
at::Tensor layout_alias(const at::Tensor& x, int64_t layout, bool to_bshd);

// rope_ext._C.rope_direct: the eager fast path of the rope ops (rope_ops.cpp).
std::vector<at::Tensor> rope_direct(const std::vector<at::Tensor>& xs, int64_t layout, bool inplace ROPE_PARAM_TYPES);

}  // namespace rope_ext
