// Host-side task lists for the static persistent scheduler (plain C++17, no CUDA: the CPU
// tests compile it with g++).
//
// Work: every (batch, head, query tile). A causal query tile bm costs about bm + 1 KV tiles of
// QK + PV, so the cost model (the seeds') is cost(bm) = 2 * (bm + 1) + fixed_cost, fixed_cost
// standing for the per-task prologue/epilogue. Queries over more keys than queries (S_k > S_q,
// causal aligned bottom-right) visit kv_shift = (S_k - S_q) / block_m more tiles' worth per
// warpgroup row band: 2 * kv_shift more per task, whatever its bm. A sliding window of
// window_m block_m units caps a row band's KV tiles at window_m + 1 (causal), or at the keys
// from its window's start to the end (non-causal). Tasks are dealt to `num_bins` CTAs:
//   1. batch/head entries are taken in pairs; within a pair, tasks in descending bm order, each
//      to the currently lightest bin (longest-processing-time first);
//   2. a rebalance moves tasks from the heaviest to the lightest bin while that narrows the gap,
//      moving only tasks whose batch/head the lightest bin already holds (pair-preserving: no
//      bin gains K/V streams it did not already read);
//   3. where the pairs leave the heaviest bin over 1 % above what plain LPT reaches, the tasks
//      are dealt again without pairs: all of them by descending cost, each to the lightest bin,
//      then moves and swaps from the heaviest bin to the lightest or another. Queries over a
//      longer KV (chunks) make every task cost about the same, and pairs dealt one after
//      another then end a bin up to a whole task above the mean (93 % balance at 2048 queries
//      over 8192 keys; 97.8 % without pairs; prefills keep their pairs at 99.9 %);
//   4. each bin is stably ordered by batch/head, so a CTA's consecutive tasks share K/V in L2.
// Tasks are packed into 32 bits (bm | head << m_bits | batch << (m_bits + h_bits)) with widths
// sized to the shape; a shape that does not fit is refused, never truncated.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

namespace fa_tune {

struct TaskPacking {
  uint32_t m_bits = 0, h_bits = 0, b_bits = 0;

  static uint32_t bits_for(long long count) {  // bits to hold values 0 .. count-1
    uint32_t b = 0;
    while ((1LL << b) < count) ++b;
    return b;
  }
  // Empty string on success, else why the shape cannot be packed.
  std::string fit(long long num_m, long long H, long long B) {
    m_bits = bits_for(num_m);
    h_bits = bits_for(H);
    b_bits = bits_for(B);
    if (m_bits + h_bits + b_bits > 32)
      return "the task packing holds 32 bits but this shape needs " +
             std::to_string(m_bits + h_bits + b_bits) + " (query tiles " + std::to_string(num_m) +
             ", heads " + std::to_string(H) + ", batch " + std::to_string(B) +
             "); use the grid or dynamic scheduler for it";
    return "";
  }
  uint32_t pack(int bm, int h, int b) const {
    return uint32_t(bm) | (uint32_t(h) << m_bits) | (uint32_t(b) << (m_bits + h_bits));
  }
  void unpack(uint32_t t, int& bm, int& h, int& b) const {
    bm = int(t & ((1u << m_bits) - 1u));
    h = int((t >> m_bits) & ((1u << h_bits) - 1u));
    b = int(t >> (m_bits + h_bits));
  }
};

struct TaskLists {
  TaskPacking packing;
  std::vector<uint32_t> tasks;   // all bins, concatenated
  std::vector<int32_t> offsets;  // bin i owns tasks[offsets[i], offsets[i+1])
  std::vector<long long> loads;  // estimated cost per bin
};

// Warpgroup KV steps of a task plus fixed_cost. A query tile bm: two warpgroups x (bm + 1).
// A pair of tiles (K/V multicast; the task is index bm of the pairs, rows interleaved): per
// CTA one warpgroup visits 2bm + 1 KV tiles and the other 2bm + 2.
inline long long task_cost(int bm, int fixed_cost, int tiles_per_task = 1) {
  if (tiles_per_task == 2) return 4LL * bm + 3 + fixed_cost;
  return 2LL * (bm + 1) + fixed_cost;
}

struct Task {
  int bm, bh;
};

// Moves bins[from][index] to the end of bins[to], loads following.
template <class Cost>
void move_task(std::vector<std::vector<Task>>& bins, std::vector<long long>& load, int from,
               int index, int to, const Cost& cost) {
  const Task t = bins[from][index];
  bins[from].erase(bins[from].begin() + index);
  bins[to].push_back(t);
  load[from] -= cost(t.bm);
  load[to] += cost(t.bm);
}

// Longest-processing-time first over every task (no pairs), then exchanges that lower the
// heaviest bin: a move or swap with the lightest bin, else with any bin (bounded, so setup
// time stays flat).
template <class Cost>
void deal_by_cost(int num_bh, int num_m, const Cost& cost, std::vector<std::vector<Task>>& bins,
                  std::vector<long long>& load) {
  std::vector<Task> all;
  all.reserve(size_t(num_bh) * num_m);
  for (int bh = 0; bh < num_bh; ++bh)
    for (int bm = num_m - 1; bm >= 0; --bm) all.push_back({bm, bh});
  std::stable_sort(all.begin(), all.end(),
                   [&](const Task& a, const Task& b) { return cost(a.bm) > cost(b.bm); });
  const int num_bins = int(bins.size());
  for (const Task& t : all) {
    const int i = int(std::min_element(load.begin(), load.end()) - load.begin());
    bins[i].push_back(t);
    load[i] += cost(t.bm);
  }
  // An exchange moves d = cost(task a of hi) - cost(task b of j) (0 for no b) from hi to j. The
  // best makes the pair's larger load, max(load[hi] - d, load[j] + d), smallest, and it must fall
  // below load[hi]. With 3-4 tasks a bin (a chunk's: every task about the same cost) the
  // lightest bin often has none while another has (balance by this cost model, not yet timed:
  // 0.974 -> 0.978 at 2048 queries over 8192 keys, 0.970 -> 0.997 at 2x32/8x1024; docs/PERF.md
  // step 86). `checks` counts the pairs tried: the lightest bin is always tried, other bins
  // only while it is under 2^19.
  long long checks = 0;
  int hi = 0, to = -1, best_a = -1, best_b = -1;
  long long best = 0;
  auto try_bin = [&](int j) {
    if (j == hi || load[j] >= load[hi]) return;
    checks += (long long)bins[hi].size() * (bins[j].size() + 1);
    for (int a = 0; a < int(bins[hi].size()); ++a) {
      const long long ca = cost(bins[hi][a].bm);
      for (int b = -1; b < int(bins[j].size()); ++b) {
        const long long d = ca - (b < 0 ? 0 : cost(bins[j][b].bm));
        const long long larger = std::max(load[hi] - d, load[j] + d);
        if (d > 0 && larger < best) {
          best = larger;
          to = j;
          best_a = a;
          best_b = b;
        }
      }
    }
  };
  for (int iter = 0; iter < 8 * num_bins; ++iter) {
    hi = int(std::max_element(load.begin(), load.end()) - load.begin());
    to = -1;
    best = load[hi];
    try_bin(int(std::min_element(load.begin(), load.end()) - load.begin()));
    for (int j = 0; to < 0 && checks < (1LL << 19) && j < num_bins; ++j) try_bin(j);
    if (to < 0) break;
    // j's task first: its index is still valid before hi's task lands at j's end.
    if (best_b >= 0) move_task(bins, load, to, best_b, hi, cost);
    move_task(bins, load, hi, best_a, to, cost);
  }
}

// Returns an empty string on success (lists filled), else a one-line reason. num_m counts
// tasks per batch/head (query tiles, or pairs of them with tiles_per_task 2). Non-causal, every
// task visits every KV tile: all cost as the longest causal one. The last task of a batch/head
// costs last_num / last_den of that: where S leaves it short of rows, the kernel's warpgroups
// without a row in it skip it (wg_skip), and the busiest CTA's share of busy warpgroups bounds
// its time. kv_shift: (S_k - S_q) in block_m units (above; negative when causal rows see
// fewer keys than a prefill's, a task then costs at least one KV tile). window_m: the sliding
// window in block_m units (-1: none).
inline std::string build_task_lists(int B, int H, int num_m, int num_bins, int fixed_cost,
                                    TaskLists& out, int tiles_per_task = 1, bool causal = true,
                                    int last_num = 1, int last_den = 1, int kv_shift = 0,
                                    int window_m = -1) {
  if (B < 1 || H < 1 || num_m < 1 || num_bins < 1) return "B, H, query tiles and CTAs must be >= 1";
  if (last_num < 1 || last_den < last_num) return "the last task's share must be in (0, 1]";
  if (std::string why = out.packing.fit(num_m, H, B); !why.empty()) return why;
  auto cost = [&](int bm) {
    long long work = task_cost(causal ? bm : num_m - 1, 0, tiles_per_task) + 2LL * kv_shift;
    if (window_m >= 0) {  // two warpgroups, each over its window (row tiles of the task: bm x tpt)
      const long long band = causal ? window_m + 1LL
                                    : (long long)num_m * tiles_per_task - bm * tiles_per_task + window_m;
      work = std::min(work, 2 * band * tiles_per_task);
    }
    const long long c = std::max(1LL, work) + fixed_cost;
    return bm == num_m - 1 ? (c * last_num + last_den - 1) / last_den : c;
  };

  std::vector<std::vector<Task>> bins(num_bins);
  std::vector<long long> load(num_bins, 0);
  auto lightest = [&] {
    return int(std::min_element(load.begin(), load.end()) - load.begin());
  };

  // 1. Pairs of batch/head entries, tasks by descending bm, each to the lightest bin.
  const int num_bh = B * H;
  for (int first = 0; first < num_bh; first += 2) {
    const int last = std::min(first + 2, num_bh);
    for (int bm = num_m - 1; bm >= 0; --bm) {
      for (int bh = first; bh < last; ++bh) {
        const int i = lightest();
        bins[i].push_back({bm, bh});
        load[i] += cost(bm);
      }
    }
  }

  // 2. Pair-preserving rebalance: heaviest -> lightest while a move narrows the gap. LPT
  // leaves a small gap, so a few passes per bin suffice; the bound keeps setup time flat.
  std::vector<char> in_lo(num_bh);
  for (int iter = 0; iter < 4 * num_bins; ++iter) {
    const int hi = int(std::max_element(load.begin(), load.end()) - load.begin());
    const int lo = lightest();
    const long long gap = load[hi] - load[lo];
    if (gap <= 0) break;
    std::fill(in_lo.begin(), in_lo.end(), 0);
    for (const Task& x : bins[lo]) in_lo[x.bh] = 1;
    int best = -1;
    long long best_gap = gap;
    for (int t = 0; t < int(bins[hi].size()); ++t) {
      const Task& task = bins[hi][t];
      if (!in_lo[task.bh]) continue;
      const long long c = cost(task.bm);
      const long long new_gap = std::llabs((load[hi] - c) - (load[lo] + c));
      if (new_gap < best_gap) {
        best_gap = new_gap;
        best = t;
      }
    }
    if (best < 0) break;
    move_task(bins, load, hi, best, lo, cost);
  }

  // 3. Without pairs, when that is over 1 % lighter at the heaviest bin. Never where the pairs
  // are within 1 % of the mean already (most prefills: many tasks a bin, so the exchanges'
  // search, tasks in one bin times tasks in the other, would be long for nothing).
  const long long paired = *std::max_element(load.begin(), load.end());
  if (100 * paired * num_bins > 101 * std::accumulate(load.begin(), load.end(), 0LL)) {
    std::vector<std::vector<Task>> free_bins(num_bins);
    std::vector<long long> free_load(num_bins, 0);
    deal_by_cost(num_bh, num_m, cost, free_bins, free_load);
    const long long unpaired = *std::max_element(free_load.begin(), free_load.end());
    if (100 * unpaired < 99 * paired) {
      bins.swap(free_bins);
      load.swap(free_load);
    }
  }

  // 4. Stable order by batch/head inside each bin; pack.
  out.tasks.clear();
  out.offsets.assign(1, 0);
  for (auto& bin : bins) {
    std::stable_sort(bin.begin(), bin.end(), [](const Task& a, const Task& b) { return a.bh < b.bh; });
    for (const Task& t : bin) out.tasks.push_back(out.packing.pack(t.bm, t.bh % H, t.bh / H));
    out.offsets.push_back(int32_t(out.tasks.size()));
  }
  out.loads = load;
  return "";
}

}  // namespace fa_tune
