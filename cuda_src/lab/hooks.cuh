// Lab and test builds only: the kernel's hook points (fa_tune/hooks.cuh) set from -D macros.
// tuner's build pre-includes this file whenever it is given defines (build.define_flags); a
// product build never sees it. Two families:
//
// FA_TUNE_PLANT_BUG = N compiles planted bug N into the kernel, so
// tests/gpu/test_planted_bugs_gpu.py can prove the gate rejects real kernel bugs (built through
// tuner.build.build_config(cfg, defines={"FA_TUNE_PLANT_BUG": N})). The bugs (hook, file):
//   1 softmax.cuh   O is not rescaled when a row's running max rises (the row sum is)
//   2 softmax.cuh   causal mask off by one: key row + 1 is kept
//   3 epilogue.cuh  no final 1/rowsum on rows 0-7 of every 64-row warpgroup tile
//   4 epilogue.cuh  O x 1.015 on rows 0-7 of every 64-row tile (passes the per-element rule)
//   5 mainloop.cuh  a tile's first QK is issued before waiting on its K stage's full barrier
//                   (reads K before the TMA lands; the wait follows; intra_wg_overlap path)
//   6 epilogue.cuh  O x 1.01 on head-dim columns 0-3 of every row
//   7 softmax.cuh   the row sum is not rescaled when a row's running max rises (O is)
//   8 scheduler.cuh GQA head mapping: query head h reads K/V head h % Hkv, not h / group
//                   (fixed-length schedulers; varlen tasks carry their K/V head)
//   9 softmax.cuh   [window] sliding window off by one: the key just left of a row's window
//                   is kept
//  10 kernel.cuh    [sinks] the sink taken as a log2 logit (exp2(sink), not exp(sink))
//   A [mask] bug changes only kernels of a class with that mask (tests/gpu/test_masks_gpu.py);
//   the others, every class.
//
// FA_TUNE_LAB_* are lab experiments for scripts/kernel_lab.py (variants' "_lab" macros), never
// knobs:
//   FA_TUNE_LAB_KV_LOAD_EVERY = N  load only every Nth K/V tile, the consumers reuse stale
//                                  stages (results wrong): the bound on what less K/V traffic buys
//   FA_TUNE_LAB_Q_SLICE_BY_TID = 1 slice Q's descriptors by thread as before 2026-12-02
//   FA_TUNE_LAB_NO_SOFTMAX = 1     skip the softmax (P = S): what the GEMMs and the pipeline
//                                  cost alone at the power cap
//   FA_TUNE_LAB_P_TRUNC = 1        pack P to BF16 by truncation (one PRMT per pair on the ALU
//                                  pipe) instead of cvt.rn (F2FP), to see whether F2FP competes
//                                  with MUFU.EX2 for its pipe
//   FA_TUNE_LAB_WINDOW_TASK_START = 1  a window's warpgroups all start at the task's first KV
//                                  tile (as before 2026-12-05), not each at its own rows' first
//   FA_TUNE_LAB_WINDOW_BOTH_MASKS = 1  a window's masked tiles take the diagonal's and the edge's
//                                  masks both (as before 2026-12-07), not each only where it cuts
//   FA_TUNE_LAB_Q_LOAD_ONCE = 1    Q loaded for a CTA's first task only, its later tasks reuse
//                                  the stale stage (results wrong): what Q's traffic costs
//   FA_TUNE_LAB_NO_O_STORE = 1     O staged in shared memory but never stored (results wrong):
//                                  what O's traffic costs
//   FA_TUNE_LAB_TASK_CLOCKS = 1    each CTA's first consumer thread stamps %globaltimer as each
//                                  task starts and as the CTA ends, with the task and the SM;
//                                  fa_tune_lab_task_clocks() copies the last launch's stamps out
//                                  (scripts/kernel_lab.py --task-clocks): where a schedule's time
//                                  goes, CTA by CTA (results unchanged)
#pragma once

#define FA_TUNE_HOOKS 1
#ifndef FA_TUNE_PLANT_BUG
#define FA_TUNE_PLANT_BUG 0
#endif
#ifndef FA_TUNE_LAB_KV_LOAD_EVERY
#define FA_TUNE_LAB_KV_LOAD_EVERY 1
#endif
#ifndef FA_TUNE_LAB_Q_SLICE_BY_TID
#define FA_TUNE_LAB_Q_SLICE_BY_TID 0
#endif
#ifndef FA_TUNE_LAB_NO_SOFTMAX
#define FA_TUNE_LAB_NO_SOFTMAX 0
#endif
#ifndef FA_TUNE_LAB_P_TRUNC
#define FA_TUNE_LAB_P_TRUNC 0
#endif
#ifndef FA_TUNE_LAB_WINDOW_TASK_START
#define FA_TUNE_LAB_WINDOW_TASK_START 0
#endif
#ifndef FA_TUNE_LAB_WINDOW_BOTH_MASKS
#define FA_TUNE_LAB_WINDOW_BOTH_MASKS 0
#endif
#ifndef FA_TUNE_LAB_Q_LOAD_ONCE
#define FA_TUNE_LAB_Q_LOAD_ONCE 0
#endif
#ifndef FA_TUNE_LAB_NO_O_STORE
#define FA_TUNE_LAB_NO_O_STORE 0
#endif
#ifndef FA_TUNE_LAB_TASK_CLOCKS
#define FA_TUNE_LAB_TASK_CLOCKS 0
#endif

#if FA_TUNE_LAB_TASK_CLOCKS
#include <cuda_runtime.h>
// Per CTA (the first kLabClockCtas): [0] its task count | its SM << 32, [1 + k] task k's start,
// [kLabClockSlots - 1] its end (ns, %globaltimer); the tasks' m | head << 12 | batch << 22
// beside them. Each launch overwrites its CTAs' rows.
constexpr int kLabClockCtas = 1024, kLabClockSlots = 256;
__device__ unsigned long long fa_tune_lab_clock[kLabClockCtas][kLabClockSlots];
__device__ unsigned fa_tune_lab_task[kLabClockCtas][kLabClockSlots];
extern "C" __attribute__((visibility("default"))) int fa_tune_lab_task_clocks(
    unsigned long long* clocks, unsigned* tasks, int reset) {
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess && clocks != nullptr)
    e = cudaMemcpyFromSymbol(clocks, fa_tune_lab_clock, sizeof(fa_tune_lab_clock));
  if (e == cudaSuccess && tasks != nullptr)
    e = cudaMemcpyFromSymbol(tasks, fa_tune_lab_task, sizeof(fa_tune_lab_task));
  if (e == cudaSuccess && reset) {
    static unsigned long long zeros[kLabClockCtas][kLabClockSlots];
    e = cudaMemcpyToSymbol(fa_tune_lab_clock, zeros, sizeof(zeros));
  }
  return int(e);
}
#endif

namespace fa_tune {

constexpr int kPlantBug = FA_TUNE_PLANT_BUG;

struct Hooks {
  static constexpr int kv_load_every = FA_TUNE_LAB_KV_LOAD_EVERY;
  static constexpr bool q_slice_by_tid = FA_TUNE_LAB_Q_SLICE_BY_TID != 0;
  static constexpr bool skip_softmax = FA_TUNE_LAB_NO_SOFTMAX != 0;
  static constexpr bool truncate_p = FA_TUNE_LAB_P_TRUNC != 0;
  static constexpr bool window_task_start = FA_TUNE_LAB_WINDOW_TASK_START != 0;
  static constexpr bool task_clocks = FA_TUNE_LAB_TASK_CLOCKS != 0;
  static constexpr bool q_load_once = FA_TUNE_LAB_Q_LOAD_ONCE != 0;
  static constexpr bool window_both_masks = FA_TUNE_LAB_WINDOW_BOTH_MASKS != 0;
  static constexpr bool skip_o_store = FA_TUNE_LAB_NO_O_STORE != 0;
#if FA_TUNE_LAB_TASK_CLOCKS
  __device__ static unsigned long long now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  __device__ static void task_begin(int k, int m, int head, int batch) {
    if (blockIdx.x < kLabClockCtas && k + 2 < kLabClockSlots) {
      fa_tune_lab_clock[blockIdx.x][1 + k] = now();
      fa_tune_lab_task[blockIdx.x][1 + k] = unsigned(m) | unsigned(head) << 12 | unsigned(batch) << 22;
    }
  }
  __device__ static void cta_end(int tasks) {
    if (blockIdx.x < kLabClockCtas) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      fa_tune_lab_clock[blockIdx.x][kLabClockSlots - 1] = now();
      fa_tune_lab_clock[blockIdx.x][0] = unsigned(tasks) | (unsigned long long)sm << 32;
    }
  }
#else
  __device__ static void task_begin(int, int, int, int) {}
  __device__ static void cta_end(int) {}
#endif
  static constexpr int mask_slack = kPlantBug == 2 ? 1 : 0;
  static constexpr int window_slack = kPlantBug == 9 ? 1 : 0;
  static constexpr float sink_log2e = kPlantBug == 10 ? 1.f : 1.4426950408889634f;
  static constexpr bool rescale_o = kPlantBug != 1;
  static constexpr bool rescale_sum = kPlantBug != 7;
  static constexpr bool qk_before_k_wait = kPlantBug == 5;
  static constexpr bool interleave_kv_heads = kPlantBug == 8;
  static constexpr bool adjust_normalize = kPlantBug == 3 || kPlantBug == 4 || kPlantBug == 6;
  // Bugs 3, 4 and 6. Rows 0-7 of a 64-row warpgroup tile are warp 0's i1 = 0 rows
  // (row0 % 64 < 8): 3 leaves them unnormalized, 4 scales them by 1.015; 6 scales head-dim
  // columns 0-3 (fragment entries 0-3 of the lanes with lane % 4 < 2) by 1.01.
  __device__ static void normalize_factors(float (&f)[2], int row0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if ((row0 + 8 * r) % 64 < 8) {
        if constexpr (kPlantBug == 3) f[r] = 1.f;
        if constexpr (kPlantBug == 4) f[r] *= 1.015f;
      }
    }
  }
  template <class Frag>
  __device__ static void after_normalize(Frag& o) {
    if constexpr (kPlantBug == 6) {
      if (threadIdx.x % 4 < 2) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o(e) *= 1.01f;
      }
    }
  }
};

}  // namespace fa_tune
