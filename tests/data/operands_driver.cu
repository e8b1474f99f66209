// Host-side check of the kernel's hand-written operand mappings against CuTe's, which the kernel
// used before (CuTe's layout algebra runs on the host too):
//   stsm   O's accumulator staged with stmatrix.x4 (o_stage.cuh; Epilogue::stage_o);
//   ldsm   Q loaded into the QK's A registers with ldmatrix.x4 (q_in_regs; the same addresses);
//   desc   the shared-memory descriptors of Q, K (K-major) and V^T (MN-major) per k-block and
//          stage (operands.cuh), against CuTe's partition_fragment_A/B descriptors.
// stmatrix/ldmatrix are replayed with their semantics (lane l gives the address of row l%8 of
// matrix l/8; register m of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of matrix m).
// Prints one line per case: "ok <what> BM BN D" or "FAIL <what> BM BN D: <why>".
#include <cute/tensor.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cutlass/numeric_types.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "fa_tune/o_stage.cuh"
#include "fa_tune/operands.cuh"

using namespace cute;
using Element = cutlass::bfloat16_t;
using RC = std::pair<int, int>;

static bool g_ok = true;
static bool fail(const char* what, int BM, int BN, int D, const char* why, long a, long b) {
  std::printf("FAIL %s %d %d %d: %s (%ld, %ld)\n", what, BM, BN, D, why, a, b);
  g_ok = false;
  return false;
}

// One 8x8 x4 instruction of one warp. addr[l]: element offset lane l gives; regs[l][m][h]: the
// fragment index of half h of register m of lane l. Calls put(lane, fragment index, offset)
// for the 256 elements: the register side of each (stmatrix: the value stored at offset;
// ldmatrix: the value loaded from it).
template <class Put>
static void replay_x4(const long (&addr)[32], const int (&regs)[32][4][2], Put&& put) {
  for (int m = 0; m < 4; ++m)
    for (int j = 0; j < 8; ++j)
      for (int c = 0; c < 8; ++c) {
        const int lane = 4 * j + c / 2;
        put(lane, regs[lane][m][c % 2], addr[8 * m + j] + c);
      }
}

template <int BM, int BN, int D, int kStages>
struct Case {
  using AtomLayout = Layout<Shape<Int<BM / 64>, _1, _1>>;
  using QKAtomSS = decltype(GMMA::ss_op_selector<Element, Element, float,
                                                 Shape<_64, Int<BN>, _16>>());
  using QKAtomRS = decltype(GMMA::rs_op_selector<Element, Element, float,
                                                 Shape<_64, Int<BN>, _16>>());
  using MmaQK = decltype(make_tiled_mma(QKAtomSS{}, AtomLayout{}));
  using MmaQKRegs = decltype(make_tiled_mma(QKAtomRS{}, AtomLayout{}));
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<D>, Int<BN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayout{}));
  using Atom = GMMA::Layout_K_SW128_Atom<Element>;
  using LayoutQ = decltype(tile_to_shape(Atom{}, Shape<Int<BM>, Int<D>>{}));
  using LayoutK = decltype(tile_to_shape(Atom{}, Shape<Int<BN>, Int<D>, Int<kStages>>{}));
  using LayoutVt = decltype(composition(
      LayoutK{}, make_ordered_layout(Shape<Int<D>, Int<BN>, Int<kStages>>{}, Step<_2, _1, _3>{})));
  static constexpr int kThreads = BM / 64 * 128;

  Element* buf = static_cast<Element*>(std::aligned_alloc(1024, sizeof(Element) * BM * D));
  Element* kbuf = static_cast<Element*>(std::aligned_alloc(1024, sizeof(Element) * BN * D * kStages));
  ~Case() { std::free(buf); std::free(kbuf); }

  // The O / Q tile: element offset -> (row, col), and back.
  std::map<long, RC> where;
  std::map<RC, long> offset;
  void index_tile() {
    Tensor s = make_tensor(make_smem_ptr(buf), LayoutQ{});
    for (int r = 0; r < BM; ++r)
      for (int c = 0; c < D; ++c) {
        const long off = long(&s(r, c) - buf);
        where[off] = {r, c};
        offset[{r, c}] = off;
      }
  }

  template <class Mma, class Part>
  static std::vector<std::vector<RC>> coords(const Mma& mma, Part part, int rows, int cols) {
    std::vector<std::vector<RC>> out(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      Tensor c = part(mma.get_thread_slice(t), make_identity_tensor(make_shape(rows, cols)));
      for (int e = 0; e < size(c); ++e) out[t].push_back({int(get<0>(c(e))), int(get<1>(c(e)))});
    }
    return out;
  }

  // stmatrix: every accumulator element of O lands where the tile keeps (row, col).
  // The hand-written path of both copies: per 16-column block k, one x4 instruction at the
  // O stage's (= Q's) address of thread tid, its 8 values in register order.
  static void by_hand(int tid, std::vector<long>& addr, std::vector<int>& idx) {
    for (int k = 0; k < D / 16; ++k) {
      addr.push_back(fa_tune::OStage(tid).offset(k, BM) / 2);
      for (int v = 0; v < 8; ++v) idx.push_back(8 * k + v);
    }
  }

  void stsm() {
    MmaPV mma;
    auto acc = coords(mma, [](auto thr, auto id) { return thr.partition_C(id); }, BM, D);
    Tensor sO = make_tensor(make_smem_ptr(buf), LayoutQ{});
    auto copy_o = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, mma);
    for (int hand = 0; hand < 2; ++hand) {
      std::map<long, RC> stored;
      for (int warp = 0; warp < kThreads / 32; ++warp) {
        std::vector<std::vector<long>> addr(32);
        std::vector<std::vector<int>> idx(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int tid = warp * 32 + lane;
          if (hand) {
            by_hand(tid, addr[lane], idx[lane]);
          } else {
            Tensor frag = make_fragment_like<Element>(partition_fragment_C(mma, Shape<Int<BM>, Int<D>>{}));
            auto thr = copy_o.get_thread_slice(tid);
            Tensor src = thr.retile_S(frag);
            Tensor dst = thr.partition_D(sO);
            for (int i = 0; i < size(dst) / 8; ++i) {  // one instruction per 8 values
              addr[lane].push_back(long(&dst(8 * i) - buf));
              for (int v = 0; v < 8; ++v) idx[lane].push_back(int(&src(8 * i + v) - &frag(0)));
            }
          }
        }
        for (size_t i = 0; i < addr[0].size(); ++i) {
          long a[32];
          int regs[32][4][2];
          for (int l = 0; l < 32; ++l) {
            a[l] = addr[l][i];
            for (int v = 0; v < 8; ++v) regs[l][v / 2][v % 2] = idx[l][8 * i + v];
          }
          replay_x4(a, regs, [&](int lane, int e, long off) {
            stored[off] = acc[warp * 32 + lane][e];
          });
        }
      }
      const char* what = hand ? "stsm" : "stsm-cute";
      if (long(stored.size()) != long(BM) * D) {
        fail(what, BM, BN, D, "elements written", long(stored.size()), long(BM) * D);
        continue;
      }
      bool ok = true;
      for (auto& [off, rc] : stored)
        if (where[off] != rc) { ok = fail(what, BM, BN, D, "misplaced at", off, offset[rc]); break; }
      if (ok) std::printf("ok %s %d %d %d\n", what, BM, BN, D);
    }
  }

  // ldmatrix (q_in_regs): every A register of the QK gets the Q element the MMA expects there.
  void ldsm() {
    MmaQKRegs mma;
    auto want = coords(mma, [](auto thr, auto id) { return thr.partition_A(id); }, BM, D);
    Tensor sQ = make_tensor(make_smem_ptr(buf), LayoutQ{});
    auto s2r = make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, Element>{}, mma);
    for (int hand = 0; hand < 2; ++hand) {
      bool ok = true;
      for (int warp = 0; warp < kThreads / 32 && ok; ++warp) {
        std::vector<std::vector<long>> addr(32);
        std::vector<std::vector<int>> idx(32);
        for (int lane = 0; lane < 32; ++lane) {
          const int tid = warp * 32 + lane;
          if (hand) {
            by_hand(tid, addr[lane], idx[lane]);
          } else {
            Tensor frag = mma.get_thread_slice(tid).partition_fragment_A(sQ);
            auto thr = s2r.get_thread_slice(tid);
            Tensor src = thr.partition_S(sQ);
            Tensor dst = thr.retile_D(frag);
            for (int i = 0; i < size(src) / 8; ++i) {
              addr[lane].push_back(long(&src(8 * i) - buf));
              for (int v = 0; v < 8; ++v) idx[lane].push_back(int(&dst(8 * i + v) - &frag(0)));
            }
          }
        }
        std::map<std::pair<int, int>, RC> loaded;  // (lane, fragment index) -> element
        for (size_t i = 0; i < addr[0].size(); ++i) {
          long a[32];
          int regs[32][4][2];
          for (int l = 0; l < 32; ++l) {
            a[l] = addr[l][i];
            for (int v = 0; v < 8; ++v) regs[l][v / 2][v % 2] = idx[l][8 * i + v];
          }
          replay_x4(a, regs, [&](int lane, int e, long off) { loaded[{lane, e}] = where[off]; });
        }
        for (int lane = 0; lane < 32 && ok; ++lane)
          for (int e = 0; e < D / 2 && ok; ++e) {
            auto it = loaded.find({lane, e});
            if (it == loaded.end() || it->second != want[warp * 32 + lane][e])
              ok = fail(hand ? "ldsm" : "ldsm-cute", BM, BN, D, "wrong register", lane, e);
          }
      }
      if (ok) std::printf("ok %s %d %d %d\n", hand ? "ldsm" : "ldsm-cute", BM, BN, D);
    }
  }

  // Descriptors. CuTe's start address is 0 on the host (it reads it with cvta), so the thread's
  // operand base is compared as the partition's element offset, and the k-block and stage steps
  // as the fragment's descriptor differences.
  void desc() {
    using fa_tune::GmmaDesc;
    MmaQK qk;
    MmaPV pv;
    Tensor sQ = make_tensor(make_smem_ptr(buf), LayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(kbuf), LayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(kbuf), LayoutVt{});
    bool ok = true;
    for (int wg = 0; wg < BM / 64 && ok; ++wg) {
      const int tid = wg * 128 + 37;  // any thread of the warpgroup
      auto tq = qk.get_thread_slice(tid);
      auto tv = pv.get_thread_slice(tid);
      Tensor fq = tq.partition_fragment_A(sQ);
      Tensor fk = tq.partition_fragment_B(sK);
      Tensor fv = tv.partition_fragment_B(sVt);
      // Q: this warpgroup's rows, then k-blocks.
      const long q_base = long(&tq.partition_A(sQ)(0) - buf) * 2;
      if (q_base != wg * 64 * 128) ok = fail("desc-q", BM, BN, D, "base", q_base, wg * 8192);
      const GmmaDesc q = fa_tune::k_major_desc(0);
      for (int k = 0; k < D / 16 && ok; ++k) {
        const uint64_t c = fq(0, 0, k).desc_;
        const uint64_t h = (q + fa_tune::k_major_kblock(k, BM)).bits();
        if (c != h) ok = fail("desc-q", BM, BN, D, "k-block", k, long(c ^ h));
      }
      const long k_base = long(&tq.partition_B(sK)(0) - kbuf);
      const long v_base = long(&tv.partition_B(sVt)(0) - kbuf);
      if (k_base != 0 || v_base != 0) ok = fail("desc-kv", BM, BN, D, "base", k_base, v_base);
      const GmmaDesc kd = fa_tune::k_major_desc(0);
      const GmmaDesc vd = fa_tune::mn_major_desc(0, BN, D);
      for (int s = 0; s < kStages && ok; ++s) {
        const uint32_t stage = uint32_t(s) * BN * D / 8;  // 16-byte units
        for (int k = 0; k < D / 16 && ok; ++k) {
          const uint64_t c = fk(0, 0, k, s).desc_;
          const uint64_t h = (kd + stage + fa_tune::k_major_kblock(k, BN)).bits();
          if (c != h) ok = fail("desc-k", BM, BN, D, "k-block, stage", k, s);
        }
        for (int k = 0; k < BN / 16 && ok; ++k) {
          const uint64_t c = fv(0, 0, k, s).desc_;
          const uint64_t h = (vd + stage + fa_tune::mn_major_kblock(k)).bits();
          if (c != h) {
            std::printf("  cute %016llx hand %016llx\n", (unsigned long long)c, (unsigned long long)h);
            ok = fail("desc-v", BM, BN, D, "k-block, stage", k, s);
          }
        }
      }
    }
    if (ok) std::printf("ok desc %d %d %d\n", BM, BN, D);
  }

  void run() {
    index_tile();
    stsm();
    ldsm();
    desc();
  }
};

int main() {
  // Every block_m (1-3 consumer warpgroups) and head dim (1, 2, 4 swizzle atoms), a block_n
  // that is not a multiple of 64, and three stages.
  Case<64, 128, 128, 2>().run();
  Case<128, 96, 64, 2>().run();
  Case<128, 128, 256, 2>().run();
  Case<192, 64, 128, 3>().run();
  return g_ok ? 0 : 1;
}
