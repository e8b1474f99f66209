// The epilogue of one consumer warpgroup: normalize O, stage its 64 rows in shared memory
// with stmatrix, and store them with TMA; write the LSE of its rows.
#pragma once

#include "o_stage.cuh"
#include "params.cuh"
#include "softmax.cuh"
#include "tma.cuh"
#include "traits.cuh"
#include "wgmma.cuh"

namespace fa_tune {

template <class Cfg, class Sched>
struct Epilogue {
  using T = Traits<Cfg>;
  using Element = typename T::Element;
  // pack_gqa's fixed-length kernel: rows interleave query heads (params.cuh, PackParams).
  static constexpr bool kPack = kPackRows<T, Sched>;

  // Varlen: rows [first_row, S) of a tile that ends past its sequence (S rows), 16 bytes per
  // thread-step from the staged tile. TMA would clip only at the end of the whole pack and so
  // overwrite the next sequence's first rows; this path runs once per sequence and head. O is
  // dense: [batch entries, Sq rows, H, D] (packed: one entry of all tokens).
  __device__ static void store_rows(const Params& p, const Element* o_smem, const TileCoord& t,
                                    int first_row, int S, int wg, int tid) {
    constexpr int kChunks = T::kHeadDim / 8;  // 16-byte pieces per row
    const int rows = min(64, S - first_row);
    const int row_base = Sched::seq_start(t) + first_row;
    auto* o = static_cast<Element*>(p.store.o) + size_t(t.batch) * p.shape.Sq * p.shape.H * T::kHeadDim;
    for (int i = tid % kWarpgroupThreads; i < rows * kChunks; i += kWarpgroupThreads) {
      const int r = i / kChunks, c = (i % kChunks) * 8;
      // Never past the tensor (the schedule checked the metadata; this is the last guard).
      if (row_base + r >= p.shape.Sq) break;
      // The 128-byte swizzle moves whole 16-byte pieces, so 8 aligned columns stay contiguous.
      const uint4 v = *reinterpret_cast<const uint4*>(
          reinterpret_cast<const char*>(o_smem) + OStage::tile_byte(wg * 64 + r, c, T::kBlockM));
      *reinterpret_cast<uint4*>(o + (size_t(row_base + r) * p.shape.H + t.head) * T::kHeadDim + c) = v;
    }
  }

  // O's accumulator (FP32) as BF16 into the swizzled O tile, one stmatrix.x4 per 16 columns
  // of each warp's 16 rows (o_stage.cuh says where). Written out rather than as CuTe's STSM
  // tiled copy: the same stores, and that copy's layout algebra was a quarter of a
  // candidate's front-end time (docs/PERF.md step 53).
  __device__ __forceinline__ static void stage_o(const typename T::FragO& acc, Element* o_smem) {
    constexpr int N = T::FragO::kSize;  // D / 2 values per thread
    uint32_t packed[N / 2];
    FA_UNROLL
    for (int e = 0; e < N; e += 2) packed[e / 2] = bf16x2(acc(e), acc(e + 1));
    // The thread index read here, not hoisted: else NVVM computes the addresses once before
    // the mainloop and keeps them live through it (a D 256 varlen kernel spilled).
    int tid_x;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid_x));
    const OStage at(tid_x - kWarpgroupThreads);
    const uint32_t base = uint32_t(__cvta_generic_to_shared(o_smem));
    FA_UNROLL
    for (int k = 0; k < T::kHeadDim / 16; ++k) {
      const uint32_t addr = base + at.offset(k, T::kBlockM);
      asm volatile("stmatrix.sync.aligned.x4.m8n8.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                   "r"(packed[4 * k]), "r"(packed[4 * k + 1]), "r"(packed[4 * k + 2]),
                   "r"(packed[4 * k + 3]));
    }
  }

  // O staged in Q's buffer: returns once the TMA store has finished reading it, so the caller
  // may hand the buffer back to the producer. O in its own buffer: the store's read is waited
  // for only before the next task stages O there, a task later, so no warp waits for TMA's
  // read of the tile (it was 6 % of the consumer's samples with 3-tile tasks: docs/PERF.md
  // step 65); drain() covers the last one. first_row: the warpgroup's first query row
  // (params.cuh, wg_first_row); row0: this thread's first row.
  template <class Softmax>
  __device__ static void run(const KernelParams<Sched>& p, SharedStorage<T>& ss,
                             typename T::FragO& o, const Softmax& sm,
                             const float (&inv_sum)[2],
                             const TileCoord& t, int first_row, int row0, int wg, int tid) {
    if constexpr (Hooks::adjust_normalize) {
      float f[2] = {inv_sum[0], inv_sum[1]};
      Hooks::normalize_factors(f, row0);
      scale_rows(o, f);
      Hooks::after_normalize(o);
    } else {
      scale_rows(o, inv_sum);
    }
    // Each warpgroup writes only its own 64 rows, which only its own QKs read as Q, so no
    // other warpgroup needs to be waited for before overwriting them.
    Element* o_smem = T::kSeparateO ? ss.o : ss.q;
    if constexpr (T::kSeparateO) {
      // The previous task's store (issued by this warpgroup's first thread) has read the tile.
      if (tid % kWarpgroupThreads == 0) tma_store_wait_read();
      sm90::bar_sync(kWarpgroupThreads, kEpilogueBar + wg);
    }
    stage_o(o, o_smem);
    fence_view_async_shared();
    sm90::bar_sync(kWarpgroupThreads, kEpilogueBar + wg);

    const int S = Sched::seq_len(p, t), start = Sched::seq_start(t);
    bool stored = false;
    if constexpr (Sched::kPacked) {
      if (first_row + 64 > S) {
        if (first_row < S) store_rows(p, o_smem, t, first_row, S, wg, tid);
        stored = true;
      }
    }
    if (!stored && !Hooks::skip_o_store && tid % kWarpgroupThreads == 0) {
      if constexpr (kPack) {
        // The warpgroup's 64 rows: P heads x 64 / P positions of the 5-D view.
        const int shift = p.pack.shift;
        if ((first_row >> shift) < S) {
          for (int c = 0; c < T::kDBoxes; ++c)
            tma_store_5d<Cfg::hint_o>(&p.store.tma_o,
                                      o_smem + (c * T::kBlockM + wg * 64) * kBoxCols,
                                      c * kBoxCols, 0, first_row >> shift, t.head, t.batch);
        }
      } else if (first_row < S) {
        for (int c = 0; c < T::kDBoxes; ++c)  // 64-column boxes; rows past S are clipped by TMA
          tma_store_4d<Cfg::hint_o>(&p.store.tma_o, o_smem + (c * T::kBlockM + wg * 64) * kBoxCols,
                                    c * kBoxCols, start + first_row, t.head, t.batch);
      }
      tma_store_commit();
      if constexpr (!T::kSeparateO) tma_store_wait_read();
    }

    if constexpr (Cfg::write_lse) {
      // [B, H, Sq]; packed [H, total tokens] (batch 0, Sq the pack's tokens, rows from start).
      if (p.store.lse != nullptr && (threadIdx.x % 4) == 0) {
        if constexpr (kPack) {
          // A thread's rows: one query head, positions row >> shift.
          const int shift = p.pack.shift;
          const size_t head =
              packed_head(size_t(t.batch) * p.shape.H + t.head, row0, shift);
          float* lse = p.store.lse + head * p.shape.Sq;
          const float scale_log2 = p.scale_log2;
          for (int r = 0; r < 2; ++r) {
            const int pos = (row0 + 8 * r) >> shift;
            if (pos < S) lse[pos] = sm.lse(r, scale_log2);
          }
        } else {
          float* lse =
              p.store.lse + (size_t(t.batch) * p.shape.H + t.head) * p.shape.Sq + start;
          const float scale_log2 = p.scale_log2;
          for (int r = 0; r < 2; ++r) {
            const int row = row0 + 8 * r;
            if (row < S) lse[row] = sm.lse(r, scale_log2);
          }
        }
      }
    }
    // Everyone in the warpgroup learns that the store has read the staged tile (Q's buffer).
    if constexpr (!T::kSeparateO) sm90::bar_sync(kWarpgroupThreads, kEpilogueBar + wg);
  }

  // After the last task: O's own buffer must outlive its last store's read.
  __device__ static void drain(int tid) {
    if constexpr (T::kSeparateO) {
      if (tid % kWarpgroupThreads == 0) tma_store_wait_read();
    }
  }
};

}  // namespace fa_tune
