// fa-tune kernel template: FlashAttention forward, BF16, BSHD, sm_90a; MHA, GQA and MQA at run
// time (Hkv); head dim 64/128/256, causal or not, and whether the varlen (packed) kernel is
// built too at compile time (the problem class, not knobs).
// Rendered by tuner/build.py: each $${knob} becomes a C++ constant (docs/ARCHITECTURE.md).
// The kernel itself lives in cuda_src/fa_tune/; this unit only fixes its knobs.
#define FA_TUNE_EXTENDED_MMA ${extended_mma}  // derived from block_n (fa_tune/config.cuh)
#ifndef FA_TUNE_VARLEN
#define FA_TUNE_VARLEN ${varlen}  // the packed-sequence kernel too (problem class; entry.cuh)
#endif
#include "fa_tune/config.cuh"

// Anonymous namespace: every instantiation of the kernel pieces on Config gets internal
// linkage, so two kernels loaded into one process (the tuner loads many) never resolve
// each other's template code or statics.
namespace {
struct Config {
  static constexpr int head_dim = ${head_dim};  // the problem class this library serves
  static constexpr bool causal = ${causal};
  static constexpr int block_m = ${block_m};
  static constexpr int block_n = ${block_n};
  static constexpr int k_stages = ${k_stages};
  static constexpr int v_stages = ${v_stages};
  static constexpr fa_tune::KRelease k_release = ${k_release};
  static constexpr fa_tune::VRelease v_release = ${v_release};
  static constexpr fa_tune::QRelease q_release = ${q_release};
  static constexpr fa_tune::CacheHint hint_q = ${hint_q};
  static constexpr fa_tune::CacheHint hint_k = ${hint_k};
  static constexpr fa_tune::CacheHint hint_v = ${hint_v};
  static constexpr fa_tune::CacheHint hint_o = ${hint_o};
  static constexpr int producer_regs = ${producer_regs};
  static constexpr int consumer_regs = ${consumer_regs};
  static constexpr bool intra_wg_overlap = ${intra_wg_overlap};
  static constexpr bool pingpong = ${pingpong};
  static constexpr fa_tune::RescaleO rescale_o = ${rescale_o};
  static constexpr bool lazy_rescale = ${lazy_rescale};
  static constexpr bool tree_reduce = ${tree_reduce};
  static constexpr bool sum_in_pv = ${sum_in_pv};
  static constexpr bool q_in_regs = ${q_in_regs};
  static constexpr bool early_next_qk = ${early_next_qk};
  static constexpr bool kv_multicast = ${kv_multicast};
  static constexpr bool wg_skip = ${wg_skip};
  static constexpr int head_cluster = ${head_cluster};
  static constexpr fa_tune::TileOrder tile_order = ${tile_order};
  static constexpr fa_tune::Scheduler scheduler = ${scheduler};
  static constexpr int fixed_cost = ${fixed_cost};
  static constexpr int persistent_ctas = ${persistent_ctas};
  static constexpr bool write_lse = ${write_lse};
  static constexpr const char* json = ${config_json};
};
}  // namespace

#include "fa_tune/entry.cuh"
