// The CUDA building blocks every kernel family uses (rope variants, fused norm + RoPE,
// the attention kernels): 16-byte vectors and their loads/stores, the chunk rotation,
// and the shared-memory frequency and sin/cos tables. ATen-free; the host+device
// arithmetic (positions, frequencies, accurate sin/cos) is rope_math.h's, the launch
// helpers are launch_utils.h's.
#pragma once
#include <cuda_runtime.h>

#include "../rope_math.h"

namespace rope_ext {
namespace cuda {

// ---------------------------------------------------------------- vectors
template <typename T, int N>
struct alignas(16) Vec {
  static constexpr int kN = N;
  T v[N];
};

// 16-byte accesses through uint4: a plain struct copy of Vec<Half/BFloat16, 8> was
// split by the compiler into eight 2-byte loads (PTX ld.global.u16; bf16 bshd ran at
// 41% of copy bandwidth on the H100), while uint4 always gives one ld.global.v4.
template <typename VecT, typename T>
__device__ __forceinline__ VecT load_vec(const T* p) {
  static_assert(sizeof(VecT) == 16, "16-byte vectors");
  VecT v;
  *reinterpret_cast<uint4*>(&v) = *reinterpret_cast<const uint4*>(p);
  return v;
}
template <typename VecT, typename T>
__device__ __forceinline__ void store_vec(T* p, const VecT& v) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&v);
}

// 16-, 8- or 4-byte accesses (W) of the lean kernels (rope variant 6, append_kv 1c):
// narrower chunks give a thread fewer pairs, so fewer sin/cos on its path and less code
// (the A/B of issue 19, bench/NOTES.md run 10; append_kv's, the eighth session of
// 2026-11-26).
template <int W> struct LeanWord;
template <> struct LeanWord<16> { using type = uint4; };
template <> struct LeanWord<8> { using type = uint2; };
template <> struct LeanWord<4> { using type = uint32_t; };

// A lean word loaded with L2's evict_last hint (the fraction-1.0 policy Triton emits for
// eviction_policy='evict_last'), and the 128-byte line such a load touched given back to
// the normal priority once its data is used (a thread whose address does not start a
// line does nothing: applypriority wants the line's address). The pair keeps a streamed
// input's lines ahead of other lines while they are in use and leaves none of them held
// in L2's persisting set-aside after the kernel (rope variant 6's kHint; the tiles' A/B
// of the twentieth session measured what a line left held costs the kernels after).
// (Each load makes its own policy, and the asm is not volatile, as in the measured form;
// one policy a thread, or volatile loads that the compiler may not move, need an A/B.)
template <typename Word>
__device__ __forceinline__ Word load_word_last(const void* p) {
  Word w;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(Word) == 16) {
    asm("{\n\t.reg .b64 pol;\n\tcreatepolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
        "ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], pol;\n\t}"
        : "=r"(w.x), "=r"(w.y), "=r"(w.z), "=r"(w.w) : "l"(p));
  } else if constexpr (sizeof(Word) == 8) {
    asm("{\n\t.reg .b64 pol;\n\tcreatepolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
        "ld.global.L2::cache_hint.v2.u32 {%0, %1}, [%2], pol;\n\t}"
        : "=r"(w.x), "=r"(w.y) : "l"(p));
  } else {
    asm("{\n\t.reg .b64 pol;\n\tcreatepolicy.fractional.L2::evict_last.b64 pol, 1.0;\n\t"
        "ld.global.L2::cache_hint.u32 %0, [%1], pol;\n\t}"
        : "=r"(w) : "l"(p));
  }
#else
  w = *static_cast<const Word*>(p);
#endif
  return w;
}
__device__ __forceinline__ void l2_demote_line(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if ((reinterpret_cast<uintptr_t>(p) & 127) == 0)
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(p) : "memory");
#endif
}

// Keeps a loaded word packed until this point: an empty asm that takes and rewrites it,
// so the compiler cannot unpack it (PRMT, shifts) right behind its load, where, with
// in-order issue, the unpack's wait for the load holds back every later instruction
// (the rope lean kernel's position loads went out one DRAM round trip late).
__device__ __forceinline__ void pin_word(uint32_t& w) { asm volatile("" : "+r"(w)); }
__device__ __forceinline__ void pin_word(uint2& w) { asm volatile("" : "+r"(w.x), "+r"(w.y)); }
__device__ __forceinline__ void pin_word(uint4& w) { asm volatile("" : "+r"(w.x), "+r"(w.y), "+r"(w.z), "+r"(w.w)); }

// An index tensor's entry (int32 or int64) as raw 32-bit words, converted where it is
// first used: a conversion next to its load (load_index's int32 sign extension, inside
// the branch on the dtype) waits for the load there, and with in-order issue everything
// behind it (variant 6's position loads, night of 2026-11-25/26; append_kv's lean kernel,
// whose two such loads in a row made two DRAM round trips: ncu source counters, run A of
// the seventh session of 2026-11-26).
struct RawIndex {
  uint32_t lo = 0, hi = 0;
};
__device__ __forceinline__ RawIndex load_raw_index(const void* ptr, int64_t off, bool is64) {
  RawIndex r;
  if (is64) {
    const uint2 v = static_cast<const uint2*>(ptr)[off];
    r.lo = v.x;
    r.hi = v.y;
  } else {
    r.lo = static_cast<const uint32_t*>(ptr)[off];
  }
  return r;
}
__device__ __forceinline__ int64_t raw_index(RawIndex r, bool is64) {
  return is64 ? static_cast<int64_t>((uint64_t(r.hi) << 32) | r.lo) : int64_t(static_cast<int32_t>(r.lo));
}

// Rotates one chunk in registers: neox pairs (a[j], b[j]) across the two halves, or
// GPT-J pairs (a[2j], a[2j+1]) inside a; sn/cs hold the chunk's P sines/cosines.
// fp32 math, one rounding at the end. Shared by variants 3-5 and the attention
// kernels (which also use chunks narrower than 16 bytes).
template <typename T, bool kInterleaved, typename VecT>
__device__ __forceinline__ void rotate_chunk(VecT& a, VecT& b, const float* sn, const float* cs) {
  using A = acc_t<T>;
  constexpr int V = VecT::kN;
  if (kInterleaved) {
#pragma unroll
    for (int j = 0; j < V / 2; ++j) {
      const A x0 = static_cast<A>(a.v[2 * j]), x1 = static_cast<A>(a.v[2 * j + 1]);
      a.v[2 * j] = static_cast<T>(rot_y0<A>(x0, x1, cs[j], sn[j]));
      a.v[2 * j + 1] = static_cast<T>(rot_y1<A>(x0, x1, cs[j], sn[j]));
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const A x0 = static_cast<A>(a.v[j]), x1 = static_cast<A>(b.v[j]);
      a.v[j] = static_cast<T>(rot_y0<A>(x0, x1, cs[j], sn[j]));
      b.v[j] = static_cast<T>(rot_y1<A>(x0, x1, cs[j], sn[j]));
    }
  }
}

// ---------------------------------------------------------------- cp.async (sm_80)
// One thread's 16-byte global -> shared copies, completing in the thread's commit
// groups (no registers per byte in flight). The decode kernel's K/V rings and the
// fused norm + RoPE's row ring (norm_rope_variants.cuh) stream through them.
// src_bytes 0 zero-fills (a key past the end, or a slot that does not exist: never
// read). Tried and reverted in the decode kernel (run 7 of 2026-11-25, day): the
// L2::256B prefetch hint on the fp8 tiles, so that the neighbouring kv head's 128-byte
// row of the interleaved layout came with the same DRAM access: slower everywhere (B = 8
// ctx 32768 209 -> 229 us, B = 64 ctx 32768 1485 -> 1560, head-major 1410 -> 1431): the
// extra halves cost DRAM bandwidth instead of saving page openings.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// The same wait for a run-time count of groups left in flight (0 to kCpAsyncMaxPending),
// and a compiler barrier: the caller's shared-memory reads of the landed group stay
// behind it.
constexpr int kCpAsyncMaxPending = 3;
__device__ __forceinline__ void cp_async_wait_upto(int pending) {
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;\n" ::: "memory");
  }
}

// ---------------------------------------------------------------- bulk copies (sm_90)
// The copy engine's 1-D bulk copies between global and shared memory (cp.async.bulk:
// 16-byte aligned addresses, sizes a multiple of 16), completing on an mbarrier (loads)
// or in bulk groups (stores). No registers per byte in flight: append_kv's bulk variant
// stages whole token rows this way. The caller guards them with __CUDA_ARCH__ >= 900.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // visible to the async proxy
}
// One arrival that also expects `bytes` of bulk loads to complete on the barrier.
__device__ __forceinline__ void mbar_arrive_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst_smem, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst_smem)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* src_smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_u32(src_smem)),
               "r"(bytes)
               : "memory");
}
// Shared-memory writes of this thread, made visible to its later bulk stores.
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// This thread's bulk stores committed, and waited for until they have read shared memory.
__device__ __forceinline__ void bulk_store_drain() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
#endif

// ---------------------------------------------------------------- tables
// Frequencies for the block in shared memory: read once per block (inv_freq_of: the
// params' table or the inv_freq tensor) instead of once per pair.
__device__ __forceinline__ void fill_freq_table(const RopeParams& p, float* table) {
  const int nthreads = blockDim.x * blockDim.y;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  for (int i = tid; i < p.R / 2; i += nthreads) table[i] = inv_freq_of(p, i);
  __syncthreads();
}

// P consecutive floats of a shared table, in 16- or 8-byte reads where P allows
// (the host keeps row starts aligned: the rotary half is a multiple of the chunk).
template <int P>
__device__ __forceinline__ void load_table(const float* src, float* dst) {
  if (P % 4 == 0) {
#pragma unroll
    for (int j = 0; j < P; j += 4) *reinterpret_cast<float4*>(dst + j) = *reinterpret_cast<const float4*>(src + j);
  } else if (P % 2 == 0) {
#pragma unroll
    for (int j = 0; j < P; j += 2) *reinterpret_cast<float2*>(dst + j) = *reinterpret_cast<const float2*>(src + j);
  } else {
#pragma unroll
    for (int j = 0; j < P; ++j) dst[j] = src[j];
  }
}

// The cos/sin table of `groups` consecutive token groups from g_first: row gl holds
// the R/2 cosines (sines) of group g_first + gl, already scaled and signed. Thread tid
// owns frequency i = tid % lanes (one frequency read per thread, not per entry) for
// groups tid / lanes, + gsteps, ... The caller synchronises. Shared by variant 4 and
// the fused kernels (norm + RoPE, KV append).
__device__ __forceinline__ void fill_sincos_table(const RopeParams& p, int64_t g_first, int groups, float* cos_tab,
                                                  float* sin_tab) {
  const int half = p.R / 2;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
  const int lanes = min(half, nthreads), gsteps = nthreads / lanes;
  if (tid >= lanes * gsteps) return;
  for (int i = tid % lanes; i < half; i += lanes) {
    const float f = inv_freq_of(p, i);
    for (int gl = tid / lanes; gl < groups; gl += gsteps) {
      int64_t b0, s;
      group_token(p, g_first + gl, &b0, &s);
      pair_sincos(p, pair_position(p, b0, s, i), i, f, &sin_tab[gl * half + i], &cos_tab[gl * half + i]);
    }
  }
}

}  // namespace cuda
}  // namespace rope_ext
