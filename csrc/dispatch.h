// The variant names and the backend entry points (the op layer calls these).
#pragma once
#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "rope_params.h"

namespace rope_ext {

// Kernel variants, in the order of csrc/cuda/rope_variants.cuh. "auto" picks the fastest
// eligible one. rope_ext.IMPLS is read from kImplNames, so a variant added here is
// tested and benchmarked without editing the tests or the bench.
enum class Impl : int { kNaive = 0, kFp32 = 1, kFp32x4 = 2, kFp32x4Tile = 3, kFlat = 4, kAuto = 5 };
inline const std::vector<std::string>& impl_names() {
  static const std::vector<std::string> names = {"naive", "fp32", "fp32x4", "fp32x4_tile", "flat"};
  return names;
}

// Whether variants 3, 4 and 5 (16-byte vectors) can run on these tensors: unit feature
// stride, 16-byte aligned rows and chunks. Shared by the CUDA selector and the error
// message of an explicit impl="fp32x4" / "fp32x4_tile" / "flat".
bool vector_eligible(const RopeParams& p, int64_t elem_size, std::string* why);

void run_cpu(const RopeParams& p, Impl impl, at::ScalarType dtype);
#ifdef ROPE_EXT_WITH_CUDA
void run_cuda(const RopeParams& p, Impl impl, at::ScalarType dtype, c10::Device device);
// Tuning hook for bench/tune_tile.py: rows per thread of variant 4's tiles (0 = default).
void set_tile_rows_per_thread(int n);
// Tuning hook for bench/tune_flat.py: rows per thread of variant 5 (0 = default).
void set_flat_rows_per_thread(int n);
// Tests/bench: the largest tensor (bytes) auto gives variant 6, lean (-1 = its defaults).
void set_lean_max_bytes(int64_t n);
// Tests/bench: variant 6's access width, 16, 8 or 4 bytes (anything else: its defaults).
void set_lean_bytes(int64_t w);
// Tests/bench: variant 6's rows per thread, 1, 2, 4 or 8 (anything else: its rule).
void set_lean_rows_per_thread(int n);
// Tests/bench: the fewest threads a lean block keeps when its rows are halved to cover the SMs (0 = 128,
// the default; 1 = down to one row per block).
void set_lean_min_block(int n);
// Tests/bench: past from_bytes of x, lean declines a call whose block's rows x threads a row (a token's, times
// its tokens a block) are fewer than `threads`; a token under `threads` takes its rows in one thread and
// blocks of several tokens, other tokens' rows a thread stop where a block would fall under `threads` (0:
// none of these; -1: the defaults, 64 threads past 256 KB).
void set_lean_min_threads(int threads, int64_t from_bytes);
// Tests/bench: whether lean runs a one-head call whose positions the batch shares as one token of B rows
// (default on).
void set_lean_fold_one_head(bool on);
// Tests/bench: whether a block of variant 6 with several row slots computes its token's sin/cos once, into
// shared memory (default on; off: each lane its own, as a block of one row slot always does).
void set_lean_share(bool on);
// Tests/bench: whether variant 6 runs calls without position tensors in its instance without the position code
// (default on; off: the general instance, for such calls with a cos_sin_cache its cache instance).
void set_lean_plain(bool on);
// Tests/bench: whether those calls at one row a thread and one token a block (and such calls with a contiguous
// cos_sin_cache read by vector loads, every row s + offset in it) run rope_lean_plain1_kernel (default on; off:
// rope_lean_kernel's kPlain instances, its cache instance).
void set_lean_plain1(bool on);
// Tests/bench: variant 6's tokens a block (1, 2, 4 or 8, fewer where S or 128 threads do not allow it; the row
// slots a block make room first; else 0: launch_lean's rule, more than one only for blocks under 64 threads).
void set_lean_tokens_per_block(int n);
// Tests/bench: variant 6's row slots a block forced (any count whose threads fit 128; else 0: the rule). It
// overrides the room set_lean_tokens_per_block made: the tokens a block then shrink to fit 128 threads.
void set_lean_rows_per_block(int n);
// Tests: variant 6's launch by this thread's last CUDA rope call: its grid (x, y, z), rows per thread and access
// width in bytes, tokens a block (all 0 when that call did not launch it).
struct LeanLaunch {
  int64_t gx = 0, gy = 0, gz = 0;
  int rows_per_thread = 0, width = 0, tokens_per_block = 0;
};
LeanLaunch& last_lean_launch();
// Tests: whether this thread's last lean launch loaded x with the L2 hint (kHint).
bool& last_lean_hint();
// Bench/tests: x's loads with L2's evict_last hint, each line demoted after use, on lean
// calls past 32 MB whose lines all start at a chunk (default on; off: plain loads).
void set_lean_l2_hint(bool on);
#endif

}  // namespace rope_ext
