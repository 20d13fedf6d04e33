// The contract between the op layer (rope_ops.cpp) and every implementation
// (csrc/cuda/rope_variants.cuh, csrc/cpu/rope_cpu.cpp).
//
// Every layout is reduced to a strided 4-D view [B, S, H, D] (bshd, sbhd and bhsd
// are permutations; thd is [1, T, H, D]); strides are in elements and 64-bit, so
// any view (a slice of a fused qkv projection, a transpose) is read in place.
// Up to two tensors (q and k, possibly with different H and strides) share the
// positions and the frequencies and are rotated in one launch.
#pragma once
#include <cstdint>

namespace rope_ext {

constexpr int kMaxTensors = 2;
constexpr int kMaxAxes = 4;  // position axes (M-RoPE: temporal, height, width; axial 2-D: row, column)

enum class FreqSource : int32_t {
  kBase = 0,         // HF's float32 frequencies of `base`, built on the host (base_freqs)
  kInvFreq = 1,      // fp32 tensor [R/2] (scaled variants, or kBase with R/2 > kParamFreqs)
  kCosSinCache = 2,  // [rows, R]: cos in columns [0, R/2), sin in [R/2, R)
};

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };  // kFloat64: CPU only

// An int32 or int64 vector in device (or host) memory.
struct IndexArray {
  const void* ptr = nullptr;
  int64_t stride = 0;
  bool is64 = true;
};

struct TensorView {
  const void* in = nullptr;
  void* out = nullptr;      // == in for the in-place ops
  int64_t H = 0;            // heads of this tensor
  int64_t in_stride[4] = {0, 0, 0, 0};   // b, s, h, d
  int64_t out_stride[4] = {0, 0, 0, 0};
};

struct RopeParams {
  TensorView t[kMaxTensors];
  int num_tensors = 1;

  int64_t B = 0, S = 0;     // batch, sequence (tokens = B * S)
  int32_t D = 0;            // head dim
  int32_t R = 0;            // rotary dim: even, <= D; features [R, D) pass through
  bool interleaved = false; // false: neox pairs (i, i + R/2); true: GPT-J pairs (2i, 2i+1)
  bool copy_tail = true;    // out of place: copy [R, D); in place: leave it untouched
  float sign = 1.f;         // +1 forward, -1 backward (rotation by -theta)
  float scale = 1.f;        // multiplies cos and sin (yarn/longrope attention factor)

  // Position of token (b, s) on axis a, first rule that applies:
  //   positions given:  positions[a * pos_stride_axis + b * pos_stride_b + s * pos.stride]
  //   cu_seqlens given: cp(s - start_n, len_n) + offsets[n]   (n: the sequence holding s; B == 1)
  //   otherwise:        cp(s, S) + (offsets given ? offsets[b] : offset)
  // cp() maps a local index to the global one under context parallelism (identity when
  // cp_size == 1): a sequence is cut into 2*cp_size chunks and rank r holds chunks r and
  // 2*cp_size-1-r. With cp_size > 1, cu_seqlens are the global (padded) cumulative
  // lengths, as TransformerEngine takes them: sequence n holds len_n = (cu[n+1]-cu[n]) /
  // cp_size local tokens from start_n = cu[n] / cp_size.
  IndexArray positions;
  int64_t pos_stride_b = 0;
  int64_t pos_stride_axis = 0;
  IndexArray offsets;
  int64_t offset = 0;
  IndexArray cu_seqlens;
  int64_t num_seqs = 0;     // cu_seqlens has num_seqs + 1 entries
  int32_t cp_size = 1, cp_rank = 0;

  // Multi-axis positions (M-RoPE, axial): pair i is rotated by the position on axis
  // axis_of_pair(i) (rope_math.h). Contiguous: axis a owns `section[a]` consecutive
  // pairs (Qwen2-VL's mrope_section, axial splits). Interleaved (Qwen3-VL): pair i
  // takes axis m = i % 3 when m > 0 and i < 3 * section[m], else axis 0.
  int32_t num_axes = 1;
  bool axes_interleaved = false;
  int32_t section[kMaxAxes] = {0, 0, 0, 0};

  FreqSource freq = FreqSource::kBase;
  const float* inv_freq = nullptr;  // [R/2], stride inv_freq_stride
  int64_t inv_freq_stride = 1;
  const void* cache = nullptr;      // [cache_rows, R]
  DType cache_dtype = DType::kFloat32;
  int64_t cache_rows = 0;
  int64_t cache_stride_row = 0, cache_stride_col = 0;

  // True when a token's position does not depend on b (shared positions [S], or
  // arange + scalar offset): the kernels then reuse sin/cos across the batch.
  bool pos_shared_b = false;

  // kBase with R/2 <= kParamFreqs (every head dim up to 256): HF's float32 table, built
  // on the host with the same ATen ops as transformers (rope_ops.cpp), carried in the
  // params. Larger tables go through inv_freq (a cached tensor of the same values).
  // Last, so that every scalar field above shares a few constant-cache lines (the
  // kernels read them in dependent steps: issue 11, bench/NOTES.md); 16-byte aligned
  // so a chunk's frequencies come in 8-byte constant loads.
  static constexpr int kParamFreqs = 128;
  alignas(16) float base_freqs[kParamFreqs];
};

}  // namespace rope_ext
