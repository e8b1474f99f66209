// fa-tune oracle: the input generators (uniform, rising), poison, BF16 casts and strided copies.
// Part of cuda_src/oracle.cu's one translation unit (its header comment documents the C ABI,
// the input streams and the "rising" construction); included there only, in this order:
// common, generators, reference, compare.
#pragma once

namespace {

__global__ void fill_uniform_kernel(__nv_bfloat16* __restrict__ dst, long long n, uint64_t seed,
                                    uint64_t stream, float lo, float hi) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        dst[i] = to_bf16(uniform_in(seed, stream, (uint64_t)i, lo, hi));
    }
}

__global__ void fill_uniform_f32_kernel(float* __restrict__ dst, long long n, uint64_t seed,
                                        uint64_t stream, float lo, float hi) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        dst[i] = uniform_in(seed, stream, (uint64_t)i, lo, hi);
    }
}

// t of key j of a trend over S keys; jit_idx is the jitter's hash index, apart from j so a
// packed batch can key it by the packed row while j counts within the sequence.
__device__ __forceinline__ int rising_t(int j, int S, int direction, uint64_t seed,
                                        uint64_t jit_idx) {
    const uint64_t h = hash3(seed, kStreamRisingJit, jit_idx);
    const int jit = (int)(h >> 62);  // 0..3
    const int half = S / 2;
    return (direction < 0 ? 4 * (half - j) : 4 * (j - half)) + jit;
}

// The sequence holding packed key row r: the last b < num_seqs with cu_k[b] <= r (an empty
// sequence starts where the next one does, so the search passes over it).
__device__ __forceinline__ int seq_of_row(const int* __restrict__ cu_k, int num_seqs, int r) {
    int lo = 0, hi = num_seqs;  // cu_k[lo] <= r (cu_k[0] = 0); the answer is below hi
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (cu_k[mid] <= r) lo = mid;
        else hi = mid;
    }
    return lo;
}

// One kernel writes Q, then K and V, of the rising set; i is a flat BSHD index into Q (Sq rows,
// Hq heads) in the first loop, into K and V (Sk rows, Hkv heads) in the second. cu_k (NULL for
// a fixed problem): a packed batch's cu_seqlens_k, each sequence its own trend.
__global__ void gen_rising_kernel(__nv_bfloat16* __restrict__ q, __nv_bfloat16* __restrict__ k,
                                  __nv_bfloat16* __restrict__ v, int B, int Hq, int Hkv, int Sq,
                                  int Sk, int D, uint64_t seed, int direction,
                                  const int* __restrict__ cu_k, int num_seqs) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const float c2_scale = D == 256 ? 2.0f : 1.0f;  // m_D (header): the D 256 margin
    const long long n_q = (long long)B * Sq * Hq * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_q; i += stride) {
        const int d = (int)(i % D);
        const long long row = i / D;  // (b, s, h)
        const int h = (int)(row % Hq);
        const int s = (int)((row / Hq) % Sq);
        const int b = (int)(row / ((long long)Hq * Sq));
        float qv;
        if (d < 2) {
            const uint64_t row_key = ((uint64_t)b * Hq + h) * (uint64_t)Sq;  // + s: per row
            // Exact: a BF16 value times a power of two (m_D, then 256 for dim 0).
            const float c2 = c2_scale * bf16_round(__fadd_rn(
                0.09f, __fmul_rn(0.045f, uniform01(seed, kStreamRisingC2, row_key + s))));
            qv = d == 0 ? c2 * 256.0f : c2;
        } else {
            qv = uniform_in(seed, kStreamRisingQ, (uint64_t)i, -1.0f, 1.0f);
        }
        q[i] = to_bf16(qv);
    }
    const long long n_kv = (long long)B * Sk * Hkv * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_kv; i += stride) {
        const int d = (int)(i % D);
        const long long row = i / D;  // (b, s, g)
        const int g = (int)(row % Hkv);
        const int s = (int)((row / Hkv) % Sk);
        const int b = (int)(row / ((long long)Hkv * Sk));
        float kv;
        if (d < 2) {
            const uint64_t row_key = ((uint64_t)b * Hkv + g) * (uint64_t)Sk;  // per (b, g)
            int j = s, n = Sk;  // the trend's key index and key count
            if (cu_k != nullptr) {  // packed: the row's own sequence's (B = 1, s the packed row)
                const int sb = seq_of_row(cu_k, num_seqs, s);
                j = s - cu_k[sb];
                n = cu_k[sb + 1] - cu_k[sb];
            }
            const int t = rising_t(j, n, direction, seed, row_key + (uint64_t)s);
            const int hi = t >= 0 ? t / 256 : -((-t + 255) / 256);  // floor(t / 256)
            kv = d == 0 ? (float)hi : (float)(t - 256 * hi);
        } else if (d < 10) {
            kv = uniform_in(seed, kStreamRisingK, (uint64_t)i, -1.0f, 1.0f);
        } else {
            kv = uniform_in(seed, kStreamRisingK, (uint64_t)i, -0.01f, 0.01f);
        }
        k[i] = to_bf16(kv);
        v[i] = to_bf16(uniform_in(seed, kStreamRisingV, (uint64_t)i, -1.0f, 1.0f));
    }
}

__global__ void poison_kernel(uint16_t* __restrict__ o, long long n_o, uint32_t* __restrict__ lse,
                              long long n_lse) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_o; i += stride)
        o[i] = (uint16_t)ORACLE_POISON_BF16;
    if (lse != nullptr) {
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_lse;
             i += stride)
            lse[i] = ORACLE_POISON_F32;
    }
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                                   long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = to_bf16(src[i]);
}

// A 4-D strided copy of 16-bit words (by value: the dims and strides ride in the kernel's
// parameters). One thread per element, the flat index decomposed innermost dim first; the
// copies run once per input set, outside any timed region, so simple beats fast here.
struct Copy4d {
    long long dims[4];
    long long src[4];
    long long dst[4];
};

__global__ void copy_4d_kernel(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst,
                               Copy4d c, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long rest = i, s_off = 0, d_off = 0;
        for (int d = 3; d >= 0; --d) {
            const long long idx = rest % c.dims[d];
            rest /= c.dims[d];
            s_off += idx * c.src[d];
            d_off += idx * c.dst[d];
        }
        dst[d_off] = src[s_off];
    }
}

}  // namespace
