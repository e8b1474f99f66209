"""The peers on paged problems (issue 37), on the CPU: which peer reads pages (FA3 and FlashInfer;
the others decline in one line), the arguments each gets (FA3's page_table / seqused_k through
flash_attn_varlen_func, fixed and packed queries; FlashInfer's paged_kv_indptr / _indices /
_last_page_len from the block table, shared pages under every sequence that reads them), and
the whole bind -> run -> collect path of ``PeerLaunch`` with stand-ins of both libraries that
compute attention through the pages they are handed (float64, torch on the CPU): the output and
the LSE equal the NumPy reference on the dense K and V, at page sizes 16 and 64, with shared
pages, partial last pages (their unused rows zero, as AttnBuffers allocates them), packed batches
with empty sequences, and the window and softcap. No GPU, flash_attn or flashinfer needed."""

from __future__ import annotations

import math
import sys
import types
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tuner.measure import reference_numpy as RN
from tuner.measure.peers import PEER_NAMES, make_peer
from tuner.measure.peers.base import PeerMasks, PeerPages, Unsupported
from tuner.measure.peers.flashinfer import LN2, FlashInferPeer, paged_kv_args
from tuner.problem import Problem

torch = pytest.importorskip("torch")

PAGED = [Problem.parse(t) for t in (
    "2x4/2x40:k100:d64:p16",  # sequence 1 shares sequence 0's first page; partial last pages
    "3x4/2x20:k70:d64:p64",  # one whole page and a partial one each; sequence 1 shares
    "4/2x[30:100,0:0,5:16,17:40]:d64:p16",  # packed: an empty sequence, a page exactly full
    "4/2x[30:100,20:64,5:16,17:40]:d64:full:p64",  # non-causal; sequence 1 shares a whole page
    "2x4/2x40:k100:d64:w30:cap20:p16",  # the window and the softcap over pages
)]


# ---- the pages in host memory, as the oracle's mirror lays them ---------------------------------
def _paged_inputs(p: Problem, seed: int = 0) -> tuple[np.ndarray, ...]:
    """(q, k, v, k_pool, v_pool): dense float64 inputs of p.as_fixed (q [B, S_q, Hq, D], k and
    v [B, S_k, Hkv, D]) with the shared rows copied as the oracle does, and the page pools
    [num_pages, page_size, Hkv, D] filled from them, every row no copy writes zero (as
    AttnBuffers allocates them)."""
    m, layout = p.as_fixed, p.pages
    rng = np.random.default_rng(seed)
    q = rng.uniform(-2, 2, (m.B, m.S, m.Hq, m.D))
    k = rng.uniform(-2, 2, (m.B, m.Sk, m.Hkv, m.D))
    v = rng.uniform(-1, 1, (m.B, m.Sk, m.Hkv, m.D))
    pools = []
    for t in (k, v):
        rows = t.reshape(-1, m.Hkv, m.D)  # dense rows: b * S_k + key, or cu_seqlens_k[b] + key
        for a, b, n in layout.shared:
            rows[b:b + n] = rows[a:a + n]
        pool = np.zeros((layout.num_pages, layout.page_size, m.Hkv, m.D))
        for c in layout.copies:
            pool[c.page, :c.rows] = rows[c.src_row:c.src_row + c.rows]
        pools.append(pool)
    return q, k, v, pools[0], pools[1]


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool, window: int,
            softcap: float, sinks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One sequence: q [s_q, Hq, D] over k, v [s_k, Hkv, D] -> (o [s_q, Hq, D], natural lse
    [Hq, s_q]), the float64 reference."""
    o, lse = RN.numpy_reference(q[None], k[None], v[None], causal, window=window,
                                softcap=softcap, sinks=sinks)
    return o[0], lse[0]


def _whole_pages(pool: Any, pages: list[int], keys: int) -> tuple[np.ndarray, np.ndarray]:
    """A sequence's key rows through its pages, and the rows of its last page past them (which
    a kernel loading whole pages multiplies by P = 0)."""
    rows = np.concatenate([np.asarray(pool[int(x)], np.float64) for x in pages]) if pages \
        else np.zeros((0, *pool.shape[2:]))
    return rows[:keys], rows[keys:]


def _nan_if_tail_nan(o: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """o plus 0 * the tail rows: what a whole-page load adds (NaN where a tail row is NaN)."""
    if tail.size == 0:
        return o
    return o + 0.0 * tail.sum(axis=0).sum(axis=0)[None, None, :]


# ---- stand-ins of the libraries, computing through the pages they are handed ------------------
class _FA3:
    """flash_attn.cute.interface's two functions as flash-attn-4 4.0.0b36 spells them; the
    varlen one reads paged K/V as whole pages of page_table[b] up to seqused_k[b] keys."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def flash_attn_func(self, q: Any, k: Any, v: Any, causal: bool = False,
                        window_size: Any = (None, None), learnable_sink: Any = None,
                        softcap: float = 0.0, return_lse: bool = False) -> Any:
        raise AssertionError("a paged problem must go to flash_attn_varlen_func")

    def flash_attn_varlen_func(self, q: Any, k: Any, v: Any, cu_seqlens_q: Any = None,
                               cu_seqlens_k: Any = None, max_seqlen_q: Any = None,
                               max_seqlen_k: Any = None, seqused_k: Any = None,
                               page_table: Any = None, causal: bool = False,
                               window_size: Any = (None, None), learnable_sink: Any = None,
                               softcap: float = 0.0, return_lse: bool = False) -> Any:
        self.calls.append(dict(q=tuple(q.shape), k=tuple(k.shape), cu_seqlens_q=cu_seqlens_q,
                               cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                               max_seqlen_k=max_seqlen_k, seqused_k=seqused_k,
                               page_table=page_table, causal=causal, window_size=window_size,
                               softcap=softcap, learnable_sink=learnable_sink))
        assert cu_seqlens_k is None and page_table.dtype == torch.int32
        assert page_table.stride(-1) == 1 and seqused_k.dtype == torch.int32
        page_size = k.shape[1]
        table, used = page_table.tolist(), seqused_k.tolist()
        if cu_seqlens_q is None:
            cu = [b * q.shape[1] for b in range(q.shape[0] + 1)]
            qr = q.reshape(-1, *q.shape[2:])
        else:
            cu, qr = cu_seqlens_q.tolist(), q
        window = 0 if window_size[0] is None else window_size[0] + 1
        sinks = None if learnable_sink is None else learnable_sink.numpy().astype(np.float64)
        out = np.zeros(qr.shape)
        lse = np.full((q.shape[-2], qr.shape[0]), -np.inf)
        for b, keys in enumerate(used):
            q0, q1 = cu[b], cu[b + 1]
            if q1 == q0:
                continue
            pages = table[b][:-(-keys // page_size)]
            kr, kt = _whole_pages(k, pages, keys)
            vr, vt = _whole_pages(v, pages, keys)
            o_b, l_b = _attend(qr[q0:q1].numpy(), kr, vr, causal, window, softcap, sinks)
            out[q0:q1] = _nan_if_tail_nan(o_b, vt)
            lse[:, q0:q1] = l_b
        o_t = torch.from_numpy(out)
        if cu_seqlens_q is None:  # [B, S_q, Hq, D] and [B, Hq, S_q]
            B, S = q.shape[:2]
            lse_t = torch.from_numpy(lse).reshape(-1, B, S).permute(1, 0, 2)
            return o_t.reshape(q.shape), lse_t if return_lse else None
        return o_t, torch.from_numpy(lse) if return_lse else None


def _flashinfer_module(log: list[dict[str, Any]]) -> types.ModuleType:
    """A stand-in ``flashinfer`` with the two wrappers of flashinfer-python 0.6.13: plan()
    records its arguments, run() computes into out / lse (base 2, as FlashInfer writes it)."""

    class _Wrapper:
        def __init__(self, workspace: Any, kv_layout: str = "NHD", backend: str = "auto") -> None:
            assert kv_layout == "NHD" and workspace.dtype == torch.uint8
            self._backend = backend
            self.plan_args: dict[str, Any] = {}

        def _finish(self, q: Any, out: Any, lse: Any, seqs: list[tuple[int, int, Any, Any]],
                    ) -> None:
            kw = self.plan_args
            window = kw.get("window_left", -1) + 1
            cap = kw.get("logits_soft_cap") or 0.0
            for q0, q1, (kr, _kt), (vr, vt) in seqs:
                if q1 == q0:
                    continue
                o_b, l_b = _attend(q[q0:q1].numpy(), kr, vr, kw["causal"], window, cap)
                out[q0:q1] = torch.from_numpy(_nan_if_tail_nan(o_b, vt)).to(out.dtype)
                if lse is not None:
                    lse[q0:q1] = torch.from_numpy(l_b.T / LN2).to(lse.dtype)  # base 2

    class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
        def plan(self, qo_indptr: Any, paged_kv_indptr: Any, paged_kv_indices: Any,
                 paged_kv_last_page_len: Any, num_qo_heads: int, num_kv_heads: int,
                 head_dim_qk: int, page_size: int, **kw: Any) -> None:
            self.plan_args = dict(qo_indptr=qo_indptr.tolist(), indptr=paged_kv_indptr.tolist(),
                                  indices=paged_kv_indices.tolist(),
                                  last=paged_kv_last_page_len.tolist(), heads=(
                                      num_qo_heads, num_kv_heads, head_dim_qk),
                                  page_size=page_size, **kw)
            self._backend = "fa3" if self._backend == "auto" else self._backend
            log.append(self.plan_args)

        def run(self, q: Any, paged_kv_cache: Any, *, out: Any = None, lse: Any = None,
                return_lse: bool = False) -> Any:
            k, v = paged_kv_cache
            kw = self.plan_args
            cu, ind, ptr, last, ps = (kw["qo_indptr"], kw["indices"], kw["indptr"], kw["last"],
                                      kw["page_size"])
            seqs = []
            for b in range(len(cu) - 1):
                pages = ind[ptr[b]:ptr[b + 1]]
                keys = max(len(pages) - 1, 0) * ps + last[b]
                seqs.append((cu[b], cu[b + 1], _whole_pages(k, pages, keys),
                             _whole_pages(v, pages, keys)))
            self._finish(q, out, lse if return_lse else None, seqs)
            return (out, lse) if return_lse else out

    class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
        def plan(self, qo_indptr: Any, kv_indptr: Any, num_qo_heads: int, num_kv_heads: int,
                 head_dim_qk: int, **kw: Any) -> None:
            self.plan_args = dict(qo_indptr=qo_indptr.tolist(), kv_indptr=kv_indptr.tolist(),
                                  heads=(num_qo_heads, num_kv_heads, head_dim_qk), **kw)
            log.append(self.plan_args)

        def run(self, q: Any, k: Any, v: Any, *, out: Any = None, lse: Any = None,
                return_lse: bool = False) -> Any:
            cu, ck = self.plan_args["qo_indptr"], self.plan_args["kv_indptr"]
            empty = np.zeros((0, *k.shape[1:]))
            seqs = [(cu[b], cu[b + 1], (k[ck[b]:ck[b + 1]].numpy().astype(np.float64), empty),
                     (v[ck[b]:ck[b + 1]].numpy().astype(np.float64), empty))
                    for b in range(len(cu) - 1)]
            self._finish(q, out, lse if return_lse else None, seqs)
            return (out, lse) if return_lse else out

    mod = types.ModuleType("flashinfer")
    mod.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper  # type: ignore
    mod.BatchPrefillWithRaggedKVCacheWrapper = BatchPrefillWithRaggedKVCacheWrapper  # type: ignore
    return mod


# ---- PeerLaunch on host tensors ------------------------------------------------------------------
class _Buf:
    def __init__(self, name: str, ptr: int) -> None:
        self.name, self.ptr = name, ptr


def _launch_on_host(monkeypatch: pytest.MonkeyPatch, peer: Any, p: Problem,
                    sinks: Any = None) -> tuple[Any, dict[str, Any], tuple[np.ndarray, ...]]:
    """A PeerLaunch over stand-in buffers whose torch views are host tensors: (launch, the
    views by name, the dense inputs). The pools' unwritten rows start as NaN."""
    from tuner.measure import launch as L

    q, k, v, kp, vp = _paged_inputs(p)
    m = p.as_fixed
    ints = {"block_table": torch.from_numpy(p.pages.block_table.copy()),
            "seqused_k": torch.tensor(p.seqlens_k or (p.Sk,) * p.B, dtype=torch.int32),
            "cu_q": torch.tensor(p.cu_seqlens() if p.is_varlen else [0], dtype=torch.int32),
            "cu_k": torch.tensor(p.cu_seqlens_k() if p.is_varlen else [0], dtype=torch.int32)}
    views = {"q": torch.from_numpy(q), "k": torch.from_numpy(kp), "v": torch.from_numpy(vp),
             "o": torch.zeros(m.B, m.S, m.Hq, m.D, dtype=torch.float64),
             "lse": torch.full((m.B, m.Hq, m.S), math.nan, dtype=torch.float64)}
    bufs = SimpleNamespace(shape=p, q=_Buf("q", 16), k=_Buf("k", 32), v=_Buf("v", 48),
                           o=_Buf("o", 64), lse=_Buf("lse", 80), sinks=None,
                           layout_bufs={"k_pages": _Buf("k_pages", 96),
                                        "v_pages": _Buf("v_pages", 112)},
                           **{n: _Buf(n, 128 + 16 * i) for i, n in enumerate(ints)})
    monkeypatch.setattr(L, "torch_views", lambda b: tuple(views[n] for n in
                                                          ("q", "k", "v", "o", "lse")))
    monkeypatch.setattr(L, "_i32", lambda buf, shape: ints[buf.name].reshape(shape))
    monkeypatch.setattr(L, "peer_masks", lambda b: PeerMasks(p.window, p.softcap, sinks))
    monkeypatch.setattr(L.PeerLaunch, "_stream_ctx", lambda self, s: nullcontext())
    launch = L.PeerLaunch(peer)
    launch.forward(bufs, None)
    launch.collect(bufs, None)
    return launch, views, (q, k, v)


def _reference(p: Problem, q: np.ndarray, k: np.ndarray, v: np.ndarray,
               sinks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The float64 reference laid out as the views: [B, S_q, Hq, D] and [B, Hq, S_q]."""
    o, lse = RN.numpy_reference_for(p, q, k, v, sinks)
    if p.is_varlen:
        return o[None], lse[None]
    return o, lse


# ---- which peer reads pages ----------------------------------------------------------------
@pytest.mark.parametrize("page_size", [8, 16, 64, 128, 256, 4096])
def test_fa3_and_flashinfer_take_every_page_size_the_others_decline(page_size: int) -> None:
    """FA3 takes every page size fa-tune makes (TMA at one key tile, cp.async otherwise) and
    FlashInfer too (a fastdiv per row); cuDNN, FA2, Triton and the memory-efficient backend read
    K and V as tensors: one line each, naming the paged cache."""
    for text in (f"2x8/2x256:k1000:p{page_size}", f"8/2x[100:300,0:64]:p{page_size}"):
        p = Problem.parse(text)
        assert make_peer("fa3").supports(p) is None
        assert make_peer("flashinfer").supports(p) is None
        for name in ("cudnn", "fa2", "triton", "mem_efficient"):
            why = make_peer(name).supports(p) or ""
            assert "a paged KV cache" in why and str(p) in why and "\n" not in why, (name, why)


def test_flashinfer_declines_in_one_line_what_it_cannot_express() -> None:
    """Sinks (its fa2 / fa3 modules drop run()'s sinks), k and v over [B, Hkv, S_k, D] memory
    (no [total_k, Hkv, D] rows of one stride); a window and a softcap it takes."""
    fi = make_peer("flashinfer")
    for text, needle in (("1x8/2x256:sinks:p16", "attention sinks"),
                         ("8/2x[100:300]:w64:sinks:p64", "attention sinks"),
                         ("1x8/2x256:k512:bhsd", "[B, Hkv, S_k, D] memory"),
                         ("1x8/2x256:sinks:bhsd", "attention sinks (it cannot express it "
                          "exactly); k and v over")):
        p = Problem.parse(text)
        why = fi.supports(p) or ""
        assert needle in why and why.startswith(f"flashinfer cannot run {p}: "), why
        assert "\n" not in why
    for text in ("1x8/2x256:w64:cap30:p16", "1x8x256:qkv", "1x8/2x256:d256:full", "1x8x64:d64"):
        assert fi.supports(Problem.parse(text)) is None, text
    assert "flashinfer" in PEER_NAMES


def test_paged_kv_args_follow_the_block_table() -> None:
    """indptr / indices / last_page_len of each sequence's first ceil(keys / page_size) table
    entries; a shared page listed under every sequence that reads it; 0 pages and last 0 for a
    sequence without keys; last = page_size for a full last page; a short row is an error."""
    p = Problem.parse("4/2x[30:100,0:0,5:16,17:40]:p16")
    table = p.pages.block_table
    indptr, indices, last = paged_kv_args(table.tolist(), p.seqlens_k, 16)
    assert indptr == [0, 7, 7, 8, 11] and last == [4, 0, 16, 8]
    assert indices[:7] == table[0, :7].tolist() and indices[8:] == table[3, :3].tolist()
    assert indices[8] == indices[0]  # sequence 3 reads sequence 0's first page
    assert len(set(indices)) == p.pages.num_pages == 10
    with pytest.raises(ValueError, match="need 3 pages of 16 rows"):
        paged_kv_args([[0, 1]], [33], 16)


# ---- the arguments and the results through PeerLaunch ---------------------------------------
@pytest.mark.parametrize("p", PAGED, ids=str)
def test_fa3_reads_the_pages_through_page_table(monkeypatch: pytest.MonkeyPatch,
                                                p: Problem) -> None:
    """flash_attn_varlen_func for fixed and packed queries alike: k, v the pools, page_table
    the int32 [B, max_pages] table, seqused_k the key counts, max_seqlen_k the longest,
    cu_seqlens_q / max_seqlen_q only packed, never cu_seqlens_k; O and the LSE those of the
    dense reference (through whole pages, the unused rows zero)."""
    from tuner.measure.peers.fa3 import FA3Peer

    fa3, peer = _FA3(), FA3Peer()
    peer._fn, peer._varlen_fn = fa3.flash_attn_func, fa3.flash_attn_varlen_func
    launch, views, (q, k, v) = _launch_on_host(monkeypatch, peer, p)
    call = fa3.calls[-1]
    layout, m = p.pages, p.as_fixed
    assert call["k"] == (layout.num_pages, layout.page_size, m.Hkv, m.D)
    assert call["page_table"].tolist() == layout.block_table.tolist()
    assert call["seqused_k"].tolist() == list(p.seqlens_k or (p.Sk,) * p.B)
    assert call["max_seqlen_k"] == p.Sk and call["cu_seqlens_k"] is None
    if p.is_varlen:
        assert call["q"] == (p.tokens_q, p.Hq, p.D) and call["max_seqlen_q"] == p.S
        assert call["cu_seqlens_q"].tolist() == p.cu_seqlens()
    else:
        assert call["q"] == (p.B, p.S, p.Hq, p.D) and call["cu_seqlens_q"] is None
    assert call["window_size"] == ((p.window - 1, 0) if p.window else (None, None))
    assert call["softcap"] == p.softcap
    o_ref, lse_ref = _reference(p, q, k, v)
    np.testing.assert_allclose(views["o"].numpy(), o_ref, atol=1e-9)
    assert launch.writes_lse
    np.testing.assert_allclose(views["lse"].numpy(), lse_ref, atol=1e-9)
    d = launch.details()
    assert d["call"].endswith("flash_attn_varlen_func") and d["page_size"] == layout.page_size


def test_fa3_paged_with_sinks_and_an_old_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sinks reach FA3 over pages too (learnable_sink); an installed flash_attn_varlen_func
    without page_table declines a paged problem at prepare, in one line."""
    from tuner.measure.peers.fa3 import FA3Peer

    p = Problem.parse("2x4/2x40:k100:d64:sinks:p16")
    sinks = np.random.default_rng(3).uniform(-1, 1, p.Hq).astype(np.float32)
    fa3, peer = _FA3(), FA3Peer()
    peer._fn, peer._varlen_fn = fa3.flash_attn_func, fa3.flash_attn_varlen_func
    _, views, (q, k, v) = _launch_on_host(monkeypatch, peer, p, torch.from_numpy(sinks))
    o_ref, lse_ref = _reference(p, q, k, v, sinks)
    np.testing.assert_allclose(views["o"].numpy(), o_ref, atol=1e-9)
    np.testing.assert_allclose(views["lse"].numpy(), lse_ref, atol=1e-9)

    def old_varlen(q: Any, k: Any, v: Any, cu_seqlens_q: Any = None, cu_seqlens_k: Any = None,
                   max_seqlen_q: Any = None, max_seqlen_k: Any = None, causal: bool = False,
                   return_lse: bool = False) -> Any:
        return q, None

    peer = FA3Peer()
    peer._fn = peer._varlen_fn = old_varlen
    pages = PeerPages(16, torch.zeros(2, 7, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                      100)
    qt, kv = torch.zeros(2, 40, 4, 64), torch.zeros(13, 16, 2, 64)
    with pytest.raises(Unsupported, match=r"old_varlen takes no page_table, seqused_k \(") as e:
        peer.prepare(qt, kv, kv, True, pages=pages)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("p", PAGED, ids=str)
def test_flashinfer_plans_the_pages_and_converts_its_lse(monkeypatch: pytest.MonkeyPatch,
                                                         p: Problem) -> None:
    """BatchPrefillWithPagedKVCacheWrapper planned once in prepare (qo_indptr from the query
    lengths, the page arguments from the block table, heads, page size, causal, window_left =
    W - 1, logits_soft_cap), run into the output and LSE it allocated; O is the reference's,
    and its base-2 LSE comes back in natural log as [B, Hq, S_q]."""
    log: list[dict[str, Any]] = []
    monkeypatch.setitem(sys.modules, "flashinfer", _flashinfer_module(log))
    peer = FlashInferPeer()
    launch, views, (q, k, v) = _launch_on_host(monkeypatch, peer, p)
    assert len(log) == 1  # planned once: the runs reuse it
    plan = log[0]
    layout = p.pages
    used = list(p.seqlens_k or (p.Sk,) * p.B)
    want = paged_kv_args(layout.block_table.tolist(), used, layout.page_size)
    assert (plan["indptr"], plan["indices"], plan["last"]) == want
    assert plan["qo_indptr"] == (p.cu_seqlens() if p.is_varlen
                                 else [b * p.S for b in range(p.B + 1)])
    assert plan["heads"] == (p.Hq, p.Hkv, p.D) and plan["page_size"] == layout.page_size
    assert plan["causal"] is p.causal and plan["non_blocking"] is False
    assert plan.get("window_left", -1) == p.window - 1
    assert (plan.get("logits_soft_cap") or 0.0) == p.softcap
    o_ref, lse_ref = _reference(p, q, k, v)
    np.testing.assert_allclose(views["o"].numpy(), o_ref, atol=1e-9)
    assert launch.writes_lse
    np.testing.assert_allclose(views["lse"].numpy(), lse_ref, atol=1e-9)
    d = launch.details()
    assert d["call"] == "flashinfer.BatchPrefillWithPagedKVCacheWrapper.run"
    assert d["backend"] == "fa3" and d["page_size"] == layout.page_size
    launch.release()
    assert peer._wrapper is None and peer.lse() is None


@pytest.mark.parametrize("text", ["2x4/2x40:k100:d64", "3x4/2x50:d64:full:w20",
                                  "4/2x[30:100,0:0,5:16,17:40]:d64:cap20"])
def test_flashinfer_without_pages_goes_ragged(text: str) -> None:
    """A problem without pages: BatchPrefillWithRaggedKVCacheWrapper over [total, H, D] rows
    (a fixed batch's views flattened without a copy; kv_indptr b * S_k or cu_seqlens_k); a
    view that cannot be flattened so is declined at prepare, never copied."""
    p = Problem.parse(text)
    log: list[dict[str, Any]] = []
    mod = _flashinfer_module(log)
    sys.modules["flashinfer"] = mod
    try:
        m = p.as_fixed
        rng = np.random.default_rng(1)
        q = rng.uniform(-2, 2, (m.B, m.S, m.Hq, m.D))
        k = rng.uniform(-2, 2, (m.B, m.Sk, m.Hkv, m.D))
        v = rng.uniform(-1, 1, (m.B, m.Sk, m.Hkv, m.D))
        peer = FlashInferPeer()
        varlen = None
        if p.is_varlen:
            varlen = (torch.tensor(p.cu_seqlens(), dtype=torch.int32),
                      torch.tensor(p.cu_seqlens_k(), dtype=torch.int32), p.S, p.Sk)
        masks = PeerMasks(p.window, p.softcap)
        peer.prepare(*(torch.from_numpy(x) for x in (q, k, v)), p.causal, varlen,
                     masks=masks if masks.any else None)
        assert log[-1]["kv_indptr"] == (p.cu_seqlens_k() if p.is_varlen
                                        else [b * p.Sk for b in range(p.B + 1)])
        o_ref, lse_ref = _reference(p, q, k, v)
        np.testing.assert_allclose(peer.run().numpy(), o_ref, atol=1e-9)
        np.testing.assert_allclose(peer.lse().numpy(), lse_ref, atol=1e-9)
        if not p.is_varlen:  # k over [B, Hkv, S_k, D] memory: no [total, H, D] view
            kt = torch.from_numpy(k).transpose(1, 2).contiguous().transpose(1, 2)
            with pytest.raises(Unsupported, match="rows of one stride"):
                peer.prepare(torch.from_numpy(q), kt, kt, p.causal)
        with pytest.raises(Unsupported, match="no attention sinks"):
            peer.prepare(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                         p.causal, varlen, masks=PeerMasks(sinks=torch.zeros(p.Hq)))
    finally:
        del sys.modules["flashinfer"]


def test_flashinfer_names_a_missing_toolchain(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Any) -> None:
    """Its JIT runs ninja and nvcc on every plan: a missing one is the reason it is
    unavailable, found where flashinfer looks ($CUDA_HOME, PATH, /usr/local/cuda)."""
    from tuner.measure.peers import flashinfer as F

    monkeypatch.setattr(F.shutil, "which", lambda name: None)
    assert "ninja executable, not on PATH" in (F.toolchain_reason() or "")
    monkeypatch.setattr(F.shutil, "which", lambda name: f"/bin/{name}")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert f"nvcc, not found ({tmp_path}/bin/nvcc)" in (F.toolchain_reason() or "")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    assert F.toolchain_reason() is None
