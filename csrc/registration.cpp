// The torch op registration: every schema of the rope_ext namespace (the one
// TORCH_LIBRARY block of the process; the implementations are registered next to
// their op code with TORCH_LIBRARY_IMPL), and the pybind11 module rope_ext._C.
#include <torch/extension.h>
#include <torch/library.h>
#ifdef ROPE_EXT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "attention.h"
#include "attention_options.h"
#include "dispatch.h"
#include "norm_rope.h"
#include "op_utils.h"
#include "rope_ops.h"
#include "rope_options.h"

// The rope options' schema text (ROPE_SCHEMA_OPTS, with its leading comma) comes from
// their one list, csrc/rope_options.h.
TORCH_LIBRARY(rope_ext, m) {
  m.def("rope(Tensor x" ROPE_SCHEMA_OPTS ") -> Tensor");
  m.def("rope_(Tensor(a!) x" ROPE_SCHEMA_OPTS ") -> ()");
  m.def("rope_qk(Tensor q, Tensor k" ROPE_SCHEMA_OPTS ") -> (Tensor, Tensor)");
  m.def("rope_qk_(Tensor(a!) q, Tensor(b!) k" ROPE_SCHEMA_OPTS ") -> ()");
  // Fused per-head RMSNorm + RoPE (norm_rope_ops.cpp): xs = [x] or [q, k], one weight each;
  // the backward returns the input grads, then the weight grads.
  m.def("norm_rope(Tensor[] xs, Tensor[] weights, float eps, float weight_offset" ROPE_SCHEMA_OPTS ") -> Tensor[]");
  m.def("norm_rope_backward(Tensor[] grads, Tensor[] xs, Tensor[] weights, float eps, float weight_offset"
        ROPE_SCHEMA_OPTS ") -> Tensor[]");
  // The attention family (csrc/attention_ops.cpp; rope_ext/attention.py is the API); the
  // option lists: csrc/attention_options.h.
  m.def("append_kv(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_seqlens, "
        "Tensor? cu_seqlens" ATTN_INDEX_SCHEMA ", Tensor(c!)? q" ATTN_ROTARY_SCHEMA ", bool rotate_k" ATTN_SCALE_SCHEMA
        ") -> ()");
  m.def("attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens" ATTN_INDEX_SCHEMA
        ATTN_ROTARY_SCHEMA ATTN_DECODE_SCHEMA ATTN_SCALE_SCHEMA ") -> (Tensor, Tensor)");
  // The decode step: append k, v (rotated K) at cache_seqlens, then attend (one launch on CUDA).
  m.def("attention_decode_append(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor cache_seqlens" ATTN_INDEX_SCHEMA ATTN_ROTARY_SCHEMA ATTN_DECODE_SCHEMA ATTN_SCALE_SCHEMA
        ") -> (Tensor, Tensor)");
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rope_ext: RoPE kernels (the ops live under torch.ops.rope_ext)";
  m.def("impl_names", &rope_ext::impl_names, "kernel variant names, in order");
  m.def("layouts", [] {
          // (name, dims, permutation to [B, S, H, D] or None, head dim), in code order.
          std::vector<std::tuple<std::string, std::string, std::optional<std::vector<int64_t>>, int64_t>> out;
          for (const auto& l : rope_ext::kLayouts)
            out.emplace_back(l.name, l.dims,
                             l.permuted ? std::optional<std::vector<int64_t>>(std::vector<int64_t>(l.perm, l.perm + 4))
                                        : std::nullopt,
                             l.head_dim);
          return out;
        }, "the rope layouts (rope_ops.h kLayouts), in code order");
  // The eager entries (no dispatcher) release the GIL while they run, as torch.ops calls do.
  m.def("norm_rope_direct", &rope_ext::norm_rope_direct, py::call_guard<py::gil_scoped_release>(),
        "eager fast path of norm_rope (no dispatcher)");
  m.def("norm_rope_backward_direct", &rope_ext::norm_rope_backward_direct, py::call_guard<py::gil_scoped_release>(),
        "eager fast path of norm_rope_backward (no dispatcher)");
  m.def("norm_rope_impl_names", &rope_ext::norm_rope_impl_names, "fused norm + rope variant names, in order");
  m.def("append_kv_direct", &rope_ext::append_kv_direct, py::call_guard<py::gil_scoped_release>(),
        "eager fast path of append_kv (no dispatcher)");
  m.def("attention_decode_direct", &rope_ext::attention_decode_direct, py::call_guard<py::gil_scoped_release>(),
        "eager fast path of attention_decode (no dispatcher)");
  m.def("attention_decode_append_direct", &rope_ext::attention_decode_append_direct,
        py::call_guard<py::gil_scoped_release>(), "eager fast path of attention_decode_append (no dispatcher)");
  m.def("rope_direct", &rope_ext::rope_direct, py::call_guard<py::gil_scoped_release>(),
        "eager fast path of the ops (no dispatcher): xs, layout code, inplace, then the op options");
  m.def("default_inv_freq", [](double base, int64_t R) {
          const auto& f = rope_ext::hf_default_freqs(base, R);
          return at::tensor(at::ArrayRef<float>(f), at::TensorOptions().dtype(at::kFloat));
        }, "the default frequency table the kernels use for `base` (HF's float32 formula)");
  m.def("set_poison", [](bool on) { rope_ext::poison_outputs() = on; },
        "tests: fill outputs with NaN before each kernel so unwritten elements show");
  m.def("last_decode_plan", [] {
          const auto& d = rope_ext::last_decode_plan();
          return std::make_tuple(d.num_splits, d.cluster_merge);
        }, "tests: (num_splits, cluster_merge) of this thread's last CUDA attention_decode");
  m.def("last_decode_split_chunk", [] { return rope_ext::last_decode_plan().split_chunk; },
        "tests: DecodeParams::split_chunk of this thread's last CUDA attention_decode (0: one key range per split)");
  m.def("last_decode_kv_per_cta", [] { return rope_ext::last_decode_plan().kv_per_cta; },
        "tests: kv heads per CTA of this thread's last CUDA attention_decode (variant 5)");
  m.def("last_decode_combine", [] {
          const auto& d = rope_ext::last_decode_plan();
          return std::make_tuple(d.combine_loads, d.combine_warps);
        }, "tests: (splits loaded per warp at once, warps per row) of the combine kernel in this thread's last CUDA "
           "attention_decode ((0, 0): no combine kernel)");
  m.def("set_value_checks", [](bool on) { rope_ext::device_value_checks() = on; },
        "check positions/offsets/cu_seqlens values of CUDA tensors too (synchronizes)");
#ifdef ROPE_EXT_WITH_CUDA
  m.def("set_tile_rows_per_thread", &rope_ext::set_tile_rows_per_thread,
        "tuning: rows per thread of variant 4's tiles (0 = default)");
  m.def("set_flat_rows_per_thread", &rope_ext::set_flat_rows_per_thread,
        "tuning: rows per thread of variant 5, flat (0 = default)");
  m.def("set_norm_rope_rows_per_team", &rope_ext::set_norm_rope_rows_per_team,
        "tests/bench: rows per team of the fused norm + rope kernels' tiles (0 = the rule, -1 = one resident wave of "
        "blocks)");
  m.def("set_norm_rope_stages",
        [](int stages) {
          // A pybind11 ValueError here: c10::ValueError from the CUDA dispatch file crashed
          // the process on the GPU box (test_ring_rule_lowers_depth_cuda, run 7 of the
          // eleventh session of 2026-11-26; decode_max_clusters below met the same).
          if (stages < 0 || stages > rope_ext::kNormRopeMaxStages)
            throw pybind11::value_error("rope_ext: set_norm_rope_stages takes 0 (the rule), 1 (no ring) or a ring "
                                        "depth up to " + std::to_string(rope_ext::kNormRopeMaxStages) + ", got " +
                                        std::to_string(stages));
          rope_ext::set_norm_rope_stages(stages);
        },
        "tests/bench: rows in flight per team of the fused norm + rope tile variant (0 = the rule, 1 = no ring, 2-4 = "
        "a shared-memory ring of that depth, lowered to what fits a block)");
  m.def("last_norm_rope_stages", &rope_ext::last_norm_rope_stages, pybind11::arg("backward"),
        "tests: the depth the last CUDA norm + rope launch of that direction ran with (1 = no ring; 0 = none yet)");
  m.def("set_lean_max_bytes", &rope_ext::set_lean_max_bytes,
        "tests/bench: largest tensor (bytes) auto runs with variant 6, lean (-1 = defaults, 0 = never)");
  m.def("set_lean_bytes", &rope_ext::set_lean_bytes,
        "tests/bench: variant 6's access width in bytes (16, 8 or 4; anything else = the defaults)");
  m.def("set_lean_rows_per_thread", &rope_ext::set_lean_rows_per_thread,
        "tests/bench: variant 6's rows per thread (1, 2, 4 or 8; anything else = its rule)");
  m.def("set_lean_l2_hint", &rope_ext::set_lean_l2_hint,
        "bench/tests: the lean kernel's x loads with L2's evict_last hint, each 128-byte line demoted to "
        "evict_normal after use, on calls past 32 MB whose lines all start at a chunk (default on; False: plain "
        "loads)");
  m.def("last_lean_hint", [] { return rope_ext::last_lean_hint(); },
        "tests: whether this thread's last lean launch loaded x with the L2 hint");
  m.def("set_lean_min_block", &rope_ext::set_lean_min_block,
        "tests/bench: the fewest threads a block of variant 6 keeps when its rows are halved to cover the SMs "
        "(0 = the default, 128; 1 = down to one row per block)");
  m.def("set_lean_min_threads", &rope_ext::set_lean_min_threads, pybind11::arg("threads"), pybind11::arg("from_bytes"),
        "tests/bench: past from_bytes of x, auto declines variant 6 (lean) for a call whose block's rows x threads "
        "a row (a token's, times its tokens a block) are fewer than `threads`, and runs the tiles; a token under "
        "`threads` takes its rows in one thread and blocks of several tokens, and other tokens' rows a thread stop "
        "where a block would fall under `threads` (0 threads: none of these; -1: the defaults, 64 threads past "
        "256 KB)");
  m.def("set_lean_fold_one_head", &rope_ext::set_lean_fold_one_head,
        "tests/bench: whether variant 6 (lean) runs a call whose tensors have one head each, and whose positions "
        "the batch shares, as one token of B rows (default on)");
  m.def("set_lean_share", &rope_ext::set_lean_share,
        "tests/bench: whether a block of variant 6 with several row slots computes its token's sin/cos once, into "
        "shared memory (default on; off: each lane its own, as a block of one row slot always does)");
  m.def("last_lean_launch", [] {
          const rope_ext::LeanLaunch& l = rope_ext::last_lean_launch();
          return std::make_tuple(l.gx, l.gy, l.gz, l.rows_per_thread, l.width, l.tokens_per_block);
        },
        "tests: the variant 6 (lean) launch of this thread's last CUDA rope call: (grid x, grid y, grid z, rows per "
        "thread, access bytes, tokens a block); zeros when that call did not launch lean");
  m.def("set_lean_tokens_per_block", &rope_ext::set_lean_tokens_per_block,
        "tests/bench: variant 6's (lean) tokens a block, 1, 2, 4 or 8 (the block's row slots make room first; "
        "fewer where S or 128 threads a block do not allow it); any other value: the rule (more than one only for "
        "blocks under 64 threads)");
  m.def("set_lean_rows_per_block", &rope_ext::set_lean_rows_per_block,
        "tests/bench: variant 6's (lean) row slots a block, any count whose threads fit 128 (not only powers of "
        "2; it overrides the room set_lean_tokens_per_block made, whose tokens then shrink to fit); 0 or a count "
        "that does not fit: the rule");
  m.def("set_lean_plain", &rope_ext::set_lean_plain,
        "tests/bench: whether variant 6 runs calls without position tensors in its instance without the "
        "position code (default on; off: the general instance, for such calls with a cos_sin_cache its cache "
        "instance)");
  m.def("set_lean_plain1", &rope_ext::set_lean_plain1,
        "tests/bench: whether variant 6 runs those calls, at one row a thread and one token a block, in its "
        "one-row kernel rope_lean_plain1_kernel, as those with a contiguous cos_sin_cache read by vector "
        "loads whose rows s + offset all lie in it (default on; off: rope_lean_kernel's kPlain instances, its "
        "cache instance)");
  m.def("set_decode_cluster_merge", &rope_ext::set_decode_cluster_merge,
        "tests/bench: whether attention_decode's splits may merge in a thread-block cluster (default on; "
        "off: the combine kernel)");
  m.def("set_decode_combine_loads",
        [](int loads) {
          // pybind11's ValueError, not a c10 one thrown from the CUDA dispatch file (see decode_max_clusters).
          if (!rope_ext::set_decode_combine_loads(loads))
            throw pybind11::value_error("rope_ext: set_decode_combine_loads: loads must be 0, 4, 8 or 16, got " +
                                        std::to_string(loads));
        },
        "tests/bench: attention_decode's combine kernel: splits each warp loads at once (4, 8 or 16); 0 = auto");
  m.def("set_decode_kv_pair", &rope_ext::set_decode_kv_pair,
        "tests/bench: attention_decode over fp8 caches (D 64 or 128, interleaved heads): 0 = auto, 1 = one kv head per "
        "CTA, 2 = two neighbouring kv heads per CTA wherever allowed");
  m.def("set_decode_split_chunk",
        [](int k) {
          if (!rope_ext::set_decode_split_chunk(k))
            throw pybind11::value_error("rope_ext: set_decode_split_chunk: k must be in -1..12, got " +
                                        std::to_string(k));
        },
        "tests/bench: attention_decode (variant 5) with several splits: -1 = the rule (default); 0 = each split "
        "one contiguous key range; k in 1..12 = chunks of 2^(k-1) 16-key tiles dealt to the splits round-robin");
  m.def("decode_max_clusters",
        [](const std::string& dtype, int64_t D, bool fp8, int64_t rows, int64_t splits, int device) {
          TORCH_CHECK_VALUE(dtype == "bfloat16" || dtype == "float16",
                            "rope_ext: decode_max_clusters: dtype must be 'bfloat16' or 'float16', got '", dtype, "'");
          // Checked here too, as a Python ValueError: on the H100 box the same check's
          // c10::ValueError from the CUDA dispatch file crashed the process (run A of the fifth
          // session of 2026-11-26; not reproduced without a GPU).
          if (device < 0 || device >= static_cast<int>(c10::cuda::device_count()))
            throw pybind11::value_error("rope_ext: decode_max_clusters: no device " + std::to_string(device));
          return rope_ext::decode_max_clusters(dtype == "float16" ? at::kHalf : at::kBFloat16, D, fp8, rows, splits,
                                               device);
        },
        "tests/bench: how many clusters of `splits` CTAs of attention_decode's tensor-core kernel (q dtype "
        "'bfloat16' or 'float16', head dim, fp8 cache, query rows per kv head) can be resident on the device at "
        "once (0: none)");
  m.def("set_append_lean_min_block", &rope_ext::set_append_lean_min_block,
        "tests/bench: the fewest threads a block of append_kv's lean kernel keeps when its rows are halved to "
        "cover the SMs (0 = the default: down to one row; packed sequences keep a warp)");
  m.def(
      "set_append_lean_bytes",
      [](int w) {
        if (!rope_ext::set_append_lean_bytes(w))
          throw pybind11::value_error("rope_ext: set_append_lean_bytes: w must be 0, 4 or 8, got " + std::to_string(w));
      },
      "tests/bench: the chunk bytes of append_kv's lean kernel, 4 or 8 (0 = the rule; 4 falls back to 8 for fp32 "
      "GPT-J, whose 4-byte chunk holds no whole pair, and for rows of more than 128 chunks at 4 bytes)");
  m.def("set_append_shape", &rope_ext::set_append_shape,
        "tests/bench: append_kv's kernel and shape: the register kernel with 0 (4 items per thread, 3 blocks per "
        "SM), 1 (2, 4) or 2 (1, 6); the bulk kernel (where it applies) with ~8 KB (3) or ~16 KB (4) of rows per "
        "block; the lean kernel (where it applies) 5; -1: auto (3 from 2 tokens per SM where it applies, else 5 "
        "where it applies, else 1)");
  m.def("last_append_kernel", [] { return rope_ext::last_append_kernel(); },
        "tests: the kernel of this thread's last CUDA append_kv: 1 register, 2 bulk, 3 lean (0: none yet)");
  m.def("last_append_lean_bytes", [] { return rope_ext::last_append_lean_bytes(); },
        "tests: the chunk bytes (4 or 8) of this thread's last lean append_kv launch (0: none yet)");
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
