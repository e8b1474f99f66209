// Knob vocabulary shared by the template and every kernel piece.
//
// A rendered template defines `struct Config` with one static constexpr member per knob
// (tuner/kernel/config.py's knob table); everything below derives from it at compile
// time, so each config is its own kernel with no run-time branching on knobs.
#pragma once

#include <cstdint>
#include <type_traits>

// Full unrolling of a loop with a compile-time trip count.
#define FA_UNROLL _Pragma("unroll")

#include "hooks.cuh"

namespace fa_tune {

enum class CacheHint { None, EvictFirst, EvictLast, EvictNormal };
enum class KRelease { AfterQk, AfterMax, AfterSoftmax };
enum class VRelease { AfterPv, Deferred };
enum class QRelease { AfterLastQk, AtEnd };
enum class RescaleO { AfterPv, BeforePv };
enum class TileOrder { LongestFirst, Natural };
enum class Scheduler { Grid, Static, Dynamic };
enum class SoftcapTanh { Exact, Approx };

constexpr int kWarpgroupThreads = 128;

// The mask is a compile-time problem class, part of the config's identity: Config::causal
// (a Config that does not name it is causal, the only problem before issue 14).
template <class Cfg, class = void>
struct CausalOf : std::true_type {};
template <class Cfg>
struct CausalOf<Cfg, std::void_t<decltype(Cfg::causal)>>
    : std::integral_constant<bool, bool(Cfg::causal)> {};

// The head dim is the other compile-time problem class: Config::head_dim (128 when absent).
template <class Cfg, class = void>
struct HeadDimOf : std::integral_constant<int, 128> {};
template <class Cfg>
struct HeadDimOf<Cfg, std::void_t<decltype(Cfg::head_dim)>>
    : std::integral_constant<int, int(Cfg::head_dim)> {};

// The models' masks (issue 36) are problem classes too: Config::window (sliding windows: the
// KV range starts at the window, whose edge tiles are masked), Config::softcap (a tanh per
// score) and Config::sinks (a term per row in the softmax's denominator). Each is false when the
// Config does not name it, so a kernel without them is the code it always was.
#define FA_TUNE_CLASS_FLAG(Name, member)                                                 \
  template <class Cfg, class = void>                                                     \
  struct Name : std::false_type {};                                                      \
  template <class Cfg>                                                                   \
  struct Name<Cfg, std::void_t<decltype(Cfg::member)>>                                   \
      : std::integral_constant<bool, bool(Cfg::member)> {};
FA_TUNE_CLASS_FLAG(WindowOf, window)
FA_TUNE_CLASS_FLAG(SoftcapOf, softcap)
FA_TUNE_CLASS_FLAG(SinksOf, sinks)
FA_TUNE_CLASS_FLAG(PagedOf, paged)
#undef FA_TUNE_CLASS_FLAG

// Compile-time facts derived from a Config; every piece takes `Derived<Config>`.
template <class Cfg>
struct Derived {
  using C = Cfg;
  static constexpr bool kCausal = CausalOf<Cfg>::value;
  static constexpr int kHeadDim = HeadDimOf<Cfg>::value;
  static constexpr bool kWindow = WindowOf<Cfg>::value;
  static constexpr bool kSoftcap = SoftcapOf<Cfg>::value;
  static constexpr bool kSinks = SinksOf<Cfg>::value;
  // A paged KV cache: the device-scheduled kernel reads K and V through a block table (the
  // fixed-length kernel of the same library stays unpaged).
  static constexpr bool kPaged = PagedOf<Cfg>::value;
  // TMA moves 64 BF16 head-dim columns per box (128 bytes, the swizzle's span): D / 64 boxes.
  static constexpr int kDBoxes = kHeadDim / 64;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim: 64, 128 or 256");
  static constexpr int kBlockM = Cfg::block_m;
  static constexpr int kBlockN = Cfg::block_n;
  static constexpr int kKStages = Cfg::k_stages;
  static constexpr int kVStages = Cfg::v_stages;
  static constexpr int kConsumerWGs = kBlockM / 64;
  // Named barriers per consumer warpgroup (wgmma.cuh's ids) end at bar.sync's 16.
  static_assert(kConsumerWGs <= 3, "block_m must be 64, 128 or 192");
  static constexpr int kConsumerThreads = kConsumerWGs * kWarpgroupThreads;
  static constexpr int kThreads = kConsumerThreads + kWarpgroupThreads;  // + producer WG
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  // Pingpong only makes sense with something to alternate with.
  static constexpr bool kPingpong = Cfg::pingpong && kConsumerWGs >= 2;
  static constexpr bool kOverlap = Cfg::intra_wg_overlap;
  static constexpr bool kRescaleBeforePv = Cfg::rescale_o == RescaleO::BeforePv && kOverlap;
  // sum_in_pv: the row sums come out of the PV GEMM, as 8 more output columns (64 x 72) whose
  // B operand is a block of ones, instead of one FADD per score in the softmax. The ones sit
  // at the descriptor's second 64-column atom, a free offset only while V is one atom wide.
  static constexpr bool kSumInPv = Cfg::sum_in_pv;
  static_assert(!kSumInPv || kHeadDim == 64, "sum_in_pv needs head_dim 64");
  // Only a persistent CTA has a next tile; its Q must be able to land before this tile's
  // epilogue ends (after_last_qk), or the drain would wait for it forever.
  static constexpr bool kEarlyNextQk = Cfg::early_next_qk;
  static_assert(!kEarlyNextQk || (Cfg::scheduler != Scheduler::Grid && kOverlap &&
                                  Cfg::q_release == QRelease::AfterLastQk),
                "early_next_qk needs a persistent scheduler, intra_wg_overlap and "
                "q_release after_last_qk");

  // Clusters share K/V tiles through TMA multicast: each CTA loads 1/kClusterSize of a tile
  // and TMA writes it into every CTA of the cluster, so L2 -> SM traffic falls by that factor
  // (energy the power-capped card turns into clock). Two kinds of sharing, combinable:
  // kv_multicast: two CTAs share a pair of query tiles of one head (2 x block_m rows),
  // interleaved so both need the same KV tiles and about the same work (params.cuh:
  // wg_first_row). Four measured slower at every workload tried (docs/PERF.md step 37).
  static constexpr bool kMulticast = Cfg::kv_multicast;
  static constexpr int kRowCtas = kMulticast ? 2 : 1;
  // head_cluster: that many query heads of one K/V group run the same query tile side by side
  // (GQA: they read the same K/V tiles); the group size must be a multiple (checked at launch).
  static constexpr int kHeadCtas = Cfg::head_cluster;
  static constexpr int kClusterSize = kRowCtas * kHeadCtas;
  static constexpr bool kClustered = kClusterSize > 1;
  static constexpr int kRowsPerTask = kBlockM * kRowCtas;
  static constexpr int kQBoxRows = kMulticast ? 64 : kBlockM;  // one box per warpgroup then
  static_assert(kHeadCtas == 1 || kHeadCtas == 2 || kHeadCtas == 4, "head_cluster: 1, 2 or 4");
  static_assert(!kMulticast || (Cfg::scheduler == Scheduler::Static && kConsumerWGs >= 2 &&
                                !kEarlyNextQk),
                "kv_multicast needs the static scheduler, block_m >= 128 and no early_next_qk");
  // Causal: a warpgroup whose rows end above the task's last row starts at its own diagonal
  // and only hands back the stages of the task's KV tiles above it (all masked for its rows)
  // instead of computing them masked. A multicast pair must (its rows span two query tiles);
  // wg_skip does it within one CTA's block_m rows.
  static constexpr bool kWgSkip = kMulticast || (Cfg::wg_skip && kConsumerWGs >= 2);
  static_assert(!kWgSkip || !kEarlyNextQk, "wg_skip needs early_next_qk false");
  // pack_gqa: a fixed-length launch's 64-row warpgroup tile holds P query heads of one K/V
  // group at 64 / P positions (row = position x P + head; P, the largest power of two dividing
  // Hq / Hkv up to 8, chosen at launch: params.cuh, PackParams). A causal or windowed row band
  // then spans 64 / P + window keys instead of 64 + window, and the task's key tiles start at
  // its first key. The library's varlen kernel runs unpacked.
  static constexpr bool kPackGqa = Cfg::pack_gqa;
  static_assert(!kPackGqa || (!kMulticast && kHeadCtas == 1 && !kWgSkip),
                "pack_gqa needs kv_multicast false, head_cluster 1 and wg_skip false");
  // The lowest warpgroup skips up to kMaxSkip KV tiles and frees their V stages only after
  // its first QK, whose K the producer sends after kMaxSkip - 1 of those V tiles
  // (producer.cuh): fewer V stages deadlock (H200 2026-12-02; config.warpgroup_max_skip).
  static constexpr int kMaxSkip = (kRowsPerTask - 64 + kBlockN - 1) / kBlockN;
  static_assert(!kWgSkip || !kCausal || !kOverlap || kMaxSkip - 1 <= kVStages,
                "too few V stages for the KV tiles a warpgroup skips");
  static_assert(kHeadCtas == 1 || (Cfg::scheduler != Scheduler::Dynamic && !kEarlyNextQk),
                "head_cluster needs the static or grid scheduler and no early_next_qk");
  // A CTA's share of a K/V tile: whole 64-column boxes while there are as many as CTAs, else
  // each box cut into row slices (8-row multiples: the 128-byte swizzle's period).
  static constexpr int kKVRowSlices = kClusterSize > kDBoxes ? kClusterSize / kDBoxes : 1;
  static constexpr int kKVBoxRows = kBlockN / kKVRowSlices;
  static_assert(kKVBoxRows * kKVRowSlices == kBlockN && kKVBoxRows % 8 == 0,
                "block_n must split into row slices of a multiple of 8 rows per cluster CTA");
  // A paged cache's TMA boxes: a page's rows, at most the largest power of two dividing a slice
  // (block_n 80: 16), so no box straddles two pages (pages are powers of two; producer.cuh).
  static constexpr int kPageBoxRowsMax = kKVBoxRows & -kKVBoxRows;

  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * 2;
  // With Q released after the last QK, the next tile's Q may land while O is being staged,
  // so O needs its own buffer; otherwise O reuses Q's.
  static constexpr bool kSeparateO = Cfg::q_release == QRelease::AfterLastQk;
  static constexpr int kOElems = kSeparateO ? kBlockM * kHeadDim : 1;

  static_assert(kBlockM == 64 || kBlockM == 128 || kBlockM == 192, "block_m must be 64, 128 or 192");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 48 && kBlockN <= 192, "block_n: 48..192, step 16");
  // Without the extended atoms there is no QK atom for this block_n (traits.cuh).
  static_assert(kKStages >= 1 && kKStages <= 3 && kVStages >= 1 && kVStages <= 3, "stages: 1..3");
  static_assert(Cfg::k_release != KRelease::AfterMax || kOverlap,
                "k_release after_max needs intra_wg_overlap");
  static_assert(Cfg::v_release != VRelease::Deferred || kVStages >= 2,
                "deferred V release needs two V stages or the producer deadlocks");
  static_assert(Cfg::producer_regs % 8 == 0 && Cfg::consumer_regs % 8 == 0, "setmaxnreg wants multiples of 8");
  // setmaxnreg only redistributes what the CTA got at launch: kThreads x (65536 / kThreads,
  // down to a multiple of 8). Asking for more makes setmaxnreg.inc wait forever (the likely
  // cause of a hang on the H200 with producer 32 / consumers 240 at 384 threads: 65536 > 64512).
  // ctas_per_sm CTAs resident per SM (__launch_bounds__' minimum) split the register file.
  static constexpr int kCtasPerSm = Cfg::ctas_per_sm;
  static_assert(kCtasPerSm >= 1 && kCtasPerSm <= 3, "ctas_per_sm: 1, 2 or 3");
  static constexpr int kLaunchRegPerThread = 65536 / (kThreads * kCtasPerSm);
  static constexpr int kLaunchRegs =
      kThreads * ((kLaunchRegPerThread < 255 ? kLaunchRegPerThread : 255) / 8 * 8);
  static_assert((Cfg::producer_regs + kConsumerWGs * Cfg::consumer_regs) * kWarpgroupThreads <= kLaunchRegs,
                "register split exceeds the registers the CTA holds at launch");
};

}  // namespace fa_tune
