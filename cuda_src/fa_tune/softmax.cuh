// Online softmax on a warpgroup's S accumulator fragment, in base 2 with the scale folded in.
//
// Fragment layout of a 64xN FP32 wgmma accumulator, per thread: N/2 floats, flat index
// e = i0 + 2*i1 + 4*i2 with i0 in {0,1}, i1 in {0,1}, i2 in [0, N/8):
//   row (within the warpgroup's 64) = 16*warp + 8*i1 + lane/4
//   col                             = 8*i2 + 2*(lane%4) + i0
// So each thread owns two rows (i1 = 0, 1); the four lanes of a quad share a row.
#pragma once

#include <cmath>
#include <cuda_bf16.h>
#include <type_traits>

#include "config.cuh"
#include "operands.cuh"

namespace fa_tune {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// True for every x (x >= -inf, or unordered), but computed from x where neither NVVM (the
// asm is opaque to it) nor ptxas (it does not fold the compare) can prove it: whatever it
// gates is ordered after x. k_release after_max takes it from the row max
// (OnlineSoftmax::update).
__device__ __forceinline__ bool after_value(float x) {
  uint32_t t;
  asm("{\n\t.reg .pred p;\n\tsetp.geu.f32 p, %1, 0fFF800000;\n\tselp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(t)
      : "f"(x));
  return t != 0;
}

struct NoAtMax {
  __device__ __forceinline__ void operator()(bool) const {}
};

// Set scores with key > the row's diagonal to -inf. diag0: the last key this thread's i1 = 0
// row sees (its query index plus the bottom-right offset, params.cuh); row_step: how much
// further the i1 = 1 row, 8 rows down, sees (8; pack_gqa: 8 / P positions); col0: key index of
// this tile's first column.
template <class Frag>
__device__ __forceinline__ void apply_causal_mask(Frag& s, int diag0, int row_step, int col0) {
  constexpr int N = Frag::kSize;
  const int lane_col = col0 + 2 * (threadIdx.x % 4);
  FA_UNROLL
  for (int e = 0; e < N; ++e) {
    const int i0 = e % 2, i1 = (e / 2) % 2, i2 = e / 4;
    if (lane_col + 8 * i2 + i0 > diag0 + row_step * i1 + Hooks::mask_slack) s(e) = -INFINITY;
  }
}

// Non-causal: set scores of keys at or past the key end (TMA fills them with zeros, or they
// are the next packed sequence's) to -inf. col0: key index of this tile's first column.
template <class Frag>
__device__ __forceinline__ void apply_key_end_mask(Frag& s, int col0, int key_end) {
  constexpr int N = Frag::kSize;
  const int lane_col = col0 + 2 * (threadIdx.x % 4);
  FA_UNROLL
  for (int e = 0; e < N; ++e) {
    const int i0 = e % 2, i2 = e / 4;
    if (lane_col + 8 * i2 + i0 >= key_end) s(e) = -INFINITY;
  }
}

// The mask of the problem class: causal (key > the row's diagonal) or the key end only.
template <bool kCausal, class Frag>
__device__ __forceinline__ void apply_mask(Frag& s, int diag0, int row_step, int col0,
                                           int key_end) {
  if constexpr (kCausal) {
    apply_causal_mask(s, diag0, row_step, col0);
  } else {
    apply_key_end_mask(s, col0, key_end);
  }
}

// Sliding window: set scores of keys left of the row's window (key < its diagonal minus
// `window`) to -inf. The window's edge tiles take this; the diagonal ones the class's mask
// (apply_mask), a tile holding both edges both.
template <class Frag>
__device__ __forceinline__ void apply_window_edge(Frag& s, int diag0, int row_step, int col0,
                                                  int window) {
  constexpr int N = Frag::kSize;
  const int lane_col = col0 + 2 * (threadIdx.x % 4);
  const int left0 = diag0 - window - Hooks::window_slack;  // the i1 = 0 row's first key
  FA_UNROLL
  for (int e = 0; e < N; ++e) {
    const int i0 = e % 2, i1 = (e / 2) % 2, i2 = e / 4;
    if (lane_col + 8 * i2 + i0 < left0 + row_step * i1) s(e) = -INFINITY;
  }
}

// Logit softcap (Gemma-2): s <- tanh(s x pre), pre = softmax scale / cap; the softmax's
// scale_log2 then carries cap x log2(e), so the exp2 sees cap x tanh(s x scale / cap).
// Exact: tanh as 1 - 2 / (exp2(2x log2 e) + 1), MUFU.EX2 and MUFU.RCP per score, FP32-exact
// (+-1 at the ends, an absolute error of ~1e-7 near 0). kApprox (knob softcap_tanh approx):
// tanh.approx, one MUFU op beside the softmax's exp2 instead of two, relative error up to
// 2^-11; near the cap, where it moves a logit most (cap x 2^-11), every saturated score moves
// alike, so the softmax barely sees it (docs/PERF.md step 60: the same output error on peaky
// inputs, D 128 and 256).
template <bool kApprox, class Frag>
__device__ __forceinline__ void apply_softcap(Frag& s, float pre) {
  constexpr int N = Frag::kSize;
  FA_UNROLL
  for (int e = 0; e < N; ++e) {
    const float x = s(e) * pre;
    float y;
    if constexpr (kApprox) {
      asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    } else {
      y = 1.f - 2.f / (exp2f(x * 2.8853900817779268f) + 1.f);  // exp2 of 2x log2(e)
    }
    s(e) = y;
  }
}

// kLazy: a row keeps its reference max until a tile raises it by more than kLazyThreshold
// (log2 units). Exact, because O and the row sum always share the reference: probabilities
// then reach at most 2^8, far inside FP32 and BF16 range, and most tiles skip the O rescale.
// kTree: the row max and row sum run as kChains independent chains, combined at the end, so
// the max that every exp2 waits on is ~N/8 dependent FMNMX long instead of N/2.
// kSumInPv: the row sums come out of the PV GEMM (sum_in_pv, wgmma.cuh), so the softmax
// keeps none; finalize takes them from there.
template <bool kLazy, bool kTree = false, bool kSumInPv = false>
struct OnlineSoftmax {
  static constexpr float kLazyThreshold = 8.f;
  static constexpr int kChains = kTree ? 4 : 1;
  float row_max[2];  // the reference max each row's probabilities are taken against
  float row_sum[2];  // this lane's partial sums; the quad reduction waits for finalize()

  // Fold a new score tile in: update the reference maxima, turn scores into probabilities in
  // place, and set the factor by which earlier O and sums must be multiplied. Returns whether
  // any row of this warp needs that (false lets the caller skip the O rescale).
  // With an at_max callback (k_release after_max) the rows go one after the other, and
  // at_max(gate) is called between row 0's exp2s and row 1's, with gate true but computed from
  // both maxima and row 0's last exp2: an arrive gated by it cannot issue before them, nor can
  // a wgmma wait after it in program order (ptxas keeps those two in order, not a wait and the
  // FMNMX), so row 0's exp2s also run while PV is in flight (mainloop.cuh). Without one, both
  // rows go in one pass: their max chains, then every exp2 (a row at a time spills with
  // tree_reduce at block_n 192).
  template <bool kFirst, class Frag, class AtMax = NoAtMax>
  __device__ __forceinline__ bool update(Frag& s, float scale_log2, float (&rescale)[2],
                                         AtMax&& at_max = {}) {
    constexpr int N = Frag::kSize;
    constexpr bool kRowByRow = !std::is_same_v<std::decay_t<AtMax>, NoAtMax>;
    if constexpr (Hooks::skip_softmax) {
      rescale[0] = rescale[1] = 1.f;
      row_max[0] = row_max[1] = 0.f;
      row_sum[0] = row_sum[1] = 1.f;
      at_max(true);
      return false;
    }
    // Chains take every kChains-th group of 4 values; they may differ in length by one
    // (block_n 80, 112, 144, 176 give N/4 = 10, 14, 18, 22 groups).
    float m_scaled[2];
    float sc[2][kChains];
    float last0 = 0.f;
    bool any = false, gate = true;
    FA_UNROLL
    for (int pass = 0; pass < (kRowByRow ? 2 : 1); ++pass) {
      // This pass's rows: [r0, r1).
      const int r0 = kRowByRow ? pass : 0, r1 = kRowByRow ? pass + 1 : 2;
      float mc[2][kChains];
      FA_UNROLL
      for (int r = r0; r < r1; ++r)
        FA_UNROLL
        for (int c = 0; c < kChains; ++c) mc[r][c] = kFirst ? -INFINITY : row_max[r];
      FA_UNROLL
      for (int e = 0; e < N; ++e) {
        const int r = (e / 2) % 2;
        if (r >= r0 && r < r1) mc[r][(e / 4) % kChains] = fmaxf(mc[r][(e / 4) % kChains], s(e));
      }
      FA_UNROLL
      for (int r = r0; r < r1; ++r) {
        float m = mc[r][0];
        FA_UNROLL
        for (int c = 1; c < kChains; ++c) m = fmaxf(m, mc[r][c]);
        m = quad_max(m);
        if constexpr (kRowByRow) gate = gate && after_value(m);
        bool move = true;
        if constexpr (kLazy && !kFirst) {
          // NaN (both -inf: every key masked so far) compares false: the row keeps -inf.
          move = (m - row_max[r]) * scale_log2 > kLazyThreshold;
          if (!move) m = row_max[r];
        }
        // A row with every key masked so far has max -inf; shifting by 0 keeps exp2 at 0
        // instead of NaN (-inf - -inf).
        m_scaled[r] = m == -INFINITY ? 0.f : m * scale_log2;
        rescale[r] = (kFirst || !move) ? 1.f : exp2f(row_max[r] * scale_log2 - m_scaled[r]);
        any |= rescale[r] != 1.f;
        row_max[r] = m;
        FA_UNROLL
        for (int c = 0; c < kChains; ++c) sc[r][c] = 0.f;
      }
      if constexpr (kRowByRow) {
        if (pass == 1) at_max(gate && after_value(last0));
      }
      FA_UNROLL
      for (int e = 0; e < N; ++e) {
        const int r = (e / 2) % 2;
        if (r < r0 || r >= r1) continue;
        s(e) = exp2f(fmaf(s(e), scale_log2, -m_scaled[r]));
        if constexpr (!kSumInPv) sc[r][(e / 4) % kChains] += s(e);
        if (r == 0) last0 = s(e);
      }
    }
    if constexpr (!kSumInPv) {
      float sum[2];
      FA_UNROLL
      for (int r = 0; r < 2; ++r) {
        sum[r] = sc[r][0];
        FA_UNROLL
        for (int c = 1; c < kChains; ++c) sum[r] += sc[r][c];
      }
      FA_UNROLL
      for (int r = 0; r < 2; ++r)
        row_sum[r] = kFirst ? sum[r] : fmaf(row_sum[r], Hooks::rescale_sum ? rescale[r] : 1.f, sum[r]);
    }
    if constexpr (!Hooks::rescale_o) {
      rescale[0] = rescale[1] = 1.f;
      return false;
    }
    if constexpr (kLazy) return __any_sync(0xffffffffu, any);
    return true;
  }

  // After the last tile: complete the row sums across the quad; returns 1/sum per row.
  __device__ __forceinline__ void finalize(float (&inv_sum)[2]) {
    static_assert(!kSumInPv, "sum_in_pv: finalize(sums, inv_sum)");
    FA_UNROLL
    for (int r = 0; r < 2; ++r) row_sum[r] = quad_sum(row_sum[r]);
    inverse(inv_sum);
  }

  // sum_in_pv, after the last PV completed: its 8 sum columns hold this thread's two rows'
  // whole sums (flat index i0 + 2 * i1 of the column group, i1 the row; softmax.cuh's layout).
  __device__ __forceinline__ void finalize(const float (&sums)[4], float (&inv_sum)[2]) {
    static_assert(kSumInPv, "finalize(sums, ...) is sum_in_pv's");
    FA_UNROLL
    for (int r = 0; r < 2; ++r) row_sum[r] = sums[2 * r];
    inverse(inv_sum);
  }

  // Attention sinks: finalize, with the row's sink (its logit x log2(e); -inf: none) joining
  // the sums. Separate overloads, so a kernel without sinks compiles the code it always did.
  __device__ __forceinline__ void finalize(float (&inv_sum)[2], float sink_log2,
                                           float scale_log2) {
    FA_UNROLL
    for (int r = 0; r < 2; ++r) row_sum[r] = quad_sum(row_sum[r]);
    inverse_with_sink(inv_sum, sink_log2, scale_log2);
  }
  __device__ __forceinline__ void finalize(const float (&sums)[4], float (&inv_sum)[2],
                                           float sink_log2, float scale_log2) {
    FA_UNROLL
    for (int r = 0; r < 2; ++r) row_sum[r] = sums[2 * r];
    inverse_with_sink(inv_sum, sink_log2, scale_log2);
  }

  __device__ __forceinline__ void inverse(float (&inv_sum)[2]) const {
    FA_UNROLL
    for (int r = 0; r < 2; ++r)
      inv_sum[r] = (row_sum[r] == 0.f || row_sum[r] != row_sum[r]) ? 0.f : 1.f / row_sum[r];
  }

  // The sink is one more term of the denominator, exp(sink), with no value row. The sums are
  // taken against the row's reference max; a sink above it becomes the new reference, so
  // nothing overflows: O's factor is exp2(old ref - new ref) / sum. A row that saw no key
  // (max -inf) gets O = 0 and lse = the sink.
  __device__ __forceinline__ void inverse_with_sink(float (&inv_sum)[2], float sink_log2,
                                                    float scale_log2) {
    float f[2] = {1.f, 1.f};
    if (sink_log2 != -INFINITY) {
      FA_UNROLL
      for (int r = 0; r < 2; ++r) {
        const float ref = row_max[r] == -INFINITY ? -INFINITY : row_max[r] * scale_log2;
        const float top = fmaxf(ref, sink_log2);
        f[r] = exp2f(ref - top);
        row_sum[r] = row_sum[r] * f[r] + exp2f(sink_log2 - top);
        row_max[r] = top / scale_log2;
      }
    }
    inverse(inv_sum);
    FA_UNROLL
    for (int r = 0; r < 2; ++r) inv_sum[r] *= f[r];
  }

  // Natural-log LSE of row r (valid after finalize()).
  __device__ __forceinline__ float lse(int r, float scale_log2) const {
    if (row_sum[r] == 0.f || row_max[r] == -INFINITY) return -INFINITY;
    return (row_max[r] * scale_log2 + __log2f(row_sum[r])) * 0.69314718055994531f;
  }
};

// Multiply each of this thread's two rows of an accumulator fragment by its factor.
template <class Frag>
__device__ __forceinline__ void scale_rows(Frag& acc, const float (&f)[2]) {
  constexpr int N = Frag::kSize;
  FA_UNROLL
  for (int e = 0; e < N; ++e) acc(e) *= f[(e / 2) % 2];
}

// Two FP32 values as one 32-bit register of BF16 (lo in the low half): one cvt.rn.bf16x2.
__device__ __forceinline__ uint32_t bf16x2(float lo, float hi) {
  __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return reinterpret_cast<uint32_t&>(p);
}

// P (probabilities) -> BF16 pairs for the PV GEMM, in S's flat order (operands.cuh): one
// cvt.rn.bf16x2 per pair, or a lab build's truncation.
template <int N>
__device__ __forceinline__ void pack_p(const Accum<N>& src, Pairs<N / 2>& dst) {
  FA_UNROLL
  for (int e = 0; e < N; e += 2) {
    if constexpr (Hooks::truncate_p) {  // the high halves: src(e) low, src(e + 1) high
      dst.r[e / 2] = __byte_perm(__float_as_uint(src(e)), __float_as_uint(src(e + 1)), 0x7632);
    } else {
      dst.r[e / 2] = bf16x2(src(e), src(e + 1));
    }
  }
}

}  // namespace fa_tune
