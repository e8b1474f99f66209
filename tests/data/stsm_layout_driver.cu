// Host-side check of the epilogue's hand-written stmatrix mapping (cuda_src/fa_tune/o_stage.cuh,
// used by Epilogue::stage_o) against CuTe's STSM tiled copy of the same accumulator, which the kernel
// used before. Both are replayed with stmatrix.x4's semantics (lane l gives the address of row
// l%8 of matrix l/8; register m of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix m)
// and must put every accumulator element (row, col) at SmemLayoutO(row, col).
// Prints one line per (block_m, head dim): "ok BM D" or "FAIL BM D <what>".
#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cutlass/numeric_types.h>

#include "fa_tune/o_stage.cuh"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

using namespace cute;
using Element = cutlass::bfloat16_t;

struct Store {  // one element of one stmatrix: where it lands, and which accumulator value
  long offset;
  int row, col;
};

// The hardware's placement: lane l's registers (pairs of flat fragment indices) and address per
// matrix, for one instruction of one warp -> stores.
static void replay(const int (&flat)[32][4][2], const long (&addr)[32],
                   const std::vector<std::vector<std::pair<int, int>>>& coords, int warp,
                   std::vector<Store>& out) {
  for (int m = 0; m < 4; ++m)
    for (int j = 0; j < 8; ++j)
      for (int c = 0; c < 8; ++c) {
        const int src_lane = 4 * j + c / 2;
        const int e = flat[src_lane][m][c % 2];
        const auto rc = coords[warp * 32 + src_lane][e];
        out.push_back({addr[8 * m + j] + c, rc.first, rc.second});
      }
}

template <class Expected>
static bool check(const char* what, int BM, int D, const std::vector<Store>& stores,
                  const Expected& expected) {
  std::map<long, int> seen;
  for (const Store& s : stores) {
    if (s.offset != expected(s.row, s.col)) {
      std::printf("FAIL %d %d %s: (%d, %d) at %ld, expected %ld\n", BM, D, what, s.row, s.col,
                  s.offset, expected(s.row, s.col));
      return false;
    }
    if (++seen[s.offset] > 1) {
      std::printf("FAIL %d %d %s: offset %ld written twice\n", BM, D, what, s.offset);
      return false;
    }
  }
  if (long(seen.size()) != long(BM) * D) {
    std::printf("FAIL %d %d %s: %zu of %d elements written\n", BM, D, what, seen.size(), BM * D);
    return false;
  }
  return true;
}

template <int BM, int D>
struct Case {
  using AtomLayout = Layout<Shape<Int<BM / 64>, _1, _1>>;
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<D>, _128>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayout{}));
  using SmemLayoutO = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                                             Shape<Int<BM>, Int<D>>{}));

  static bool run() {
    constexpr int kThreads = BM / 64 * 128;
    MmaPV mma;
    // Each thread's accumulator values as (row, col), in the fragment's flat order.
    std::vector<std::vector<std::pair<int, int>>> coords(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      Tensor c = mma.get_thread_slice(t).partition_C(make_identity_tensor(Shape<Int<BM>, Int<D>>{}));
      for (int e = 0; e < size(c); ++e) coords[t].push_back({int(get<0>(c(e))), int(get<1>(c(e)))});
    }
    // CuTe's tiled copy: a 1024-aligned buffer so the swizzled pointer's bits are the offset's.
    auto* buf = static_cast<Element*>(std::aligned_alloc(1024, sizeof(Element) * BM * D));
    Tensor sO = make_tensor(make_smem_ptr(buf), SmemLayoutO{});
    auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
    std::vector<Store> cute_stores, hand_stores;
    for (int warp = 0; warp < kThreads / 32; ++warp) {
      std::vector<std::vector<int>> cute_flat(32);  // per lane, per instruction: 8 flat indices
      std::vector<std::vector<long>> cute_addr(32);
      int n_instr = 0;
      for (int lane = 0; lane < 32; ++lane) {
        const int tid = warp * 32 + lane;
        Tensor frag = make_fragment_like<Element>(partition_fragment_C(mma, Shape<Int<BM>, Int<D>>{}));
        for (int e = 0; e < size(frag); ++e) frag(e) = Element(float(e));  // exact below 256
        auto thr = copy_o.get_thread_slice(tid);
        Tensor src = thr.retile_S(frag);
        Tensor dst = thr.partition_D(sO);
        // One stmatrix.x4 per 8 values: the atom's 8 come first in the flat order, then
        // its repetitions (mode 0 is (atom, repeats); the other modes have size 1).
        static_assert(decltype(size(src))::value == decltype(size(dst))::value);
        n_instr = size(dst) / 8;
        for (int i = 0; i < n_instr; ++i) {
          for (int v = 0; v < 8; ++v) cute_flat[lane].push_back(int(float(src(8 * i + v))));
          cute_addr[lane].push_back(long(&dst(8 * i) - buf));
        }
      }
      for (int i = 0; i < n_instr; ++i) {
        int flat[32][4][2];
        long addr[32];
        for (int lane = 0; lane < 32; ++lane) {
          for (int v = 0; v < 8; ++v) flat[lane][v / 2][v % 2] = cute_flat[lane][8 * i + v];
          addr[lane] = cute_addr[lane][i];
        }
        replay(flat, addr, coords, warp, cute_stores);
      }
      // stage_o's mapping (o_stage.cuh; byte offsets / 2 = element offsets).
      for (int k = 0; k < D / 16; ++k) {
        int flat[32][4][2];
        long addr[32];
        for (int lane = 0; lane < 32; ++lane) {
          const int tid = warp * 32 + lane;
          for (int m = 0; m < 4; ++m)
            for (int h = 0; h < 2; ++h) flat[lane][m][h] = 2 * (4 * k + m) + h;
          const long bytes = fa_tune::OStage(tid).offset(k, BM);
          addr[lane] = bytes / 2;
        }
        replay(flat, addr, coords, warp, hand_stores);
      }
    }
    // Where (row, col) lives: the swizzled tensor's own address (the layout alone leaves the
    // swizzle to the shared-memory pointer).
    auto expected = [&](int r, int c) { return long(&sO(r, c) - buf); };
    const bool ok = check("cute", BM, D, cute_stores, expected) &&
                    check("stage_o", BM, D, hand_stores, expected);
    std::free(buf);
    if (ok) std::printf("ok %d %d\n", BM, D);
    return ok;
  }
};

int main() {
  // Every block_m (consumer warpgroups 1-3) and head dim (1, 2 and 4 swizzle atoms) once.
  bool ok = true;
  ok &= Case<64, 128>::run();
  ok &= Case<128, 64>::run();
  ok &= Case<128, 256>::run();
  ok &= Case<192, 128>::run();
  return ok ? 0 : 1;
}
