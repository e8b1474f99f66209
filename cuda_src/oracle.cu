// fa-tune oracle: the correctness gate's engine. Self-contained (CUDA runtime only, no CUTLASS).
//
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -shared -Xcompiler -fPIC
//        -o oracle.so oracle.cu
// Never build with --use_fast_math: the reference relies on IEEE expf/logf and on un-fused,
// correctly rounded arithmetic in the input generators (see "Bit-exact generators").
//
// ----------------------------------------------------------------------------------------------
// The problem family: batch B, Hq query heads, Hkv K/V heads (Hq a multiple of Hkv: Hkv = Hq is
// MHA, Hkv = 1 MQA, between GQA; query head h reads K/V head h / (Hq / Hkv)), Sq queries over
// Sk keys (Sq <= Sk: a prompt continuing a cached prefix; Sq = Sk: a fresh prefill), head dim D
// in {64, 128, 256}, causal or not. The causal mask is aligned bottom-right, as FlashAttention's:
// query row i sees keys 0 .. i + Sk - Sq; non-causal rows attend to every key. A row that sees
// no key (causal Sq > Sk, or a sequence without keys) gets O = 0 and LSE = -inf, the kernel's
// convention (fa-tune's problems never have one).
//
// The models' masks (issue 36; tuner/problem.py), each optional, in every reference:
//   window W >= 1: a sliding window: query row i, diagonal key a = i + Sk - Sq, sees keys
//     max(0, a - W + 1) .. a causal, max(0, a - W + 1) .. Sk - 1 not (transformers'
//     sliding_window; FlashAttention's window_size = (W - 1, 0) / (W - 1, -1)); 0: none.
//   softcap C > 0: scores s (softmax scale included) become C tanhf(s / C) before the softmax
//     (Gemma-2); 0: none.
//   sinks: float32 [Hq] on the device (or NULL): query head h's logit joins each of its rows'
//     softmax denominators as exp(sinks[h]), with no value row (gpt-oss): O = sum_j exp(s_j -
//     m) v_j / (sum_j exp(s_j - m) + exp(sink - m)), LSE = log(sum_j exp(s_j) + exp(sink)). A
//     row that sees no key then gets O = 0 and LSE = sink.
//
// C ABI (version 9). Every function returns an int that is a cudaError_t (0 = cudaSuccess).
// Each launch is followed by cudaGetLastError(), so a bad launch is reported by the call that
// made it; kernel faults surface at the caller's next synchronisation. All work is enqueued on
// `stream` (a cudaStream_t == CUstream; NULL = legacy default stream). Pointers are device
// pointers. Layouts (BSHD, contiguous): Q and O are [B, Sq, Hq, D] BF16; K and V are
// [B, Sk, Hkv, D] BF16; O_ref is [B, Sq, Hq, D] FP32; LSE and LSE_ref are [B, Hq, Sq] FP32 in
// natural-log units: lse = log(sum_j exp(s_j)), with s_j = q.k_j / sqrt(D) over the keys the
// row attends to. Offsets are 64-bit here, but callers keep B*S*H*D < 2^31 (the kernel's rule).
//
//   int oracle_abi_version(void);            // ORACLE_ABI_VERSION below
//   int oracle_stats_size(void);             // sizeof(OracleStats), for the caller's layout check
//
//   int oracle_fill_uniform(void* dst_bf16, long long n, unsigned long long seed,
//                           unsigned long long stream_id, float lo, float hi, cudaStream_t s);
//       dst[i] = bf16_rn(lo + (hi - lo) * u(seed, stream_id, i)), u in [0, 1).
//
//   int oracle_gen_seed(void* q, void* k, void* v, int B, int Hq, int Hkv, int Sq, int Sk,
//                       int D, unsigned long long seed, cudaStream_t s);
//       Input set "seed": Q, K uniform in [-2, 2], V uniform in [-1, 1] (streams 1, 2, 3; the
//       index is the element's flat index in its own tensor). For MHA, D 128, Sq = Sk this is
//       exactly ABI 2's set (same streams, same indices): results and NumPy twins stay valid.
//
//   int oracle_gen_rising(void* q, void* k, void* v, int B, int Hq, int Hkv, int Sq, int Sk,
//                         int D, unsigned long long seed, int direction,
//                         const int* cu_seqlens_k, int num_seqs, cudaStream_t s);
//       Input set "rising" (direction = -1: scores grow as the key index DEcreases, so the
//       running row max rises at every KV tile of a REVERSE walk: diagonal (or last) tile
//       first, then toward key 0) or "rising_fwd" (direction = +1: grows with the key index, so
//       a FORWARD walk rises). Fixed problem: cu_seqlens_k = NULL, num_seqs = 0, Sk <= 32768
//       (see construction; the trend is over keys, so Sq does not matter). Packed batch: the
//       as_fixed tensors (B = 1, Sq = total_q, Sk = total_k, any size) and cu_seqlens_k (int32
//       on the device, num_seqs + 1 entries, num_seqs >= 1): K's trend restarts in every
//       sequence, whose key count must be <= 32768 (the caller checks: the lengths are on the
//       device). Construction below; bit-identical to ABI 2 for MHA, D 128, Sq = Sk.
//
//   int oracle_fill_uniform_f32(float* dst, long long n, unsigned long long seed,
//                               unsigned long long stream_id, float lo, float hi, cudaStream_t s);
//       dst[i] = lo + (hi - lo) * u(seed, stream_id, i) in FP32 (no BF16 rounding): the
//       attention sinks of an input set (tuner/measure/reference_numpy.py picks lo, hi and the
//       stream per set).
//
//   int oracle_poison(void* o_bf16, long long n_o, float* lse, long long n_lse, cudaStream_t s);
//       o[i] bits = 0x7FBF (ORACLE_POISON_BF16), lse[i] bits = 0x7FBADBAD (ORACLE_POISON_F32).
//       Both are NaNs no arithmetic produces (hardware NaNs are 0x7FFF/0x7FC0 and 0x7FFFFFFF),
//       so compare() counts them as "unwritten", separately from computed NaN/Inf. lse may be
//       NULL (n_lse ignored).
//
//   int oracle_reference(const void* q, const void* k, const void* v, float* o_ref,
//                        float* lse_ref, int B, int Hq, int Hkv, int Sq, int Sk, int D,
//                        int causal, int window, float softcap, const float* sinks, int flags,
//                        cudaStream_t s);
//       Independent FP32 attention, scale 1/sqrt(D), exact softmax with IEEE expf/logf (online
//       form: per-tile max and rescale, all FP32); causal != 0: key j <= query row i + Sk - Sq,
//       else every key; window, softcap, sinks as above (0, 0, NULL: none; softcap through
//       tanhf, accurate to 2 ulp; the sink folded into the row's max and sum at the end). Query
//       head h reads K/V head h / (Hq / Hkv). lse_ref may be NULL.
//       flags = 0 for the reference. Test-only bits (to prove the gate catches real kernel bugs):
//         1 = walk KV tiles in reverse (diagonal / last tile first), like the FA3 mainloop;
//         2 = BUG: do not rescale O when the running max rises;
//         4 = BUG: do not rescale the running sum l when the running max rises;
//         8 = BUG: leave the sink out (as if sinks were NULL);
//         16 = BUG: the sink times ln 2 (a base-2 softmax given the natural-log sink as is);
//         32 = BUG: the window one key wider (its left edge at a - W).
//       One CTA (256 threads) per (64 query rows, h, b), a template on D; Q, K/V and P tiles
//       staged in shared memory as FP32; each thread owns a 4x4 score block and a 4 x D/16
//       output block (register blocking, float4 shared loads). Shared memory (rows padded by 4
//       floats) and CTAs per SM: D 64: 52 KB, 2; D 128: 85 KB, 2 (<= 128 registers, no spills);
//       D 256: 147 KB, 1 (168 registers).
//       Cost 2*B*Hq*D FMA per (query, key) pair visited: B*Hq*S^2*D causal at Sq = Sk, twice
//       that non-causal:
//       4.4e12 FMA at 4x32x16384 D 128 causal, measured 0.28 s on an H200 (ABI 2; ~16 TFLOPS
//       FP32). Non-causal doubles it; D 256 doubles the FMAs at half the occupancy (expect
//       2-3x D 128's time); D 64 halves them.
//
//   int oracle_reference_varlen(const void* q, const void* k, const void* v, float* o_ref,
//                               float* lse_ref, const int* cu_seqlens_q,
//                               const int* cu_seqlens_k, int num_seqs, int max_seqlen_q,
//                               int total_q, int Hq, int Hkv, int D, int causal, int window,
//                               float softcap, const float* sinks, int flags, cudaStream_t s);
//       The same reference for a packed batch (Q, O [total_q, Hq, D]; K, V [total_k, Hkv, D];
//       lse [Hq, total_q]): sequence b's queries are rows cu_seqlens_q[b] .. [b + 1] and its
//       keys rows cu_seqlens_k[b] .. [b + 1] (int32 on the device, num_seqs + 1 entries each,
//       every query length <= max_seqlen_q), its own attention problem (the causal offset is
//       its own key length minus its own query length). The rows of a length-0 sequence are
//       none.
//
//   int oracle_reference_bf16(const void* q, const void* k, const void* v, void* o_bf16,
//                             int B, int Hq, int Hkv, int Sq, int Sk, int D, int causal,
//                             int window, float softcap, const float* sinks, cudaStream_t s);
//   int oracle_reference_bf16_varlen(const void* q, const void* k, const void* v, void* o_bf16,
//                                    const int* cu_seqlens_q, const int* cu_seqlens_k,
//                                    int num_seqs, int max_seqlen_q, int total_q, int Hq,
//                                    int Hkv, int D, int causal, int window, float softcap,
//                                    const float* sinks, cudaStream_t s);
//       The same problem computed in BF16 the way FlashAttention's tests do it
//       (attention_ref(upcast=False)), into o_bf16 [B, Sq, Hq, D] BF16 (a packed batch: [total_q,
//       Hq, D]): Q * scale rounded to BF16; S = (Q * scale) K^T with FP32 accumulation rounded
//       to BF16; softmax in FP32 of those BF16 scores (exp(s - max) / sum) rounded to BF16 (P);
//       O = P V with FP32 accumulation rounded to BF16. The masks as attention_ref applies them
//       to BF16 tensors: softcap rounds s / C, tanhf of that and C times it to BF16 each; the
//       window is a -inf score; the sink (FP32) joins the max and the sum (P = exp(s - M) /
//       (sum_j exp(s_j - M) + exp(sink - M)), M = max(max_j s_j, sink)). The gate compares it
//       with the FP32 reference (oracle_compare) for FlashAttention's rule, max|err| <= 2 x its
//       max|err| + 1e-5, 3 x with a softcap (docs/GATE.md). The reference kernel's other
//       template: two walks over the KV tiles (max and sum, then P and P V), so ~1.5x the FP32
//       reference's time. No LSE, no flags.
//
//   int oracle_f32_to_bf16(const float* src, void* dst_bf16, long long n, cudaStream_t s);
//       dst = bf16_rn(src): a "perfect kernel" for gate self-tests.
//
//   int oracle_copy_bf16_4d(const void* src, void* dst, const long long* dims,
//                           const long long* src_strides, const long long* dst_strides,
//                           cudaStream_t s);
//       dst[i0*ds0 + i1*ds1 + i2*ds2 + i3*ds3] = src[i0*ss0 + ... + i3*ss3] for every index
//       i < dims (4 HOST arrays of 4: dims >= 1, strides >= 0, in elements), bit for bit (16-bit
//       words: no conversion). The gate generates inputs into dense Q, K, V; this mirrors them
//       into a problem's layout buffer (q, k, v as views of one fused QKV tensor, k and v as a
//       [B, H, S, D] cache), one call per tensor, so the kernel and its peers read the same
//       values through strides. Destination elements that overlap give an undefined winner.
//
//   int oracle_row_block(void);              // ORACLE_ROW_BLOCK: query rows per budget block
//
//   int oracle_compare(const void* o_bf16, const float* o_ref, int B, int Hq, int S, int D,
//                      const float* lse, const float* lse_ref,
//                      float o_atol, float o_rtol, float lse_atol, float lse_rtol,
//                      OracleStats* stats_dev, float* block_sums, double* col_sums,
//                      cudaStream_t s);
//       O and O_ref are [B, S, Hq, D]; LSE [B, Hq, S]; S is the QUERY rows (Sq; a packed
//       batch: B = 1, S = total_q). D in {64, 128, 256}.
//       Fills *stats_dev (a device buffer of oracle_stats_size() bytes; zeroed here first).
//       Per O element: unwritten if its bits are the poison; else non-finite if NaN/Inf; else
//       err = |o - ref| (FP32) feeds max_abs_err and sum_sq_err. A violation is any element that
//       does NOT satisfy err <= o_atol + o_rtol*|ref| (so poison, NaN, Inf and a non-finite ref
//       are violations too); first_violation = lowest flat index of a violation (atomicMin),
//       ~0ull if none. sum_sq_ref sums ref^2 over finite refs, sum_sq_bf16 sums
//       (bf16_rn(ref) - ref)^2 over the elements that feed sum_sq_err. The gate uses
//       o_atol = 0.05, o_rtol = 0.1 (the seeds' rule). LSE (when lse != NULL; B*Hq*S values)
//       uses the same scheme with lse_atol/lse_rtol (the gate: 2^-9 and 2^-18, docs/GATE.md:
//       the "rising" set has |lse| up to ~550 at S=16384, where FP32 score rounding alone is
//       ~1e-4). Counts are exact; sums are FP64.
//       The BF16 error budget's sums (docs/GATE.md), over the elements that feed sum_sq_err:
//         block_sums (may be NULL): [B, Hq, ceil(S / ORACLE_ROW_BLOCK)] x 4 floats, one entry
//           per (b, h, block of ORACLE_ROW_BLOCK query rows; the last one may be partial):
//           { sum err^2, sum (bf16_rn(ref) - ref)^2, sum ref^2, element count } over the
//           block's rows x D columns. Every entry is written (no zeroing needed): 2 MB at
//           B=4, Hq=32, S=16384.
//         col_sums (may be NULL): [B, Hq, D] x 4 doubles, the same four sums per (b, h,
//           head-dim column d) over all S rows; zeroed here, accumulated with atomics (512 KB
//           at 4x32, D 128).
//       One pass reads O and O_ref once: grid (ceil(S / 512), Hq, B), 256 threads; a warp owns
//       whole row blocks (a lane owns D/32 adjacent columns), so a block's sums need no atomics.
//
// ----------------------------------------------------------------------------------------------
// Bit-exact generators. u(seed, stream, i) = (hash(seed, stream, i) >> 40) * 2^-24, with
//   hash(seed, stream, i) = splitmix64(splitmix64(seed ^ (stream * 0xD1B54A32D192ED03)) ^ i)
// (splitmix64 = the finalizer of Steele et al.). Affine maps use __fmul_rn/__fadd_rn (never an
// FMA) and BF16 conversion is round-to-nearest-even, so tuner/measure/oracle.py's NumPy twin
// reproduces every input bit for bit (tested on the GPU).
//
// "rising" construction (direction d = -1; d = +1 mirrors the key order). The trend is over the
// Sk keys (j < Sk), the coefficient per query row (i < Sq). Per (b, K/V head g):
//   t(j) = 4*(Sk/2 - j) + jit(j) for d = -1, t(j) = 4*(j - Sk/2) + jit(j) for d = +1, with
//          Sk/2 an integer division and jit(j) in {0,1,2,3} (stream 15, index
//          (b*Hkv + g)*Sk + j). Consecutive keys differ by >= 1, so t is strictly monotone;
//          |t| <= 2Sk + 3.
//   Packed batch (B = 1, Sk = total_k): key row r of sequence b (cu_seqlens_k[b] <= r <
//          cu_seqlens_k[b + 1], found by binary search) takes j = r - cu_seqlens_k[b] and Sk =
//          that sequence's key count in t(j), so every sequence is a fixed problem's trend of
//          its own and only its length is bounded below. The jitter's index, like every other
//          random index here (K's and V's noise, Q's c2 and noise), stays the packed row's
//          (g*total_k + r for jit), so sequences of equal length still get different noise.
//   K[j, 0] = hi(j) = floor(t / 256), K[j, 1] = lo(j) = t - 256*hi in [0, 255]: small integers,
//          exact in BF16 while |hi| <= 256 (hence Sk <= 32768, per sequence when packed).
//   Q[i, 0] = 256*c2(i), Q[i, 1] = c2(i) (per (b, query head h, row i)), with
//          c2(i) = m_D * bf16(0.09 + 0.045*u) (stream 14, index (b*Hq + h)*Sq + i), m_D = 2 for
//          D = 256 and 1 otherwise: c2 in [0.0898, 0.1348] * m_D, exact (BF16 times a power of
//          two), so q.k over dims 0-1 is exactly c2(i) * t(j). Every query head of a group sees
//          the same t of its K/V head: the property below holds per query row, for GQA and MQA
//          as for MHA.
//   Dims 2..9 ("strong noise"): Q, K uniform in [-1, 1] (streams 11, 12); dims 10..D-1: Q
//          uniform [-1, 1], K uniform [-0.01, 0.01]. V uniform [-1, 1] (stream 13). Q's index is
//          its flat index in Q, K's and V's theirs in K and V.
//   Logit s(i, j) = c2(i) t(j) / sqrt(D) + e(i, j) with |e| <= E_D = (8 + (D - 10) *
//          0.010009765625) / sqrt(D) (worst case; typically ~E_D / 4): E_64 = 1.068,
//          E_128 = 0.812, E_256 = 0.654.
//   Any KV tile of N >= 64 keys vs the next tile of the walk: the trend gains at least
//          c2 (4N - 3) / sqrt(D) logits (the nearest keys of consecutive tiles are N apart,
//          whatever the size of the tile visited first), which beats 2 E_D by
//            D 64:  0.0898 * 253 / 8      = 2.84 > 2.14: by >= 0.70 logits,
//            D 128: 0.0898 * 253 / 11.314 = 2.01 > 1.62: by >= 0.38 logits,
//            D 256: 0.1797 * 253 / 16     = 2.84 > 1.31: by >= 1.53 logits,
//          so every tile's max beats the running max, for every row and every tile size and
//          alignment (a partial diagonal tile included), causal or not (a non-causal reverse
//          walk starts at the last tile), whatever Sq: the argument is about keys only, and a
//          bottom-right causal row's keys are a prefix 0 .. i + Sk - Sq like any other (a packed
//          sequence's rows: a prefix of its own keys, its own trend). The trend rises by 2-3
//          logits per 64 keys; logits span about +-0.034*Sk (+-553 at Sk=16384; +-391 for
//          D 128; Sk a packed sequence's own key count): finite, and the rescale
//          factor exp(m_old - m_new) is well below 1 at every tile, so a kernel that skips (or
//          misapplies) the rescale of O or of the running sum fails the gate.
//   "rising_fwd" (d = +1) gives the same guarantee to a FORWARD walk for every step into a full
//          tile; only a final tile holding a few keys (the diagonal tile, or the last tile of a
//          non-causal row) may fail to raise the max. Use it for kernels that walk KV tiles
//          forward.
// ----------------------------------------------------------------------------------------------

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

// ------------------------------------------------------------------------------ generators

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

// ------------------------------------------------------------------------------ reference

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

// ------------------------------------------------------------------------------ compare

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

// ------------------------------------------------------------------------------ C ABI

ORACLE_API int oracle_abi_version(void) { return ORACLE_ABI_VERSION; }

ORACLE_API int oracle_stats_size(void) { return (int)sizeof(OracleStats); }

ORACLE_API int oracle_fill_uniform(void* dst, long long n, unsigned long long seed,
                                   unsigned long long stream_id, float lo, float hi,
                                   cudaStream_t s) {
    if (dst == nullptr || n < 0) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    fill_uniform_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<__nv_bfloat16*>(dst), n,
                                                         seed, stream_id, lo, hi);
    return (int)cudaGetLastError();
}

ORACLE_API int oracle_fill_uniform_f32(float* dst, long long n, unsigned long long seed,
                                       unsigned long long stream_id, float lo, float hi,
                                       cudaStream_t s) {
    if (dst == nullptr || n < 0) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    fill_uniform_f32_kernel<<<grid_for(n, 256), 256, 0, s>>>(dst, n, seed, stream_id, lo, hi);
    return (int)cudaGetLastError();
}

namespace {
bool bad_problem(int B, int Hq, int Hkv, int S, int D) {
    return B < 1 || Hq < 1 || Hkv < 1 || S < 1 || Hq % Hkv != 0 ||
           (D != 64 && D != 128 && D != 256);
}

// A window of >= 0 keys, a finite softcap >= 0 (NaN fails too); sinks may be NULL.
bool bad_masks(int window, float softcap) {
    return window < 0 || !(softcap >= 0.f) || isinf(softcap);
}

// One of the reference kernel's instantiations per head dim (D is checked by bad_problem).
template <bool kBf16>
int launch_any_d(int D, const void* q, const void* k, const void* v, void* o_out, float* lse_ref,
                 int B, int Hq, int Hkv, int Sq, int Sk, int causal, Masks mk, int flags,
                 cudaStream_t s, const int* cu_q = nullptr, const int* cu_k = nullptr,
                 int total_q = 0) {
    const int c = causal != 0;
    if (D == 64)
        return launch_reference<64, kBf16>(q, k, v, o_out, lse_ref, B, Hq, Hkv, Sq, Sk, c, mk,
                                           flags, s, cu_q, cu_k, total_q);
    if (D == 128)
        return launch_reference<128, kBf16>(q, k, v, o_out, lse_ref, B, Hq, Hkv, Sq, Sk, c, mk,
                                            flags, s, cu_q, cu_k, total_q);
    return launch_reference<256, kBf16>(q, k, v, o_out, lse_ref, B, Hq, Hkv, Sq, Sk, c, mk,
                                        flags, s, cu_q, cu_k, total_q);
}
}  // namespace

ORACLE_API int oracle_gen_seed(void* q, void* k, void* v, int B, int Hq, int Hkv, int Sq, int Sk,
                               int D, unsigned long long seed, cudaStream_t s) {
    if (q == nullptr || k == nullptr || v == nullptr || bad_problem(B, Hq, Hkv, Sq, D) || Sk < 1)
        return (int)cudaErrorInvalidValue;
    const long long n_q = (long long)B * Sq * Hq * D, n_kv = (long long)B * Sk * Hkv * D;
    ORACLE_CHECK((cudaError_t)oracle_fill_uniform(q, n_q, seed, kStreamQ, -2.0f, 2.0f, s));
    ORACLE_CHECK((cudaError_t)oracle_fill_uniform(k, n_kv, seed, kStreamK, -2.0f, 2.0f, s));
    ORACLE_CHECK((cudaError_t)oracle_fill_uniform(v, n_kv, seed, kStreamV, -1.0f, 1.0f, s));
    return 0;
}

ORACLE_API int oracle_gen_rising(void* q, void* k, void* v, int B, int Hq, int Hkv, int Sq,
                                 int Sk, int D, unsigned long long seed, int direction,
                                 const int* cu_seqlens_k, int num_seqs, cudaStream_t s) {
    // Fixed: the whole key axis is one trend, so it is bounded here. Packed: one batch of
    // every sequence's rows; the per-sequence bound is the caller's (lengths on the device).
    const bool packed = cu_seqlens_k != nullptr;
    if (q == nullptr || k == nullptr || v == nullptr || bad_problem(B, Hq, Hkv, Sq, D) ||
        Sk < 1 || (direction != 1 && direction != -1) ||
        (packed ? B != 1 || num_seqs < 1 : num_seqs != 0 || Sk > 32768))
        return (int)cudaErrorInvalidValue;
    const long long n_q = (long long)B * Sq * Hq * D, n_kv = (long long)B * Sk * Hkv * D;
    gen_rising_kernel<<<grid_for(n_q > n_kv ? n_q : n_kv, 256), 256, 0, s>>>(
        static_cast<__nv_bfloat16*>(q), static_cast<__nv_bfloat16*>(k),
        static_cast<__nv_bfloat16*>(v), B, Hq, Hkv, Sq, Sk, D, seed, direction, cu_seqlens_k,
        num_seqs);
    return (int)cudaGetLastError();
}

ORACLE_API int oracle_poison(void* o, long long n_o, float* lse, long long n_lse, cudaStream_t s) {
    if (o == nullptr || n_o < 0 || (lse != nullptr && n_lse < 0)) return (int)cudaErrorInvalidValue;
    const long long n = n_o > n_lse || lse == nullptr ? n_o : n_lse;
    if (n == 0) return 0;
    poison_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<uint16_t*>(o), n_o,
                                                   reinterpret_cast<uint32_t*>(lse), n_lse);
    return (int)cudaGetLastError();
}

ORACLE_API int oracle_reference(const void* q, const void* k, const void* v, float* o_ref,
                                float* lse_ref, int B, int Hq, int Hkv, int Sq, int Sk, int D,
                                int causal, int window, float softcap, const float* sinks,
                                int flags, cudaStream_t s) {
    if (q == nullptr || k == nullptr || v == nullptr || o_ref == nullptr ||
        bad_problem(B, Hq, Hkv, Sq, D) || Sk < 1 || Hq > 65535 || B > 65535 ||
        bad_masks(window, softcap) || (flags & ~kFlagsAll) != 0)
        return (int)cudaErrorInvalidValue;
    return launch_any_d<false>(D, q, k, v, o_ref, lse_ref, B, Hq, Hkv, Sq, Sk, causal,
                               Masks{window, softcap, sinks}, flags, s);
}

ORACLE_API int oracle_reference_varlen(const void* q, const void* k, const void* v,
                                       float* o_ref, float* lse_ref, const int* cu_seqlens_q,
                                       const int* cu_seqlens_k, int num_seqs, int max_seqlen_q,
                                       int total_q, int Hq, int Hkv, int D, int causal,
                                       int window, float softcap, const float* sinks, int flags,
                                       cudaStream_t s) {
    if (q == nullptr || k == nullptr || v == nullptr || o_ref == nullptr ||
        cu_seqlens_q == nullptr || cu_seqlens_k == nullptr || bad_problem(1, Hq, Hkv, total_q, D) ||
        max_seqlen_q < 1 || num_seqs < 1 || num_seqs > 65535 || Hq > 65535 ||
        bad_masks(window, softcap) || (flags & ~kFlagsAll) != 0)
        return (int)cudaErrorInvalidValue;
    return launch_any_d<false>(D, q, k, v, o_ref, lse_ref, num_seqs, Hq, Hkv, max_seqlen_q, 0,
                               causal, Masks{window, softcap, sinks}, flags, s, cu_seqlens_q,
                               cu_seqlens_k, total_q);
}

ORACLE_API int oracle_reference_bf16(const void* q, const void* k, const void* v, void* o_bf16,
                                     int B, int Hq, int Hkv, int Sq, int Sk, int D, int causal,
                                     int window, float softcap, const float* sinks,
                                     cudaStream_t s) {
    if (q == nullptr || k == nullptr || v == nullptr || o_bf16 == nullptr ||
        bad_problem(B, Hq, Hkv, Sq, D) || Sk < 1 || Hq > 65535 || B > 65535 ||
        bad_masks(window, softcap))
        return (int)cudaErrorInvalidValue;
    return launch_any_d<true>(D, q, k, v, o_bf16, nullptr, B, Hq, Hkv, Sq, Sk, causal,
                              Masks{window, softcap, sinks}, 0, s);
}

ORACLE_API int oracle_reference_bf16_varlen(const void* q, const void* k, const void* v,
                                            void* o_bf16, const int* cu_seqlens_q,
                                            const int* cu_seqlens_k, int num_seqs,
                                            int max_seqlen_q, int total_q, int Hq, int Hkv, int D,
                                            int causal, int window, float softcap,
                                            const float* sinks, cudaStream_t s) {
    if (q == nullptr || k == nullptr || v == nullptr || o_bf16 == nullptr ||
        cu_seqlens_q == nullptr || cu_seqlens_k == nullptr || bad_problem(1, Hq, Hkv, total_q, D) ||
        max_seqlen_q < 1 || num_seqs < 1 || num_seqs > 65535 || Hq > 65535 ||
        bad_masks(window, softcap))
        return (int)cudaErrorInvalidValue;
    return launch_any_d<true>(D, q, k, v, o_bf16, nullptr, num_seqs, Hq, Hkv, max_seqlen_q, 0,
                              causal, Masks{window, softcap, sinks}, 0, s, cu_seqlens_q,
                              cu_seqlens_k, total_q);
}

ORACLE_API int oracle_f32_to_bf16(const float* src, void* dst, long long n, cudaStream_t s) {
    if (src == nullptr || dst == nullptr || n < 0) return (int)cudaErrorInvalidValue;
    if (n == 0) return 0;
    f32_to_bf16_kernel<<<grid_for(n, 256), 256, 0, s>>>(src, static_cast<__nv_bfloat16*>(dst), n);
    return (int)cudaGetLastError();
}

ORACLE_API int oracle_copy_bf16_4d(const void* src, void* dst, const long long* dims,
                                   const long long* src_strides, const long long* dst_strides,
                                   cudaStream_t s) {
    if (src == nullptr || dst == nullptr || dims == nullptr || src_strides == nullptr ||
        dst_strides == nullptr)
        return (int)cudaErrorInvalidValue;
    Copy4d c;
    long long n = 1;
    for (int d = 0; d < 4; ++d) {
        if (dims[d] < 1 || src_strides[d] < 0 || dst_strides[d] < 0)
            return (int)cudaErrorInvalidValue;
        if (n > (1LL << 62) / dims[d]) return (int)cudaErrorInvalidValue;  // overflow
        n *= dims[d];
        c.dims[d] = dims[d];
        c.src[d] = src_strides[d];
        c.dst[d] = dst_strides[d];
    }
    copy_4d_kernel<<<grid_for(n, 256), 256, 0, s>>>(static_cast<const uint16_t*>(src),
                                                    static_cast<uint16_t*>(dst), c, n);
    return (int)cudaGetLastError();
}

ORACLE_API int oracle_row_block(void) { return ORACLE_ROW_BLOCK; }

ORACLE_API int oracle_compare(const void* o, const float* o_ref, int B, int H, int S, int D,
                              const float* lse, const float* lse_ref, float o_atol, float o_rtol,
                              float lse_atol, float lse_rtol, OracleStats* stats,
                              float* block_sums, double* col_sums, cudaStream_t s) {
    if (o == nullptr || o_ref == nullptr || stats == nullptr || bad_problem(B, H, 1, S, D) ||
        B > 65535 || H > 65535 || (lse != nullptr && lse_ref == nullptr))
        return (int)cudaErrorInvalidValue;
    init_stats_kernel<<<1, 32, 0, s>>>(stats);
    ORACLE_CHECK(cudaGetLastError());
    if (col_sums != nullptr)
        ORACLE_CHECK(cudaMemsetAsync(col_sums, 0, sizeof(double) * 4 * D * (size_t)B * H, s));
    const dim3 grid((S + kCmpRowsPerCta - 1) / kCmpRowsPerCta, H, B);
    const uint16_t* o16 = static_cast<const uint16_t*>(o);
    float4* bs = reinterpret_cast<float4*>(block_sums);
    if (D == 64)
        compare_o_kernel<64><<<grid, kCmpThreads, 0, s>>>(o16, o_ref, H, S, o_atol, o_rtol, stats,
                                                          bs, col_sums);
    else if (D == 128)
        compare_o_kernel<128><<<grid, kCmpThreads, 0, s>>>(o16, o_ref, H, S, o_atol, o_rtol,
                                                           stats, bs, col_sums);
    else
        compare_o_kernel<256><<<grid, kCmpThreads, 0, s>>>(o16, o_ref, H, S, o_atol, o_rtol,
                                                           stats, bs, col_sums);
    ORACLE_CHECK(cudaGetLastError());
    if (lse != nullptr) {
        const long long n_lse = (long long)B * H * S;
        compare_lse_kernel<<<grid_for(n_lse, 256), 256, 0, s>>>(
            reinterpret_cast<const uint32_t*>(lse), lse_ref, n_lse, lse_atol, lse_rtol, stats);
        ORACLE_CHECK(cudaGetLastError());
    }
    return 0;
}
