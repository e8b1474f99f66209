// Compile-time hook points: where a lab or test build changes the kernel (a bug the gate must
// catch, a lab bound). A product build takes the defaults below; each is a constant
// that an `if constexpr` or the optimizer folds away, so the code is the same as without them.
// A lab or test build pre-includes cuda_src/lab/hooks.cuh (tuner's build does whenever it is
// given -D defines), which defines FA_TUNE_HOOKS and its own Hooks from its macros.
#pragma once

#ifndef FA_TUNE_HOOKS
namespace fa_tune {
struct Hooks {
  static constexpr int kv_load_every = 1;           // producer: K/V tiles n with n % this == 0 load
  static constexpr bool q_slice_by_tid = false;     // consumer: Q descriptors sliced by thread
  static constexpr bool skip_softmax = false;       // softmax: P = S (a bound, wrong results)
  static constexpr bool truncate_p = false;         // softmax: P to BF16 by truncation
  static constexpr int mask_slack = 0;              // causal mask: keys kept past the diagonal
  static constexpr int window_slack = 0;            // window mask: keys kept left of the window
  static constexpr bool window_task_start = false;  // window: every warpgroup from the task's start
  static constexpr bool window_both_masks = false;  // window: every masked tile takes both masks
  static constexpr bool task_clocks = false;        // consumer: stamp each task's start (lab)
  static constexpr bool q_load_once = false;        // producer: Q loaded for a CTA's first task only
  static constexpr bool skip_o_store = false;       // epilogue: O staged but never stored
  __device__ static void task_begin(int, int, int, int) {}
  __device__ static void cta_end(int) {}
  static constexpr float sink_log2e = 1.4426950408889634f;  // a sink logit to base 2
  static constexpr bool rescale_o = true;           // softmax: O follows a rising row max
  static constexpr bool rescale_sum = true;         // softmax: the row sum does
  static constexpr bool qk_before_k_wait = false;   // mainloop: a tile's first QK before K lands
  static constexpr bool interleave_kv_heads = false;  // query head h reads K/V head h % Hkv
  static constexpr bool adjust_normalize = false;   // epilogue: the two hooks below run
  // Epilogue: the per-row factors O is normalized by (this thread's rows row0, row0 + 8), and O
  // after that.
  __device__ static void normalize_factors(float (&)[2], int /*row0*/) {}
  template <class Frag>
  __device__ static void after_normalize(Frag&) {}
};
}  // namespace fa_tune
#endif
