"""``OracleModule``: the ctypes binding of ``oracle.so`` (cuda_src/oracle.cu; its header comment
documents the C ABI), the correctness gate's engine.

Split out of tuner/kernel/runtime.py (which re-exports every name here, so ``from
tuner.kernel.runtime import OracleModule`` keeps working).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from tuner.errors import FaTuneError
from tuner.kernel.runtime import (
    BF16_BYTES,
    AttnBuffers,
    CudaError,
    KernelError,
    Stream,
    _bind,
    _c_float,
    _c_int,
    _c_ll,
    _c_ull,
    _load_so,
    _vp,
    as_problem,
    cuda_error_name,
    problem_dims,
    stream_handle,
)
from tuner.problem import dense_strides

# 9: oracle_gen_rising takes cu_seqlens_k and num_seqs (a packed batch's trend per sequence);
# 8: the models' masks (window, softcap, sinks) in every reference, oracle_fill_uniform_f32;
# 7: oracle_reference_bf16 / _varlen (FlashAttention's BF16-math reference); 6:
# oracle_copy_bf16_4d (inputs mirrored into strided layouts); 5: S_q != S_k (bottom-right
# causal), cu_seqlens_q / _k; 4: varlen
ORACLE_ABI_VERSION = 9
ORACLE_STATS_BYTES = 152
ORACLE_ROW_BLOCK = 16  # query rows per block of the BF16 error budget (oracle_row_block())


class Masks(NamedTuple):
    """The models' masks as the oracle's references take them: the window in keys (0: none),
    the softcap (0: none), the sinks' device pointer (None: none)."""

    window: int = 0
    softcap: float = 0.0
    sinks: int | None = None


NO_MASKS = Masks()


def masks_of(bufs: AttnBuffers) -> Masks:
    """The masks of the problem in ``bufs``: its window and softcap, and bufs.sinks when it has
    sinks (a problem with sinks whose buffers hold none is a KernelError: the reference would
    silently compute another problem)."""
    p = bufs.shape
    sinks = None
    if getattr(p, "sinks", False):
        buf = getattr(bufs, "sinks", None)
        if buf is None:
            raise KernelError(f"buffers of {p} hold no sinks")
        sinks = buf.ptr
    return Masks(int(getattr(p, "window", 0)), float(getattr(p, "softcap", 0.0)), sinks)


def _mask_args(m: Masks) -> tuple[int, float, int | None]:
    return int(m.window), float(m.softcap), m.sinks or None


class OracleModule:
    """``oracle.so`` (cuda_src/oracle.cu; its header comment documents the C ABI)."""

    def __init__(self, so_path: str | Path) -> None:
        self.path = p = Path(so_path)
        lib = _load_so(p, "oracle library")
        self._lib = lib
        abi = _bind(lib, p, "oracle_abi_version", _c_int, [])()
        size = _bind(lib, p, "oracle_stats_size", _c_int, [])()
        if abi != ORACLE_ABI_VERSION or size != ORACLE_STATS_BYTES:
            raise FaTuneError(
                f"{p}: oracle ABI {abi}/stats {size} bytes, expected "
                f"{ORACLE_ABI_VERSION}/{ORACLE_STATS_BYTES}: rebuild oracle.so"
            )
        rows = _bind(lib, p, "oracle_row_block", _c_int, [])()
        if rows != ORACLE_ROW_BLOCK:
            raise FaTuneError(f"{p}: oracle row block {rows}, expected {ORACLE_ROW_BLOCK}: "
                              "rebuild oracle.so")
        i = _c_int
        self._fill_uniform = _bind(lib, p, "oracle_fill_uniform", _c_int,
                                   [_vp, _c_ll, _c_ull, _c_ull, _c_float, _c_float, _vp])
        self._fill_uniform_f32 = _bind(lib, p, "oracle_fill_uniform_f32", _c_int,
                                       [_vp, _c_ll, _c_ull, _c_ull, _c_float, _c_float, _vp])
        # (q, k, v, B, Hq, Hkv, Sq, Sk, D, seed, stream)
        self._gen_seed = _bind(lib, p, "oracle_gen_seed", _c_int,
                               [_vp, _vp, _vp, i, i, i, i, i, i, _c_ull, _vp])
        # (q, k, v, B, Hq, Hkv, Sq, Sk, D, seed, direction, cu_seqlens_k, num_seqs, stream)
        self._gen_rising = _bind(lib, p, "oracle_gen_rising", _c_int,
                                 [_vp, _vp, _vp, i, i, i, i, i, i, _c_ull, i, _vp, i, _vp])
        self._poison = _bind(lib, p, "oracle_poison", _c_int, [_vp, _c_ll, _vp, _c_ll, _vp])
        masks = [i, _c_float, _vp]  # window, softcap, sinks (0, 0, NULL: none)
        # (q, k, v, o_ref, lse_ref, B, Hq, Hkv, Sq, Sk, D, causal, *masks, flags, stream)
        self._reference = _bind(lib, p, "oracle_reference", _c_int,
                                [_vp, _vp, _vp, _vp, _vp, i, i, i, i, i, i, i, *masks, i, _vp])
        # (q, k, v, o_ref, lse_ref, cu_seqlens_q, cu_seqlens_k, num_seqs, max_seqlen_q,
        #  total_q, Hq, Hkv, D, causal, *masks, flags, stream)
        self._reference_varlen = _bind(lib, p, "oracle_reference_varlen", _c_int,
                                       [_vp, _vp, _vp, _vp, _vp, _vp, _vp, i, i, i, i, i, i, i,
                                        *masks, i, _vp])
        # (q, k, v, o_bf16, B, Hq, Hkv, Sq, Sk, D, causal, *masks, stream)
        self._reference_bf16 = _bind(lib, p, "oracle_reference_bf16", _c_int,
                                     [_vp, _vp, _vp, _vp, i, i, i, i, i, i, i, *masks, _vp])
        # (q, k, v, o_bf16, cu_seqlens_q, cu_seqlens_k, num_seqs, max_seqlen_q, total_q, Hq,
        #  Hkv, D, causal, *masks, stream)
        self._reference_bf16_varlen = _bind(lib, p, "oracle_reference_bf16_varlen", _c_int,
                                            [_vp, _vp, _vp, _vp, _vp, _vp, i, i, i, i, i, i, i,
                                             *masks, _vp])
        self._f32_to_bf16 = _bind(lib, p, "oracle_f32_to_bf16", _c_int, [_vp, _vp, _c_ll, _vp])
        # (src, dst, dims[4], src_strides[4], dst_strides[4], stream): host arrays of int64
        ll4 = ctypes.POINTER(_c_ll)
        self._copy_4d = _bind(lib, p, "oracle_copy_bf16_4d", _c_int, [_vp, _vp, ll4, ll4, ll4, _vp])
        # (o, o_ref, B, Hq, S, D, lse, lse_ref, o_atol, o_rtol, lse_atol, lse_rtol, stats,
        #  block_sums, col_sums, stream)
        self._compare = _bind(lib, p, "oracle_compare", _c_int,
                              [_vp, _vp, i, i, i, i, _vp, _vp, _c_float, _c_float,
                               _c_float, _c_float, _vp, _vp, _vp, _vp])

    @staticmethod
    def _ok(rc: int, what: str) -> None:
        if rc != 0:
            raise CudaError(f"oracle {what} failed with {cuda_error_name(rc)} ({rc})", code=rc)

    def fill_uniform(self, dst: int, n: int, seed: int, stream_id: int, lo: float, hi: float,
                     stream: Stream | int | None) -> None:
        self._ok(self._fill_uniform(dst, n, seed, stream_id, lo, hi,
                                    stream_handle(stream) or None), "fill_uniform")

    def fill_uniform_f32(self, dst: int, n: int, seed: int, stream_id: int, lo: float,
                         hi: float, stream: Stream | int | None) -> None:
        """dst[i] = lo + (hi - lo) * u(seed, stream_id, i) as FP32 (the attention sinks)."""
        self._ok(self._fill_uniform_f32(dst, n, seed, stream_id, lo, hi,
                                        stream_handle(stream) or None), "fill_uniform_f32")

    def gen_seed(self, q: int, k: int, v: int, B: int, Hq: int, Hkv: int, Sq: int, Sk: int,
                 D: int, seed: int, stream: Stream | int | None) -> None:
        self._ok(self._gen_seed(q, k, v, B, Hq, Hkv, Sq, Sk, D, seed,
                                stream_handle(stream) or None), "gen_seed")

    def gen_rising(self, q: int, k: int, v: int, B: int, Hq: int, Hkv: int, Sq: int, Sk: int,
                   D: int, seed: int, direction: int, stream: Stream | int | None,
                   cu_seqlens_k: int | None = None, num_seqs: int = 0) -> None:
        """The rising set; a packed batch passes its as_fixed dims (B = 1, Sk = total_k) and
        cu_seqlens_k (device, int32) with its sequence count, so each sequence gets its own
        trend; a fixed problem passes neither."""
        self._ok(self._gen_rising(q, k, v, B, Hq, Hkv, Sq, Sk, D, seed, direction,
                                  cu_seqlens_k or None, num_seqs,
                                  stream_handle(stream) or None), "gen_rising")

    def poison(self, o: int, n_o: int, lse: int | None, n_lse: int,
               stream: Stream | int | None) -> None:
        self._ok(self._poison(o, n_o, lse or None, n_lse, stream_handle(stream) or None),
                 "poison")

    def reference(self, q: int, k: int, v: int, o_ref: int, lse_ref: int | None, B: int,
                  Hq: int, Hkv: int, Sq: int, Sk: int, D: int, causal: bool,
                  stream: Stream | int | None, flags: int = 0,
                  masks: Masks = NO_MASKS) -> None:
        """FP32 attention of the problem (B, Hq, Hkv, Sq queries over Sk keys, D, causal:
        bottom-right; ``masks``: (window, softcap, sinks device pointer or None)) into o_ref
        ([B, Sq, Hq, D]) and lse_ref ([B, Hq, Sq], or None)."""
        self._ok(self._reference(q, k, v, o_ref, lse_ref or None, B, Hq, Hkv, Sq, Sk, D,
                                 1 if causal else 0, *_mask_args(masks), flags,
                                 stream_handle(stream) or None),
                 "reference")

    def reference_varlen(self, q: int, k: int, v: int, o_ref: int, lse_ref: int | None,
                         cu_seqlens_q: int, cu_seqlens_k: int, num_seqs: int,
                         max_seqlen_q: int, total_q: int, Hq: int, Hkv: int, D: int,
                         causal: bool, stream: Stream | int | None, flags: int = 0,
                         masks: Masks = NO_MASKS) -> None:
        """The reference of a packed batch: sequence b's queries are rows cu_seqlens_q[b] ..
        [b + 1] and its keys rows cu_seqlens_k[b] .. [b + 1] (int32 on the device), its own
        problem; o_ref [total_q, Hq, D], lse_ref [Hq, total_q] (or None)."""
        self._ok(self._reference_varlen(q, k, v, o_ref, lse_ref or None, cu_seqlens_q,
                                        cu_seqlens_k, num_seqs, max_seqlen_q, total_q, Hq, Hkv,
                                        D, 1 if causal else 0, *_mask_args(masks), flags,
                                        stream_handle(stream) or None),
                 "reference_varlen")

    def reference_for(self, bufs: AttnBuffers, o_ref: int, lse_ref: int | None,
                      stream: Stream | int | None, flags: int = 0) -> None:
        """The reference of the inputs in ``bufs`` (its problem, with its masks and
        bufs.sinks; a packed batch per sequence, with bufs.cu_q and bufs.cu_k)."""
        p = as_problem(bufs.shape)
        masks = masks_of(bufs)
        if p.is_varlen:
            assert bufs.cu_q is not None and bufs.cu_k is not None
            self.reference_varlen(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, o_ref, lse_ref,
                                  bufs.cu_q.ptr, bufs.cu_k.ptr, p.B, p.S_q, p.tokens_q, p.Hq,
                                  p.Hkv, p.D, p.causal, stream, flags=flags, masks=masks)
            return
        B, hq, hkv, Sq, Sk, D, causal = problem_dims(p)
        self.reference(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, o_ref, lse_ref, B, hq, hkv, Sq, Sk,
                       D, causal, stream, flags=flags, masks=masks)

    def reference_bf16_for(self, bufs: AttnBuffers, o_bf16: int,
                           stream: Stream | int | None) -> None:
        """The inputs in ``bufs`` computed in BF16 the way FlashAttention's tests do it
        (``attention_ref(upcast=False)``; oracle.cu's header) into o_bf16 ([B, S_q, Hq, D]
        BF16; a packed batch per sequence), with the problem's masks."""
        p = as_problem(bufs.shape)
        h = stream_handle(stream) or None
        masks = _mask_args(masks_of(bufs))
        if p.is_varlen:
            assert bufs.cu_q is not None and bufs.cu_k is not None
            self._ok(self._reference_bf16_varlen(
                bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, o_bf16, bufs.cu_q.ptr, bufs.cu_k.ptr, p.B,
                p.S_q, p.tokens_q, p.Hq, p.Hkv, p.D, 1 if p.causal else 0, *masks, h),
                "reference_bf16_varlen")
            return
        B, hq, hkv, Sq, Sk, D, causal = problem_dims(p)
        self._ok(self._reference_bf16(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, o_bf16, B, hq, hkv, Sq,
                                      Sk, D, 1 if causal else 0, *masks, h), "reference_bf16")

    def copy_bf16_4d(self, src: int, dst: int, dims: Sequence[int], src_strides: Sequence[int],
                     dst_strides: Sequence[int], stream: Stream | int | None) -> None:
        """dst[i . dst_strides] = src[i . src_strides] for every 4-D index i < dims (strides in
        elements), bit for bit, asynchronous on ``stream``."""
        arrs = []
        for what, xs in (("dims", dims), ("src_strides", src_strides),
                         ("dst_strides", dst_strides)):
            if len(xs) != 4:
                raise ValueError(f"copy_bf16_4d: {what} needs 4 values (got {len(xs)})")
            arrs.append((_c_ll * 4)(*(int(x) for x in xs)))
        self._ok(self._copy_4d(src, dst, *arrs, stream_handle(stream) or None), "copy_bf16_4d")

    def mirror_inputs(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        """Copy the dense Q, K, V of ``bufs`` into its layout buffers (``bufs.mirrored()``: none
        for dense BSHD), so launchables reading the layout's views see the generated inputs."""
        p = bufs.shape
        if getattr(p, "page_size", 0):
            self._mirror_pages(bufs, stream)
            return
        for name, tv in bufs.mirrored():
            src_strides = dense_strides(*tv.dims[1:])  # the generated tensor: dense BSHD
            dst = bufs.layout_bufs[tv.buffer].ptr + tv.offset * BF16_BYTES
            self.copy_bf16_4d(getattr(bufs, name).ptr, dst, tv.dims, (*src_strides, 1),
                              (*tv.strides, 1), stream)

    def _mirror_pages(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        """A paged problem (tuner.paging): the shared pages' rows over the sharing sequences'
        dense rows first (so the references read the keys the pages hold), then each page from
        its dense rows. One 4-D copy per page: the pages are in random order."""
        p = bufs.shape
        pages = p.pages
        row = p.Hkv * p.D  # elements per key row of the dense K / V and of a page
        strides = (row * pages.page_size, row, p.D, 1)
        for name in ("k", "v"):
            src = getattr(bufs, name).ptr
            for a, b, rows in pages.shared:
                self.copy_bf16_4d(src + a * row * BF16_BYTES, src + b * row * BF16_BYTES,
                                  (1, rows, p.Hkv, p.D), strides, strides, stream)
            dst = bufs.layout_bufs[f"{name}_pages"].ptr
            for c in pages.copies:
                self.copy_bf16_4d(src + c.src_row * row * BF16_BYTES,
                                  dst + c.page * pages.page_size * row * BF16_BYTES,
                                  (1, c.rows, p.Hkv, p.D), strides, strides, stream)

    def f32_to_bf16(self, src: int, dst: int, n: int, stream: Stream | int | None) -> None:
        self._ok(self._f32_to_bf16(src, dst, n, stream_handle(stream) or None), "f32_to_bf16")

    def compare(self, o: int, o_ref: int, B: int, H: int, S: int, D: int, lse: int | None,
                lse_ref: int | None, o_atol: float, o_rtol: float, lse_atol: float,
                lse_rtol: float, stats: int, block_sums: int | None, col_sums: int | None,
                stream: Stream | int | None) -> None:
        """O (and LSE, unless lse is None) against the reference; O is [B, S, H, D] (H = Hq,
        S = the query rows S_q).
        Fills the stats struct and, when given, the budget sums: block_sums
        [B, H, ceil(S / ORACLE_ROW_BLOCK), 4] float32, col_sums [B, H, D, 4] float64
        (oracle.cu's header)."""
        self._ok(self._compare(o, o_ref, B, H, S, D, lse or None, lse_ref or None, o_atol,
                               o_rtol, lse_atol, lse_rtol, stats, block_sums or None,
                               col_sums or None, stream_handle(stream) or None),
                 "compare")
