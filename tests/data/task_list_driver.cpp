// Test driver for cuda_src/fa_tune/task_list.h (host-only): prints the static scheduler's
// task lists so tests/test_task_list.py can check them.
// usage: task_list_driver B H num_m num_bins fixed_cost [tiles_per_task [causal [last_num
//        last_den [kv_shift [window_m]]]]]
// output: "ERROR <reason>" or, per bin, "bin <i> <load> <bm>,<h>,<b> ..." (unpacked tasks)
#include <cstdio>
#include <cstdlib>

#include "fa_tune/task_list.h"

int main(int argc, char** argv) {
  if (argc < 6 || argc > 12 || argc == 9) {
    std::fprintf(stderr,
                 "usage: %s B H num_m num_bins fixed_cost [tiles_per_task [causal [last_num "
                 "last_den [kv_shift [window_m]]]]]\n",
                 argv[0]);
    return 2;
  }
  const int B = std::atoi(argv[1]), H = std::atoi(argv[2]), num_m = std::atoi(argv[3]);
  const int bins = std::atoi(argv[4]), fixed = std::atoi(argv[5]);
  const int per_task = argc >= 7 ? std::atoi(argv[6]) : 1;
  const bool causal = argc >= 8 ? std::atoi(argv[7]) != 0 : true;
  const int last_num = argc >= 10 ? std::atoi(argv[8]) : 1;
  const int last_den = argc >= 10 ? std::atoi(argv[9]) : 1;
  const int kv_shift = argc >= 11 ? std::atoi(argv[10]) : 0;
  const int window_m = argc == 12 ? std::atoi(argv[11]) : -1;
  fa_tune::TaskLists lists;
  const std::string why = fa_tune::build_task_lists(B, H, num_m, bins, fixed, lists, per_task,
                                                    causal, last_num, last_den, kv_shift,
                                                    window_m);
  if (!why.empty()) {
    std::printf("ERROR %s\n", why.c_str());
    return 0;
  }
  for (int i = 0; i < bins; ++i) {
    std::printf("bin %d %lld", i, lists.loads[i]);
    for (int t = lists.offsets[i]; t < lists.offsets[i + 1]; ++t) {
      int bm, h, b;
      lists.packing.unpack(lists.tasks[t], bm, h, b);
      std::printf(" %d,%d,%d", bm, h, b);
    }
    std::printf("\n");
  }
  return 0;
}
