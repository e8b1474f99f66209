// fa-tune oracle: the FP32 reference attention and FlashAttention's BF16-math reference, with
// the models' masks.
// Part of cuda_src/oracle.cu's one translation unit (its header comment documents the C ABI,
// the input streams and the "rising" construction); included there only, in this order:
// common, generators, reference, compare.
#pragma once

namespace {

constexpr int kRefM = 64;             // query rows per CTA
constexpr int kRefN = 64;             // keys per KV tile
constexpr int kRefThreads = 256;      // 16 x 16 threads; each owns 4 rows
constexpr int kPLd = kRefN + 4;

constexpr int kFlagReverse = 1, kFlagBugNoRescaleO = 2, kFlagBugNoRescaleL = 4;
constexpr int kFlagBugNoSink = 8, kFlagBugSinkLn2 = 16, kFlagBugWideWindow = 32;
constexpr int kFlagsAll = 63;

// Per head dim: padded row stride of the Q and K/V tiles (row stride = 4 banks mod 32, so
// float4 reads of 16 different rows hit distinct banks), shared memory, CTAs per SM.
template <int D>
struct RefTraits {
    static_assert(D == 64 || D == 128 || D == 256, "head dim 64, 128 or 256");
    static constexpr int kLd = D + 4;
    static constexpr int kSmemFloats = kRefM * kLd + kRefN * kLd + kRefM * kPLd;
    static constexpr size_t kSmemBytes = kSmemFloats * sizeof(float);  // 52/85/147 KB
    // Registers: 4 x D/16 accumulators; D 256 needs > 128 per thread and its 147 KB of shared
    // memory fit once per SM anyway.
    static constexpr int kMinBlocks = D == 256 ? 1 : 2;
    static constexpr int kOutCols = D / 16;  // output dims per thread: groups of 4, 64 apart
};

template <int D>
__device__ __forceinline__ float ref_scale() {
    return D == 64 ? 0.125f : D == 128 ? 0.088388347648318440f : 0.0625f;  // 1/sqrt(D)
}

// Stage rows [row0, row0 + 64) of one (sequence, head) slice of a BSHD BF16 tensor with `heads`
// heads into shared memory as FP32 (rows >= S become zeros). The sequence starts at tensor row
// `base` (b * S, or its cu_seqlens entry in a packed batch); S is its rows in that tensor (Sq
// for Q, Sk for K and V). 16-byte global loads: 8 BF16 per
// load, D/8 loads per row.
template <int D>
__device__ __forceinline__ void stage_tile(float* __restrict__ dst,
                                           const __nv_bfloat16* __restrict__ src, long long base,
                                           int head, int row0, int heads, int S) {
    constexpr int kChunks = D / 8;
    constexpr int kLd = RefTraits<D>::kLd;
    for (int c = threadIdx.x; c < 64 * kChunks; c += kRefThreads) {
        const int r = c / kChunks;
        const int c8 = (c % kChunks) * 8;
        const int s = row0 + r;
        float* out = dst + r * kLd + c8;
        if (s < S) {
            const uint4 w = __ldg(reinterpret_cast<const uint4*>(
                src + ((base + s) * heads + head) * D + c8));
            // BF16 -> FP32 is a 16-bit shift; the low half of each word is the lower element.
            const float4 lo4 = make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xFFFF0000u),
                                           __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xFFFF0000u));
            const float4 hi4 = make_float4(__uint_as_float(w.z << 16), __uint_as_float(w.z & 0xFFFF0000u),
                                           __uint_as_float(w.w << 16), __uint_as_float(w.w & 0xFFFF0000u));
            *reinterpret_cast<float4*>(out) = lo4;
            *reinterpret_cast<float4*>(out + 4) = hi4;
        } else {
            const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
            *reinterpret_cast<float4*>(out) = z;
            *reinterpret_cast<float4*>(out + 4) = z;
        }
    }
}

// Scores of this thread's 4x4 block: sc[i][j] = Q row (ty*4 + i) . K row (tx + 16 j), FP32 FMAs
// over the staged tiles.
template <int D>
__device__ __forceinline__ void qk_block(const float* __restrict__ Qs, const float* __restrict__ Ks,
                                         int ty, int tx, float (&sc)[4][4]) {
    constexpr int kLd = RefTraits<D>::kLd;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) sc[i][j] = 0.f;
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
        float4 a[4], bb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            a[i] = *reinterpret_cast<const float4*>(Qs + (ty * 4 + i) * kLd + d);
#pragma unroll
        for (int j = 0; j < 4; ++j)
            bb[j] = *reinterpret_cast<const float4*>(Ks + (tx + 16 * j) * kLd + d);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                float t = sc[i][j];
                t = fmaf(a[i].x, bb[j].x, t);
                t = fmaf(a[i].y, bb[j].y, t);
                t = fmaf(a[i].z, bb[j].z, t);
                t = fmaf(a[i].w, bb[j].w, t);
                sc[i][j] = t;
            }
    }
}

// Fold a sink logit into a row's running max m and sum l: m becomes max(m, sink), l gains
// exp(sink - m); returns the factor what the row has accumulated must be scaled by (0 for a row
// that saw no key: it has nothing to scale, and its max is the sink's).
__device__ __forceinline__ float fold_sink(float& m, float& l, float sink) {
    if (sink == -INFINITY) return 1.f;  // no sink (a test bug's): nothing joins
    const float m_new = fmaxf(m, sink);
    const float alpha = m == -INFINITY ? 0.f : expf(m - m_new);
    l = l * alpha + expf(sink - m_new);
    m = m_new;
    return alpha;
}

// Logit softcapping: C tanhf(s / C), on scores before the mask. BF16 math rounds each of
// attention_ref's torch ops on a BF16 tensor: s / C, tanh of it, and C times that.
template <bool kBf16>
__device__ __forceinline__ float cap_score(float s, float c) {
    if (kBf16) return bf16_round(c * bf16_round(tanhf(bf16_round(s / c))));
    return c * tanhf(s / c);
}

// The sink of query head h in natural-log units, -inf for none (its term exp(-inf) is 0), with
// the test-only bugs applied. Read where it is used, not held across the KV walk: a register
// fewer there keeps the D 128 instantiation within 128 registers without spills.
__device__ __forceinline__ float sink_of(const float* __restrict__ sinks, int h, int flags) {
    if (sinks == nullptr || (flags & kFlagBugNoSink)) return -INFINITY;
    return (flags & kFlagBugSinkLn2) ? __ldg(sinks + h) * 0.693147180559945f : __ldg(sinks + h);
}

// kBf16 = false: the FP32 reference (o_out float*, online softmax, one walk over the KV tiles).
// kBf16 = true: the BF16-math reference, FlashAttention's attention_ref(upcast=False): Q * scale
// rounded to BF16, S = (Q * scale) K^T in FP32 rounded to BF16, softmax in FP32 of those BF16
// scores rounded to BF16 (P), O = P V in FP32 rounded to BF16 (o_out __nv_bfloat16*). Two walks:
// the first finds each row's max and sum of exp(s - max) (online, FP32), the second writes
// P = bf16(exp(s - max) / sum) and accumulates P V; no LSE.
template <int D, bool kBf16>
__global__ void __launch_bounds__(kRefThreads, RefTraits<D>::kMinBlocks)
reference_kernel(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                 const __nv_bfloat16* __restrict__ v, void* __restrict__ o_out,
                 float* __restrict__ lse_ref, int Hq, int Hkv, int Sq_arg, int Sk_arg, int causal,
                 int window, float softcap, const float* __restrict__ sinks, int flags,
                 const int* __restrict__ cu_q, const int* __restrict__ cu_k, int total_q) {
    constexpr int kLd = RefTraits<D>::kLd;
    constexpr int kOC = RefTraits<D>::kOutCols;  // 4, 8 or 16
    constexpr int kGroups = kOC / 4;             // groups of 4 output dims, 64 apart
    extern __shared__ float4 smem_f4[];  // float4 type: 16-byte alignment for vector access
    float* Qs = reinterpret_cast<float*>(smem_f4);
    float* KVs = Qs + kRefM * kLd;  // holds K, then V, of the current tile
    float* Ps = KVs + kRefN * kLd;

    const int h = blockIdx.y;
    const int b = blockIdx.z;
    // Fixed length: batch b is query rows [b*Sq, b*Sq + Sq) and key rows [b*Sk, b*Sk + Sk), LSE
    // [B, Hq, Sq]. Varlen (cu_q, cu_k): the packed sequence b, LSE [Hq, total_q]; the grid
    // covers the longest query length, shorter ones stop early.
    int Sq = Sq_arg, Sk = Sk_arg;
    long long base_q = (long long)b * Sq, base_k = (long long)b * Sk;
    long long lse_base = ((long long)b * Hq + h) * Sq;
    if (cu_q != nullptr) {
        base_q = cu_q[b];
        Sq = cu_q[b + 1] - cu_q[b];
        base_k = cu_k[b];
        Sk = cu_k[b + 1] - cu_k[b];
        lse_base = (long long)h * total_q + base_q;
    }
    // Bottom-right causal alignment: query row i sees keys 0 .. i + off.
    const int off = Sk - Sq;
    const int n_qblocks = (Sq + kRefM - 1) / kRefM;
    const int qb = n_qblocks - 1 - (int)blockIdx.x;  // longest rows first: shorter tail
    if (qb < 0) return;
    const int hkv = h / (Hq / Hkv);  // the K/V head this query head reads
    const int q0 = qb * kRefM;
    const int tid = threadIdx.x;
    const int ty = tid >> 4;  // rows ty*4 .. ty*4+3
    const int tx = tid & 15;  // score cols tx + 16*j; output dims 64*g + tx*4 + {0..3}
    const float scale = ref_scale<D>();

    stage_tile<D>(Qs, q, base_q, h, q0, Hq, Sq);
    if constexpr (kBf16) {  // q * scale, rounded to BF16 (torch: bf16 tensor times a float)
        __syncthreads();
        for (int c = threadIdx.x; c < kRefM * D; c += kRefThreads) {
            float* x = Qs + (c / D) * kLd + c % D;
            *x = bf16_round(*x * scale);
        }
    }

    float m[4], l[4], acc_o[4][kOC];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.f;
    }

    // Sliding window: row i sees no key below i + off - win + 1 (0: no window).
    const int win = window > 0 && (flags & kFlagBugWideWindow) ? window + 1 : window;
    // The keys any real row of this block sees: from the window's left edge for its first row
    // to the last key of its last row (last < first: none; then no tile at all).
    const int first_key = win > 0 ? max(0, q0 + off - win + 1) : 0;
    const int last_key = causal ? min(min(q0 + kRefM - 1, Sq - 1) + off, Sk - 1) : Sk - 1;
    const int tile0 = first_key / kRefN;
    const int n_tiles = last_key < first_key ? 0 : last_key / kRefN + 1 - tile0;
    // FP32: one walk. BF16 math: walk 0 finds the row max and sum, walk 1 writes P and P V.
    // Unrolled, with O zeroed at its walk: BF16 math's first walk then holds no O registers
    // (the D 128 instantiation stays within 128 registers without spills).
#pragma unroll
    for (int walk = 0; walk < (kBf16 ? 2 : 1); ++walk) {
    const bool final_walk = !kBf16 || walk == 1;
    if (final_walk) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int c = 0; c < kOC; ++c) acc_o[i][c] = 0.f;
    }
    if (kBf16 && final_walk && sinks != nullptr) {  // the sink joins the max and the sum
        const float sink = sink_of(sinks, h, flags);
#pragma unroll
        for (int i = 0; i < 4; ++i) fold_sink(m[i], l[i], sink);
    }
    for (int it = 0; it < n_tiles; ++it) {
        const int tile = tile0 + ((flags & kFlagReverse) ? n_tiles - 1 - it : it);
        const int kv0 = tile * kRefN;

        __syncthreads();  // previous tile's readers of KVs/Ps are done (and Qs is staged)
        stage_tile<D>(KVs, k, base_k, hkv, kv0, Hkv, Sk);
        __syncthreads();

        float sc[4][4];
        qk_block<D>(Qs, KVs, ty, tx, sc);

        // Softmax, FP32 with IEEE expf. A row's 64 scores live on the 16 lanes that share ty
        // (one half-warp), so xor-shuffles with offsets < 16 reduce exactly one row.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = q0 + ty * 4 + i;
#pragma unroll
            for (int j = 0; j < 4; ++j) sc[i][j] = kBf16 ? bf16_round(sc[i][j]) : sc[i][j] * scale;
            // Capped before the mask (C tanh(-inf / C) would be -C, a key). Uniform: a pass of
            // its own keeps the plain path's registers.
            if (softcap > 0.f) {
#pragma unroll
                for (int j = 0; j < 4; ++j) sc[i][j] = cap_score<kBf16>(sc[i][j], softcap);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int key = kv0 + tx + 16 * j;
                const bool valid = key < Sk && (!causal || key <= row + off) &&
                                   (win <= 0 || key > row + off - win);
                if (!valid) sc[i][j] = -INFINITY;
            }
            if (kBf16 && final_walk) {  // m, l final: P normalised, rounded to BF16
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    Ps[(ty * 4 + i) * kPLd + tx + 16 * j] =
                        sc[i][j] == -INFINITY ? 0.f : bf16_round(expf(sc[i][j] - m[i]) / l[i]);
                continue;
            }
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; ++j) mx = fmaxf(mx, sc[i][j]);
#pragma unroll
            for (int off = 1; off < 16; off <<= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float m_new = fmaxf(m[i], mx);
            // m_new == -inf only when every key seen so far is masked (possible in reverse
            // walks or for rows >= Sq); then nothing has been accumulated and nothing scales.
            const float alpha = m_new == -INFINITY ? 1.f : expf(m[i] - m_new);
            const float m_use = m_new == -INFINITY ? 0.f : m_new;
            float rs = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float p = sc[i][j] == -INFINITY ? 0.f : expf(sc[i][j] - m_use);
                rs += p;
                if (!kBf16) Ps[(ty * 4 + i) * kPLd + tx + 16 * j] = p;
            }
#pragma unroll
            for (int off = 1; off < 16; off <<= 1) rs += __shfl_xor_sync(0xffffffffu, rs, off);
            l[i] = ((flags & kFlagBugNoRescaleL) ? l[i] : l[i] * alpha) + rs;
            m[i] = m_new;
            if (!kBf16 && !(flags & kFlagBugNoRescaleO)) {
#pragma unroll
                for (int c = 0; c < kOC; ++c) acc_o[i][c] *= alpha;
            }
        }
        if (!final_walk) continue;  // uniform across the CTA

        __syncthreads();  // everyone is done with K and has written P
        stage_tile<D>(KVs, v, base_k, hkv, kv0, Hkv, Sk);
        __syncthreads();

        // O += P V for this thread's 4 rows x D/16 dims.
#pragma unroll 2
        for (int c = 0; c < kRefN; c += 4) {
            float4 p4[4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
                p4[i] = *reinterpret_cast<const float4*>(Ps + (ty * 4 + i) * kPLd + c);
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                float4 vv[kGroups];
#pragma unroll
                for (int g = 0; g < kGroups; ++g)
                    vv[g] = *reinterpret_cast<const float4*>(KVs + (c + cc) * kLd + 64 * g +
                                                             tx * 4);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float p =
                        cc == 0 ? p4[i].x : cc == 1 ? p4[i].y : cc == 2 ? p4[i].z : p4[i].w;
#pragma unroll
                    for (int g = 0; g < kGroups; ++g) {
                        acc_o[i][4 * g + 0] = fmaf(p, vv[g].x, acc_o[i][4 * g + 0]);
                        acc_o[i][4 * g + 1] = fmaf(p, vv[g].y, acc_o[i][4 * g + 1]);
                        acc_o[i][4 * g + 2] = fmaf(p, vv[g].z, acc_o[i][4 * g + 2]);
                        acc_o[i][4 * g + 3] = fmaf(p, vv[g].w, acc_o[i][4 * g + 3]);
                    }
                }
            }
        }
    }
    }

    // Epilogue: O / l (l >= 1 for every row that sees a key: its max term contributes
    // exp(0) = 1). A row that sees none gets O = 0 and LSE = -inf (the kernel's convention),
    // or LSE = sink with a sink. BF16 math: P was normalised already; O rounded to BF16.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int s = q0 + ty * 4 + i;
        if (s >= Sq) continue;
        const float o_scale =
            kBf16 || sinks == nullptr ? 1.f : fold_sink(m[i], l[i], sink_of(sinks, h, flags));
        const bool seen = l[i] > 0.f;
        const long long at = ((base_q + s) * Hq + h) * D;
        if constexpr (kBf16) {
            __nv_bfloat16* out = static_cast<__nv_bfloat16*>(o_out) + at;
#pragma unroll
            for (int g = 0; g < kGroups; ++g) {
                __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(out + 64 * g + tx * 4);
                o2[0] = __floats2bfloat162_rn(acc_o[i][4 * g + 0], acc_o[i][4 * g + 1]);
                o2[1] = __floats2bfloat162_rn(acc_o[i][4 * g + 2], acc_o[i][4 * g + 3]);
            }
        } else {
            const float inv = seen ? o_scale / l[i] : 0.f;
            float* out = static_cast<float*>(o_out) + at;
#pragma unroll
            for (int g = 0; g < kGroups; ++g)
                *reinterpret_cast<float4*>(out + 64 * g + tx * 4) =
                    make_float4(acc_o[i][4 * g + 0] * inv, acc_o[i][4 * g + 1] * inv,
                                acc_o[i][4 * g + 2] * inv, acc_o[i][4 * g + 3] * inv);
            if (lse_ref != nullptr && tx == 0)
                lse_ref[lse_base + s] = seen ? m[i] + logf(l[i]) : -INFINITY;
        }
    }
}

// The models' masks of one call (0, 0, NULL: none).
struct Masks {
    int window;
    float softcap;
    const float* sinks;
};

// Varlen: B sequences of cu_q / cu_k (device), Sq the longest query length, total_q the query
// rows (Sk unused). kBf16: o_out is BF16 (the BF16-math reference), lse_ref must be NULL.

template <int D, bool kBf16 = false>
int launch_reference(const void* q, const void* k, const void* v, void* o_out, float* lse_ref,
                     int B, int Hq, int Hkv, int Sq, int Sk, int causal, Masks mk, int flags,
                     cudaStream_t s, const int* cu_q = nullptr, const int* cu_k = nullptr,
                     int total_q = 0) {
    constexpr size_t smem = RefTraits<D>::kSmemBytes;
    // > 48 KB of dynamic shared memory needs an explicit opt-in (cheap; done every call so the
    // attribute is set in whatever context is current).
    ORACLE_CHECK(cudaFuncSetAttribute(reference_kernel<D, kBf16>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid((Sq + kRefM - 1) / kRefM, Hq, B);
    reference_kernel<D, kBf16><<<grid, kRefThreads, smem, s>>>(
        static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
        static_cast<const __nv_bfloat16*>(v), o_out, lse_ref, Hq, Hkv, Sq, Sk, causal, mk.window,
        mk.softcap, mk.sinks, flags, cu_q, cu_k, total_q);
    return (int)cudaGetLastError();
}

}  // namespace
