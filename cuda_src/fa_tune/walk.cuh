// kv_walk: a CTA walks a strip of kv_walk consecutive query tiles of one head (the dynamic
// scheduler hands out strips), and the K/V tiles two neighbours share stay in the rings.
//
// A causal window's query tile sees a few KV tiles (a 128-key window, 64-row tiles: 3), and
// the next tile sees all but the lowest of them plus one new one. Loaded per task, every KV
// tile crosses from L2 three times; walked, once. So the producer loads only the tiles the
// previous task of the strip did not (in ascending order: all K, then all V, so the next
// task's first K never waits behind a V stage that the current task still reads), and the
// consumer reads a task's tiles by position in the rings, from the diagonal down, and hands
// back only those its successor does not need: the K stages once its last QK is done, the V
// stages after its last PV.
//
// The rings load the same tiles in the same order (k_stages == v_stages), so one cursor, the
// stage of the task's lowest tile, places both. A task's tiles must fit the rings at once:
// where a call's window needs more (or has none), the scheduler's prepare sets no strips
// (strip_shift 0) and the same kernel runs tile by tile, as without kv_walk.
#pragma once

#include "device_pass.cuh"
#include "params.cuh"
#if FA_TUNE_DEVICE_PASS
#include "pipeline.cuh"
#endif

namespace fa_tune {

// The dynamic scheduler's parameters gain the call's strip only where kv_walk is compiled in,
// so every other kernel's parameters stay as they were.
template <bool kWalk>
struct StripParams {};
template <>
struct StripParams<true> {
  int strip_shift;  // log2 of the strip's query tiles; 0: no walk for this call
};

template <class T, bool kEnabled>
struct KvWalk {
  static constexpr bool kOn = kEnabled && T::kKvWalk;
  static constexpr int kStrip = kOn ? T::C::kv_walk : 1;  // the strip compiled in
  static constexpr int kStages = T::kKStages;

  struct Tiles {
    int lo, hi;  // the KV tiles [lo, hi) of one query tile
  };

  // The call's strip (log2; 0: tile by tile), as the scheduler's prepare set it.
  template <class KP>
  __device__ static int shift(const KP& p) {
    if constexpr (kOn) {
      return p.sched.strip_shift;
    } else {
      return 0;
    }
  }

  // Query tile m follows m - 1 on the same CTA (strips start at multiples of 1 << shift).
  __host__ __device__ static bool continues(int m, int shift) {
    return (m & ((1 << shift) - 1)) != 0;
  }

  // A query tile's KV tiles (fixed length: the same rule as the producer's and consumer's).
  __host__ __device__ static Tiles tiles(int Sq, int Sk, int window, int m) {
    const int off = Sk - Sq;
    const int hi = num_kv_blocks<T>(Sk, off, m);
    return {first_kv_block<T>(off, m * T::kRowsPerTask, window, hi), hi};
  }

  // The first tile task m must load: what m - 1 left in the rings is [m's lo, m - 1's hi).
  __host__ __device__ static int first_new(int Sq, int Sk, int window, int m, const Tiles& t,
                                           int shift) {
    if (!continues(m, shift)) return t.lo;
    const int prev_hi = tiles(Sq, Sk, window, m - 1).hi;
    return t.lo > prev_hi ? t.lo : prev_hi;
  }

  // After task m (tiles `cur`), the tiles [cur.lo, this) go back; the rest stay for next_m
  // when it goes on with the strip (next_m < 0: no next task).
  __host__ __device__ static int keep(int Sq, int Sk, int window, const Tiles& cur, int next_m,
                                      int shift) {
    if (next_m < 0 || !continues(next_m, shift)) return cur.hi;
    const int next_lo = tiles(Sq, Sk, window, next_m).lo;
    return next_lo < cur.hi ? next_lo : cur.hi;
  }

  // The most KV tiles one query tile holds at once (host): the strip is walked only where
  // the rings hold them.
  static int most_tiles(int Sq, int Sk, int window) {
    const int num_m = (Sq + T::kBlockM - 1) / T::kBlockM;
    int most = 0;
    for (int m = 0; m < num_m; ++m) {
      const Tiles t = tiles(Sq, Sk, window, m);
      most = t.hi - t.lo > most ? t.hi - t.lo : most;
    }
    return most;
  }
  static bool fits(int Sq, int Sk, int window) {
    return kOn && most_tiles(Sq, Sk, window) <= kStages;
  }

#if FA_TUNE_DEVICE_PASS
  // The consumer's view of the rings across one strip.
  struct Cursor {
    PipeState base;  // the stage of the current task's lowest tile
    Tiles cur;
    int keep;        // tiles [cur.lo, keep) go back after this task; its successor keeps the rest

    // Begin task m; `next_m` < 0: the strip ends with it (the next task loads afresh).
    __device__ void begin(int Sq, int Sk, int window, int m, int next_m, int shift) {
      cur = tiles(Sq, Sk, window, m);
      keep = KvWalk::keep(Sq, Sk, window, cur, next_m, shift);
    }
    // The stage of task m's top (diagonal) tile, m the current task or, before begin(), the
    // strip's first.
    __device__ PipeState top(int Sq, int Sk, int window, int m) const {
      const Tiles t = tiles(Sq, Sk, window, m);
      return base.template plus<kStages>(t.hi - 1 - t.lo);
    }
    // The stage of the next task's top (diagonal) tile, m = next_m.
    __device__ PipeState next_top(int Sq, int Sk, int window, int next_m) const {
      const Tiles n = tiles(Sq, Sk, window, next_m);
      return base.template plus<kStages>(keep - cur.lo + n.hi - 1 - n.lo);
    }
    // Hand back the tiles the successor does not need (each warp, after the wgmma wait that
    // proved their reads done).
    template <class Ring>
    __device__ void release(Ring& ring) const {
      for (int i = 0; i < keep - cur.lo; ++i) ring.release(base.template plus<kStages>(i));
    }
    __device__ void advance() { base = base.template plus<kStages>(keep - cur.lo); }
  };
#endif
};

}  // namespace fa_tune
