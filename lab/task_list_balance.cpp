// The static scheduler's task lists by their own cost model (cuda_src/fa_tune/task_list.h):
// the mean CTA load over the heaviest CTA's, per shape (docs/PERF.md step 63).
//   g++ -std=c++17 -O1 -I cuda_src lab/task_list_balance.cpp -o /tmp/tlb && /tmp/tlb
// Build it against another tree's header (-I OTHER/cuda_src) for the before column.
#include <cstdio>

#include "fa_tune/task_list.h"

int main() {
  // name, B, heads per task list (H / head_cluster), Sq, Sk, block_m, lists (SMs / cluster),
  // fixed_cost, query tiles per task (2: K/V multicast pairs)
  struct Row {
    const char* name;
    int B, H, Sq, Sk, block_m, lists, fixed_cost, tiles_per_task;
  };
  const Row rows[] = {
      {"llama3 1x32/8x2048:k8192", 1, 16, 2048, 8192, 128, 66, 9, 1},
      {"llama3 4x32/8x1024:k4096", 4, 16, 1024, 4096, 128, 66, 9, 1},
      {"llama3 1x32/8x512:k16384", 1, 16, 512, 16384, 128, 66, 9, 1},
      {"llama3 1x32/8x2048", 1, 16, 2048, 2048, 128, 66, 9, 1},
      {"llama3 1x32/8x1024", 1, 16, 1024, 1024, 128, 66, 9, 1},
      {"llama3 2x32/8x1024", 2, 16, 1024, 1024, 128, 66, 9, 1},
      {"llama3 1x32/8x8192", 1, 16, 8192, 8192, 128, 66, 9, 1},
      {"llama3 4x32/8x4096", 4, 16, 4096, 4096, 128, 66, 9, 1},
      {"static 1x32/8x2048:k8192", 1, 32, 2048, 8192, 128, 132, 4, 1},
      {"static 4x32x8192", 4, 32, 8192, 8192, 128, 132, 4, 1},
      {"multicast 4x32x8192", 4, 32, 8192, 8192, 128, 66, 4, 2},
  };
  for (const Row& r : rows) {
    const int tile = r.block_m * r.tiles_per_task;
    const int num_m = (r.Sq + tile - 1) / tile, off = r.Sk - r.Sq;
    const int shift = (off + r.block_m / 2) / r.block_m;  // scheduler.cuh's kv_shift
    fa_tune::TaskLists lists;
    const std::string why = fa_tune::build_task_lists(r.B, r.H, num_m, r.lists, r.fixed_cost,
                                                      lists, r.tiles_per_task, true, 1, 1, shift);
    long long heaviest = 0, total = 0;
    for (long long load : lists.loads) {
      heaviest = load > heaviest ? load : heaviest;
      total += load;
    }
    std::printf("%-28s %5zu tasks  balance %.3f %s\n", r.name, lists.tasks.size(),
                double(total) / r.lists / double(heaviest), why.c_str());
  }
  return 0;
}
