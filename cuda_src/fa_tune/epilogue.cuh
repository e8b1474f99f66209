// The epilogue of one consumer warpgroup: normalize O, stage its 64 rows in shared memory
// with stmatrix, and store them with TMA; write the LSE of its rows.
#pragma once

#include "params.cuh"
#include "softmax.cuh"
#include "tma.cuh"
#include "traits.cuh"
#include "wgmma.cuh"

namespace fa_tune {

// TEST ONLY: planted bugs 3, 4 and 6 (config.cuh). Rows 0-7 of a 64-row warpgroup tile are
// warp 0's i1 = 0 rows (row0 % 64 < 8): 3 leaves them unnormalized, 4 scales them by 1.015; 6
// scales head-dim columns 0-3 (fragment entries 0-3 of the lanes with lane % 4 < 2) by 1.01.
template <class TOrO>
__device__ __forceinline__ void planted_normalize(TOrO& tOrO, const float (&inv_sum)[2], int row0) {
  float f[2] = {inv_sum[0], inv_sum[1]};
  CUTE_UNROLL
  for (int r = 0; r < 2; ++r) {
    if ((row0 + 8 * r) % 64 < 8) {
      if constexpr (kPlantBug == 3) f[r] = 1.f;
      if constexpr (kPlantBug == 4) f[r] *= 1.015f;
    }
  }
  scale_rows(tOrO, f);
  if constexpr (kPlantBug == 6) {
    if (threadIdx.x % 4 < 2) {
      CUTE_UNROLL
      for (int e = 0; e < 4; ++e) tOrO(e) *= 1.01f;
    }
  }
}

template <class Cfg>
struct Epilogue {
  using T = Traits<Cfg>;
  using Element = typename T::Element;

  // Returns once the TMA store has finished reading shared memory, so the caller may hand
  // the O/Q buffer back to the producer. first_row: the warpgroup's first query row
  // (params.cuh, wg_first_row); row0: this thread's first row.
  template <class TOrO, class Softmax>
  __device__ static void run(const Params& p, SharedStorage<T>& ss, typename T::MmaPV& mma_pv,
                             TOrO& tOrO, const Softmax& sm,
                             const float (&inv_sum)[2],
                             const TileCoord& t, int first_row, int row0, int wg, int tid) {
    using namespace cute;
    if constexpr (kPlantBug == 3 || kPlantBug == 4 || kPlantBug == 6) {
      planted_normalize(tOrO, inv_sum, row0);  // TEST ONLY (config.cuh)
    } else {
      scale_rows(tOrO, inv_sum);
    }
    Tensor tOrO_bf16 = make_fragment_like<Element>(tOrO);
    convert_to_bf16(tOrO, tOrO_bf16);

    // Each warpgroup writes only its own 64 rows, which only its own QKs read as Q, so no
    // other warpgroup needs to be waited for before overwriting them.
    Element* o_smem = T::kSeparateO ? ss.o : ss.q;
    Tensor sO = make_tensor(make_smem_ptr(o_smem), typename T::SmemLayoutO{});
    auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma_pv);
    auto thr_copy_o = copy_o.get_thread_slice(tid);
    Tensor src = thr_copy_o.retile_S(tOrO_bf16);
    Tensor dst = thr_copy_o.partition_D(sO);
    cute::copy(copy_o, src, dst);
    fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(kWarpgroupThreads, kEpilogueBar + wg);

    if (tid % kWarpgroupThreads == 0) {
      if (first_row < p.shape.S) {
        for (int c = 0; c < T::kDBoxes; ++c)  // 64-column boxes; rows past S are clipped by TMA
          tma_store_4d<Cfg::hint_o>(&p.tma_o, o_smem + (c * T::kBlockM + wg * 64) * kBoxCols,
                                    c * kBoxCols, first_row, t.head, t.batch);
      }
      tma_store_commit();
      tma_store_wait_read();
    }

    if constexpr (Cfg::write_lse) {
      if (p.lse != nullptr && (threadIdx.x % 4) == 0) {
        float* lse = p.lse + (size_t(t.batch) * p.shape.H + t.head) * p.shape.S;
        const float scale_log2 = p.scale_log2;
        for (int r = 0; r < 2; ++r) {
          const int row = row0 + 8 * r;
          if (row < p.shape.S) lse[row] = sm.lse(r, scale_log2);
        }
      }
    }
    // Everyone in the warpgroup learns that the store has read the staged tile.
    cutlass::arch::NamedBarrier::sync(kWarpgroupThreads, kEpilogueBar + wg);
  }
};

}  // namespace fa_tune
