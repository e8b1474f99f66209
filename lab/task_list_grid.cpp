// Two versions of the static scheduler's task lists (cuda_src/fa_tune/task_list.h) over a grid
// of 1400 shapes, by their own cost model: how many shapes each deal balances better (the mean
// CTA load over the heaviest CTA's), and the extra host time a deal takes (docs/PERF.md step 86).
//   git show REV:cuda_src/fa_tune/task_list.h > /tmp/before_task_list.h
//   g++ -std=c++17 -O2 -DBEFORE='"/tmp/before_task_list.h"' \
//       -DAFTER='"../cuda_src/fa_tune/task_list.h"' lab/task_list_grid.cpp -o /tmp/tlg && /tmp/tlg
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

namespace before {
#include BEFORE
}
namespace after {
#include AFTER
}

template <class Lists, class Build>
static double deal(Build build, int B, int H, int num_m, int bins, int shift, double& ms) {
  Lists lists;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string why = build(B, H, num_m, bins, 9, lists, 1, true, 1, 1, shift, -1);
  ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!why.empty()) return -1;
  long long heaviest = 0, total = 0;
  for (long long load : lists.loads) {
    heaviest = std::max(heaviest, load);
    total += load;
  }
  return double(total) / bins / double(heaviest);
}

int main() {
  int shapes = 0, better = 0, worse = 0;
  double best_gain = 0, worst_extra_ms = 0;
  for (int B : {1, 2, 4, 8, 16})
    for (int H : {8, 16, 32, 64, 128})  // heads a list holds (H / head_cluster)
      for (int Sq : {256, 512, 1024, 2048, 4096, 8192, 16384})
        for (int off : {0, 1024, 4096, 8192})  // S_k - S_q
          for (int bins : {66, 132}) {
            double ms_a = 0, ms_b = 0;
            const double a = deal<before::fa_tune::TaskLists>(before::fa_tune::build_task_lists,
                                                              B, H, Sq / 128, bins, off / 128, ms_a);
            const double b = deal<after::fa_tune::TaskLists>(after::fa_tune::build_task_lists,
                                                             B, H, Sq / 128, bins, off / 128, ms_b);
            if (a < 0 || b < 0) continue;
            ++shapes;
            if (b > a + 1e-4) {
              ++better;
              if (b - a > best_gain) {
                best_gain = b - a;
                std::printf("B%d H%d Sq%d Sk%d lists %d: %.4f -> %.4f\n", B, H, Sq, Sq + off,
                            bins, a, b);
              }
            }
            if (b < a - 1e-4) {
              ++worse;
              std::printf("WORSE B%d H%d Sq%d Sk%d lists %d: %.4f -> %.4f\n", B, H, Sq, Sq + off,
                          bins, a, b);
            }
            worst_extra_ms = std::max(worst_extra_ms, ms_b - ms_a);
          }
  std::printf("%d shapes: %d better (most %.4f), %d worse; host time at most %.2f ms more\n",
              shapes, better, best_gain, worse, worst_extra_ms);
  return 0;
}
