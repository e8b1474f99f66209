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

#include "oracle/common.cuh"
#include "oracle/generators.cuh"
#include "oracle/reference.cuh"
#include "oracle/compare.cuh"

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
