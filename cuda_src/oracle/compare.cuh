// fa-tune oracle: the comparison of a kernel's O and LSE with the reference, into OracleStats.
// Part of cuda_src/oracle.cu's one translation unit (its header comment documents the C ABI,
// the input streams and the "rising" construction); included there only, in this order:
// common, generators, reference, compare.
#pragma once

namespace {

struct LocalStats {
    unsigned long long count, violations, nonfinite, unwritten, first, ref_nonfinite;
    float max_err;
    double sum_sq_err, sum_sq_ref, sum_sq_bf16;
};

__device__ __forceinline__ void init_local(LocalStats& s) {
    s.count = s.violations = s.nonfinite = s.unwritten = s.ref_nonfinite = 0;
    s.first = ~0ull;
    s.max_err = 0.f;
    s.sum_sq_err = s.sum_sq_ref = s.sum_sq_bf16 = 0.0;
}

// One element. `poisoned`: the raw bits are the poison pattern; `x`: the value as FP32.
// Returns whether it feeds the error sums (finite value, finite reference); then *err2 and
// *bf16_2 hold err^2 and (bf16_rn(ref) - ref)^2.
__device__ __forceinline__ bool account(LocalStats& s, long long i, bool poisoned, float x,
                                        float ref, float atol, float rtol, float* err2 = nullptr,
                                        float* bf16_2 = nullptr) {
    s.count += 1;
    bool ok = true, summed = false;
    if (!isfinite(ref)) {
        s.ref_nonfinite += 1;
        ok = false;
    } else {
        s.sum_sq_ref += (double)ref * (double)ref;
    }
    if (poisoned) {
        s.unwritten += 1;
        ok = false;
    } else if (!isfinite(x)) {
        s.nonfinite += 1;
        ok = false;
    } else if (isfinite(ref)) {
        const float err = fabsf(x - ref);
        s.max_err = fmaxf(s.max_err, err);
        s.sum_sq_err += (double)err * (double)err;
        if (err2 != nullptr) {
            const float rb = bf16_round(ref) - ref;  // exact: ref and bf16(ref) share a binade
            s.sum_sq_bf16 += (double)rb * (double)rb;
            *err2 = err * err;
            *bf16_2 = rb * rb;
        }
        summed = true;
        if (!(err <= atol + rtol * fabsf(ref))) ok = false;
    }
    if (!ok) {
        s.violations += 1;
        if ((unsigned long long)i < s.first) s.first = (unsigned long long)i;
    }
    return summed;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

// Block-reduce LocalStats and fold it into the global fields with one set of atomics per block.
// g: the 8 consecutive u64 fields (count .. block_rows/reserved) of O or of LSE; sums: O's
// three doubles (sum_sq_err, sum_sq_ref, sum_sq_bf16), or nullptr for LSE.
__device__ void flush(LocalStats& s, unsigned long long* g, double* sums) {
    __shared__ LocalStats warp_stats[32];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        s.count += __shfl_down_sync(0xffffffffu, s.count, off);
        s.violations += __shfl_down_sync(0xffffffffu, s.violations, off);
        s.nonfinite += __shfl_down_sync(0xffffffffu, s.nonfinite, off);
        s.unwritten += __shfl_down_sync(0xffffffffu, s.unwritten, off);
        s.ref_nonfinite += __shfl_down_sync(0xffffffffu, s.ref_nonfinite, off);
        const unsigned long long f = __shfl_down_sync(0xffffffffu, s.first, off);
        s.first = f < s.first ? f : s.first;
        s.max_err = fmaxf(s.max_err, __shfl_down_sync(0xffffffffu, s.max_err, off));
        s.sum_sq_err += __shfl_down_sync(0xffffffffu, s.sum_sq_err, off);
        s.sum_sq_ref += __shfl_down_sync(0xffffffffu, s.sum_sq_ref, off);
        s.sum_sq_bf16 += __shfl_down_sync(0xffffffffu, s.sum_sq_bf16, off);
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) warp_stats[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        LocalStats t = warp_stats[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            const LocalStats& u = warp_stats[w];
            t.count += u.count;
            t.violations += u.violations;
            t.nonfinite += u.nonfinite;
            t.unwritten += u.unwritten;
            t.ref_nonfinite += u.ref_nonfinite;
            t.first = u.first < t.first ? u.first : t.first;
            t.max_err = fmaxf(t.max_err, u.max_err);
            t.sum_sq_err += u.sum_sq_err;
            t.sum_sq_ref += u.sum_sq_ref;
            t.sum_sq_bf16 += u.sum_sq_bf16;
        }
        atomicAdd(&g[0], t.count);
        atomicAdd(&g[1], t.violations);
        atomicAdd(&g[2], t.nonfinite);
        atomicAdd(&g[3], t.unwritten);
        if (t.first != ~0ull) atomicMin(&g[4], t.first);
        atomicAdd(&g[5], t.ref_nonfinite);
        // Non-negative floats order like their bit patterns, so an integer max is a float max.
        atomicMax(&g[6], (unsigned long long)__float_as_uint(t.max_err));
        if (sums != nullptr) {
            atomicAdd(&sums[0], t.sum_sq_err);
            atomicAdd(&sums[1], t.sum_sq_ref);
            atomicAdd(&sums[2], t.sum_sq_bf16);
        }
    }
}

constexpr int kRowBlock = ORACLE_ROW_BLOCK;
constexpr int kCmpThreads = 256;                      // 8 warps
constexpr int kCmpWarps = kCmpThreads / 32;
constexpr int kCmpRowsPerCta = 512;                   // 32 row blocks, 4 per warp
constexpr int kCmpBlocksPerCta = kCmpRowsPerCta / kRowBlock;
static_assert(kCmpRowsPerCta % kRowBlock == 0, "a CTA owns whole row blocks");

// C = D/32 adjacent BF16 values of O (4, 8 or 16 bytes) and their C FP32 references.
template <int C>
__device__ __forceinline__ void load_o(const uint16_t* __restrict__ o, long long i,
                                       uint16_t (&bits)[C]) {
    if constexpr (C == 2) {
        const uint32_t w = __ldg(reinterpret_cast<const uint32_t*>(o + i));
        bits[0] = (uint16_t)(w & 0xFFFFu);
        bits[1] = (uint16_t)(w >> 16);
    } else if constexpr (C == 4) {
        const uint2 w = __ldg(reinterpret_cast<const uint2*>(o + i));
        bits[0] = (uint16_t)(w.x & 0xFFFFu);
        bits[1] = (uint16_t)(w.x >> 16);
        bits[2] = (uint16_t)(w.y & 0xFFFFu);
        bits[3] = (uint16_t)(w.y >> 16);
    } else {
        static_assert(C == 8, "D/32 columns per lane: 2, 4 or 8");
        const uint4 w = __ldg(reinterpret_cast<const uint4*>(o + i));
        const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            bits[2 * j] = (uint16_t)(ws[j] & 0xFFFFu);
            bits[2 * j + 1] = (uint16_t)(ws[j] >> 16);
        }
    }
}

template <int C>
__device__ __forceinline__ void load_ref(const float* __restrict__ ref, long long i,
                                         float (&r)[C]) {
    if constexpr (C == 2) {
        const float2 x = __ldg(reinterpret_cast<const float2*>(ref + i));
        r[0] = x.x;
        r[1] = x.y;
    } else {
#pragma unroll
        for (int j = 0; j < C; j += 4) {
            const float4 x = __ldg(reinterpret_cast<const float4*>(ref + i + j));
            r[j] = x.x;
            r[j + 1] = x.y;
            r[j + 2] = x.z;
            r[j + 3] = x.w;
        }
    }
}

// O vs O_ref for rows [blockIdx.x * 512, +512) of one (b = blockIdx.z, h = blockIdx.y). Warp w
// takes the CTA's row blocks w, w + 8, ...; lane l owns columns C*l .. C*l + C-1 (C = D/32) of
// every row: one contiguous 2D-byte O row and 4D-byte O_ref row per warp load.
template <int D>
__global__ void __launch_bounds__(kCmpThreads)
compare_o_kernel(const uint16_t* __restrict__ o, const float* __restrict__ ref, int H, int S,
                 float atol, float rtol, OracleStats* stats, float4* __restrict__ block_sums,
                 double* __restrict__ col_sums) {
    constexpr int C = D / 32;
    __shared__ float col_part[kCmpWarps][4][D];
    const int h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_rb = (S + kRowBlock - 1) / kRowBlock;
    const int rb_begin = blockIdx.x * kCmpBlocksPerCta;
    const int rb_end = min(rb_begin + kCmpBlocksPerCta, n_rb);
    LocalStats s;
    init_local(s);
    float ce[C], cb[C], cr[C], cn[C];
#pragma unroll
    for (int j = 0; j < C; ++j) ce[j] = cb[j] = cr[j] = cn[j] = 0.f;
    for (int rb = rb_begin + warp; rb < rb_end; rb += kCmpWarps) {
        float be = 0.f, bb = 0.f, br = 0.f, bn = 0.f;
        const int s0 = rb * kRowBlock, s1 = min(s0 + kRowBlock, S);
#pragma unroll 4
        for (int row = s0; row < s1; ++row) {
            const long long base = (((long long)b * S + row) * H + h) * D + lane * C;
            uint16_t bits[C];
            float r4[C];
            load_o<C>(o, base, bits);
            load_ref<C>(ref, base, r4);
#pragma unroll
            for (int j = 0; j < C; ++j) {
                float e2, b2;
                if (account(s, base + j, bits[j] == ORACLE_POISON_BF16,
                            __uint_as_float((uint32_t)bits[j] << 16), r4[j], atol, rtol, &e2,
                            &b2)) {
                    const float r2 = r4[j] * r4[j];
                    be += e2;
                    bb += b2;
                    br += r2;
                    bn += 1.f;
                    ce[j] += e2;
                    cb[j] += b2;
                    cr[j] += r2;
                    cn[j] += 1.f;
                }
            }
        }
        be = warp_sum(be);
        bb = warp_sum(bb);
        br = warp_sum(br);
        bn = warp_sum(bn);
        if (block_sums != nullptr && lane == 0)
            block_sums[((long long)b * H + h) * n_rb + rb] = make_float4(be, bb, br, bn);
    }
    if (col_sums != nullptr) {
#pragma unroll
        for (int j = 0; j < C; ++j) {
            col_part[warp][0][lane * C + j] = ce[j];
            col_part[warp][1][lane * C + j] = cb[j];
            col_part[warp][2][lane * C + j] = cr[j];
            col_part[warp][3][lane * C + j] = cn[j];
        }
        __syncthreads();
        // Thread t sums quantity t / D of column t % D over the 8 warps: 4 D atomics per CTA,
        // each address hit ceil(S / 512) times.
        for (int t = threadIdx.x; t < 4 * D; t += kCmpThreads) {
            const int q = t / D, d = t % D;
            float acc = 0.f;
#pragma unroll
            for (int w = 0; w < kCmpWarps; ++w) acc += col_part[w][q][d];
            atomicAdd(&col_sums[(((long long)b * H + h) * D + d) * 4 + q], (double)acc);
        }
    }
    flush(s, &stats->o_count, &stats->o_sum_sq_err);
}

__global__ void compare_lse_kernel(const uint32_t* __restrict__ lse, const float* __restrict__ ref,
                                   long long n, float atol, float rtol, OracleStats* stats) {
    LocalStats s;
    init_local(s);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const uint32_t bits = lse[i];
        account(s, i, bits == ORACLE_POISON_F32, __uint_as_float(bits), ref[i], atol, rtol);
    }
    flush(s, &stats->l_count, nullptr);  // LSE has no L2 sums
}

__global__ void init_stats_kernel(OracleStats* stats) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        OracleStats z = {};
        z.o_first_violation = ~0ull;
        z.l_first_violation = ~0ull;
        z.o_block_rows = kRowBlock;
        *stats = z;
    }
}

}  // namespace
