// A stand-in for templates/fa_fwd_sm90.cu: the knobs' members, the config JSON, and one
// wgmma so the SASS check has an HGMMA to find. Self-contained (own enums) on purpose.
#include <cstdint>

namespace fa_tune {
enum class CacheHint { None, EvictFirst, EvictLast, EvictNormal };
enum class KRelease { AfterQk, AfterMax, AfterSoftmax };
enum class VRelease { AfterPv, Deferred };
enum class QRelease { AfterLastQk, AtEnd };
enum class RescaleO { AfterPv, BeforePv };
enum class TileOrder { LongestFirst, Natural };
enum class Scheduler { Grid, Static, Dynamic };
enum class SoftcapTanh { Exact, Approx };
}  // namespace fa_tune

struct Config {
${config_members}
};

// A literal $$ in the template (e.g. a PTX label) is written $$$$.
static const char* kDollar = "$$";

__global__ void tiny_kernel(float* out, uint64_t da, uint64_t db) {
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "l"(da), "l"(db), "r"(0));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  const int i = threadIdx.x * 4;
  out[i] = d0 * Config::block_m;
  out[i + 1] = d1 * Config::block_n;
  out[i + 2] = d2 * (Config::write_lse ? 1.f : 2.f);
  out[i + 3] = d3;
}

// Kernel libraries build with -fvisibility=hidden: the C ABI is exported explicitly.
#define API __attribute__((visibility("default")))
extern "C" API const char* fa_tune_config_json(void) { return ${config_json}; }
extern "C" API int tiny_block_m(void) { return Config::block_m; }
extern "C" API const char* tiny_dollar(void) { return kDollar; }
