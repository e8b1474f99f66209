"""fa-tune's own Triton flash-attention forward (causal, BF16 in/out, FP32 accumulation, D=128).

Imported only by ``tuner.measure.peers.triton_fa`` once triton is known to be present: this module
imports triton at the top because ``@triton.jit`` needs it at definition time.

Design (FA2-style, one program per (query tile, batch*head)):
* inputs are BSHD ([B, S, H, D]) read through their strides, so no layout copy is needed;
* online softmax in base 2: scores are scaled by softmax_scale*log2(e) once, so each element
  costs one exp2 (MUFU) instead of a multiply plus exp;
* the causal KV range is split in two loops: tiles strictly left of the diagonal need no mask,
  only the BLOCK_M/BLOCK_N tiles on the diagonal build one (BLOCK_M % BLOCK_N == 0 is required);
* query tiles run longest-first (the last tile has the most KV tiles), so the short tail of the
  grid fills the gaps instead of one long tile finishing alone;
* the LSE is written in natural-log units as [B, H, S] FP32, like fa-tune's kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Twenty configs, as in the anchors' Triton row. BLOCK_N must divide BLOCK_M (diagonal loop), and
# BLOCK_M=BLOCK_N=128 with 4 stages would need 256 KB of shared memory, so it is left out.
# fmt: off
_CONFIGS = [
    (128, 128, 8, 2), (128, 128, 8, 3), (128, 128, 4, 2), (128, 128, 4, 3),
    (128, 64, 4, 2), (128, 64, 4, 3), (128, 64, 4, 4),
    (128, 64, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4),
    (128, 32, 4, 3), (128, 32, 4, 4), (128, 32, 8, 3),
    (64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 8, 3),
    (64, 32, 4, 2), (64, 32, 4, 3), (64, 32, 4, 4),
]
# fmt: on
AUTOTUNE_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm, bn, w, s in _CONFIGS
]


@triton.jit
def _attn_tiles(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_ks,
    stride_vs,
    offs_m,
    offs_n,
    offs_d,
    lo,
    hi,
    S,
    qk_scale,
    BLOCK_N: tl.constexpr,
    DIAGONAL: tl.constexpr,
    EVEN_S: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        # K^T tile [D, BLOCK_N]: addressing it transposed avoids a separate transpose.
        k_ptrs = k_base + cols[None, :] * stride_ks + offs_d[:, None]
        v_ptrs = v_base + cols[:, None] * stride_vs + offs_d[None, :]
        if EVEN_S:
            k = tl.load(k_ptrs)
        else:
            k = tl.load(k_ptrs, mask=cols[None, :] < S, other=0.0)
        qk = tl.dot(q, k) * qk_scale
        if DIAGONAL:
            keep = offs_m[:, None] >= cols[None, :]
            if not EVEN_S:
                keep = keep & (cols[None, :] < S)
            qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if EVEN_S:
            v = tl.load(v_ptrs)
        else:
            v = tl.load(v_ptrs, mask=cols[:, None] < S, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=AUTOTUNE_CONFIGS, key=["S", "H"])
@triton.heuristics({"EVEN_S": lambda args: args["S"] % args["BLOCK_M"] == 0})
@triton.jit
def attn_fwd_kernel(
    Q,
    K,
    V,
    Out,
    LSE,
    qk_scale,  # softmax_scale * log2(e)
    S,
    H,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_os,
    stride_oh,
    stride_lb,
    stride_lh,
    HEAD_DIM: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN_S: tl.constexpr,
):
    # Longest-first: program 0 takes the last query tile (the most KV tiles).
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :]
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh

    if EVEN_S:
        q = tl.load(q_ptrs)
    else:
        q = tl.load(q_ptrs, mask=offs_m[:, None] < S, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # Tiles fully below the diagonal: every column <= every row of this tile, no mask.
    diag_lo = pid_m * BLOCK_M
    acc, l_i, m_i = _attn_tiles(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_ks,
        stride_vs,
        offs_m,
        offs_n,
        offs_d,
        0,
        diag_lo,
        S,
        qk_scale,
        BLOCK_N=BLOCK_N,
        DIAGONAL=False,
        EVEN_S=True,
    )
    # Diagonal tiles: each row keeps column <= row. Column diag_lo is always kept, so no row
    # ends up with an all -inf score row (no NaN from exp2(-inf - -inf)).
    # Columns past S (ragged last tile) are masked inside, so the bound needs no min().
    diag_hi = diag_lo + BLOCK_M
    acc, l_i, m_i = _attn_tiles(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_ks,
        stride_vs,
        offs_m,
        offs_n,
        offs_d,
        diag_lo,
        diag_hi,
        S,
        qk_scale,
        BLOCK_N=BLOCK_N,
        DIAGONAL=True,
        EVEN_S=EVEN_S,
    )

    acc = acc / l_i[:, None]
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :]
    if EVEN_S:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty))
    else:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=offs_m[:, None] < S)
    if WRITE_LSE:
        # m_i is in log2 units (scores were scaled by log2(e)); LSE is reported in natural log.
        lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
        lse_ptrs = LSE + b * stride_lb + h * stride_lh + offs_m
        if EVEN_S:
            tl.store(lse_ptrs, lse)
        else:
            tl.store(lse_ptrs, lse, mask=offs_m < S)
