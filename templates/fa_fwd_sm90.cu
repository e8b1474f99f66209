// fa-tune kernel template: FlashAttention forward, BF16, BSHD, sm_90a; MHA, GQA and MQA at run
// time (Hkv); head dim 64/128/256, causal or not, whether the varlen (packed) kernel is built
// too, and the models' masks and a paged KV cache ($${mask_members}: window, softcap, sinks,
// paged, only those the class has) at compile time (the problem class, not knobs).
// Rendered by tuner/kernel/build.py: $${config_members} becomes one static constexpr member per
// knob, from KernelConfig's knob table (tuner/kernel/knobs.py, docs/ARCHITECTURE.md).
// The kernel itself lives in cuda_src/fa_tune/; this unit only fixes its knobs.
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
  static constexpr bool causal = ${causal};${mask_members}
${config_members}
  static constexpr const char* json = ${config_json};
};
}  // namespace

#include "fa_tune/entry.cuh"
