// Knob vocabulary shared by the template and every kernel piece.
//
// A rendered template defines `struct Config` with one static constexpr member per knob
// (names and values as in tuner/config.py); everything below derives from it at compile
// time, so each config is its own kernel with no run-time branching on knobs.
#pragma once

// Before any CuTe header: enables the 64xN wgmma atoms for N = 80, 112, 144, 176.
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED

#include <cstdint>

namespace fa_tune {

enum class CacheHint { None, EvictFirst, EvictLast, EvictNormal };
enum class KRelease { AfterQk, AfterSoftmax };
enum class VRelease { AfterPv, Deferred };
enum class QRelease { AfterLastQk, AtEnd };
enum class RescaleO { AfterPv, BeforePv };
enum class TileOrder { LongestFirst, Natural };
enum class Scheduler { Grid, Static, Dynamic };

constexpr int kHeadDim = 128;
constexpr int kWarpgroupThreads = 128;

// Compile-time facts derived from a Config; every piece takes `Derived<Config>`.
template <class Cfg>
struct Derived {
  using C = Cfg;
  static constexpr int kBlockM = Cfg::block_m;
  static constexpr int kBlockN = Cfg::block_n;
  static constexpr int kKStages = Cfg::k_stages;
  static constexpr int kVStages = Cfg::v_stages;
  static constexpr int kConsumerWGs = kBlockM / 64;
  static constexpr int kConsumerThreads = kConsumerWGs * kWarpgroupThreads;
  static constexpr int kThreads = kConsumerThreads + kWarpgroupThreads;  // + producer WG
  static constexpr int kConsumerWarps = kConsumerThreads / 32;
  // Pingpong only makes sense with something to alternate with.
  static constexpr bool kPingpong = Cfg::pingpong && kConsumerWGs >= 2;
  static constexpr bool kOverlap = Cfg::intra_wg_overlap;
  static constexpr bool kRescaleBeforePv = Cfg::rescale_o == RescaleO::BeforePv && kOverlap;

  static constexpr int kQBytes = kBlockM * kHeadDim * 2;
  static constexpr int kKVTileBytes = kBlockN * kHeadDim * 2;

  static_assert(kBlockM == 64 || kBlockM == 128 || kBlockM == 192, "block_m must be 64, 128 or 192");
  static_assert(kBlockN % 16 == 0 && kBlockN >= 64 && kBlockN <= 192, "block_n: 64..192, step 16");
  static_assert(kKStages >= 1 && kKStages <= 3 && kVStages >= 1 && kVStages <= 3, "stages: 1..3");
  static_assert(Cfg::v_release != VRelease::Deferred || kVStages >= 2,
                "deferred V release needs two V stages or the producer deadlocks");
  static_assert(Cfg::producer_regs % 8 == 0 && Cfg::consumer_regs % 8 == 0, "setmaxnreg wants multiples of 8");
  static_assert((Cfg::producer_regs + kConsumerWGs * Cfg::consumer_regs) * kWarpgroupThreads <= 65536,
                "register split exceeds the 64K register file");
};

}  // namespace fa_tune
