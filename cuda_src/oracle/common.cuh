// fa-tune oracle: the ABI's version and constants, the stats record (mirrored by
// tuner/measure/gate_rule.py), the input streams' hashing and the BF16 helpers.
// Part of cuda_src/oracle.cu's one translation unit (its header comment documents the C ABI,
// the input streams and the "rising" construction); included there only, in this order:
// common, generators, reference, compare.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define ORACLE_API extern "C" __attribute__((visibility("default")))

// 9: oracle_gen_rising takes cu_seqlens_k, num_seqs: a packed batch's trend per sequence.
// 8: the models' masks (window, softcap, sinks) in every reference; oracle_fill_uniform_f32.
// 7: oracle_reference_bf16 / _varlen (FlashAttention's BF16-math reference, the error ratios).
// 6: oracle_copy_bf16_4d (inputs mirrored into strided layouts).
// 5: separate query and key lengths (Sq <= Sk, bottom-right causal), cu_seqlens_q / _k.
// 4: oracle_reference_varlen
#define ORACLE_ABI_VERSION 9
#define ORACLE_ROW_BLOCK 16
#define ORACLE_POISON_BF16 0x7FBFu
#define ORACLE_POISON_F32 0x7FBADBADu

// Layout mirrored by tuner/measure/oracle.py (_STATS_DTYPE); 19 x 8 bytes, no padding.
struct OracleStats {
    unsigned long long o_count;
    unsigned long long o_violations;
    unsigned long long o_nonfinite;       // computed NaN/Inf (poison excluded)
    unsigned long long o_unwritten;       // poison pattern still there
    unsigned long long o_first_violation; // lowest flat index, ~0ull if none
    unsigned long long o_ref_nonfinite;   // must be 0: the reference itself is broken otherwise
    unsigned long long o_max_abs_err_bits;  // float bits (low 32) of max |err| over finite o
    unsigned long long o_block_rows;      // ORACLE_ROW_BLOCK (the budget blocks' height)
    double o_sum_sq_err;
    double o_sum_sq_ref;
    double o_sum_sq_bf16;                 // sum (bf16_rn(ref) - ref)^2 where err is summed
    unsigned long long l_count;
    unsigned long long l_violations;
    unsigned long long l_nonfinite;
    unsigned long long l_unwritten;
    unsigned long long l_first_violation;
    unsigned long long l_ref_nonfinite;
    unsigned long long l_max_abs_err_bits;
    unsigned long long l_reserved;
};
static_assert(sizeof(OracleStats) == 152, "OracleStats layout changed: update tuner/measure/oracle.py");

namespace {

// Input streams (documented above; the NumPy twin uses the same numbers).
constexpr unsigned long long kStreamQ = 1, kStreamK = 2, kStreamV = 3;
constexpr unsigned long long kStreamRisingQ = 11, kStreamRisingK = 12, kStreamRisingV = 13;
constexpr unsigned long long kStreamRisingC2 = 14, kStreamRisingJit = 15;

#define ORACLE_CHECK(expr)                          \
    do {                                            \
        cudaError_t e_ = (expr);                    \
        if (e_ != cudaSuccess) return (int)e_;      \
    } while (0)

__host__ __device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__device__ __forceinline__ uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t idx) {
    return splitmix64(splitmix64(seed ^ (stream * 0xD1B54A32D192ED03ull)) ^ idx);
}

__device__ __forceinline__ float uniform01(uint64_t seed, uint64_t stream, uint64_t idx) {
    const uint64_t h = hash3(seed, stream, idx);
    return (float)(uint32_t)(h >> 40) * 0x1p-24f;  // exact: 24-bit integer times 2^-24
}

__device__ __forceinline__ float uniform_in(uint64_t seed, uint64_t stream, uint64_t idx,
                                            float lo, float hi) {
    // Explicitly rounded ops: nvcc must not contract this into an FMA, or the NumPy twin
    // (separately rounded float32 ops) would differ in the last bit.
    return __fadd_rn(lo, __fmul_rn(__fsub_rn(hi, lo), uniform01(seed, stream, idx)));
}

__device__ __forceinline__ __nv_bfloat16 to_bf16(float x) { return __float2bfloat16_rn(x); }

__device__ __forceinline__ float bf16_round(float x) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

int grid_for(long long n, int threads) {
    long long blocks = (n + threads - 1) / threads;
    if (blocks > 8192) blocks = 8192;  // grid-stride loops cover the rest
    if (blocks < 1) blocks = 1;
    return (int)blocks;
}

}  // namespace
