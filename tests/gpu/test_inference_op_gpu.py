"""On the GPU: the op as inference calls attention (issue 34), through a real workload export
with three buckets (Llama-3-8B's heads): short (S_q <= 2048, preset default), long (the rest,
preset multicast) and chunk (S_q <= 2048 over 4096 keys or more, preset static: the dispatcher
picks by both lengths). Against an FP32 torch reference with FlashAttention's bottom-right
causal mask: queries over a longer KV (fixed length, 2048 over 8192 among them), packed
batches with separate query and key lengths, caches with per-sequence lengths (cache_seqlens),
strided views read in place (fused QKV, transformers' [B, H, S, D] cache) and a view that must
be copied; torch.compile(fullgraph=True) and CUDA graphs; and every kind of malformed device
metadata: one clear ValueError, NaN outputs, nothing read out of bounds, and the CUDA context
used again after each (a normal call gives correct results). Needs torch with CUDA."""

from __future__ import annotations

import warnings

import pytest
from op_exports import export_and_load

pytestmark = pytest.mark.gpu
from op_exports import cuda_torch  # noqa: E402

torch = cuda_torch()
ops = pytest.importorskip("tuner.ship.fa_tune_ops")
from tuner.ship.fa_tune_ops import checks  # noqa: E402

F = torch.nn.functional
BF16 = torch.bfloat16
HQ, HKV, D = 32, 8, 128
WORKLOAD = {
    "name": "infer",
    "attention": {"Hq": HQ, "Hkv": HKV, "head_dim": D, "causal": True},
    "buckets": [{"name": "short", "max_s": 2048}, {"name": "long", "max_s": None},
                {"name": "chunk", "max_s": 2048, "k": {"min": 4096}}],
    "traffic": {"shapes": [{"S": 1024}, {"S": 8192}, {"S": 2048, "Sk": 8192}]},
}


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory):
    _, loaded = export_and_load(ops, tmp_path_factory.mktemp("infer"), WORKLOAD, {
        "short": "preset:default", "long": "preset:multicast", "chunk": "preset:static"})
    assert [loaded.bucket_for(HQ, HKV, *s) for s in ((2048, 8192), (2048, 2048), (4096, 8192))] \
        == [0, 1, 2]  # chunk, short, long (key-range buckets first)
    return loaded


def _randn(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=BF16, generator=g)


def _qkv(B: int, Sq: int, Sk: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    return (_randn(B, Sq, HQ, D, seed=seed), _randn(B, Sk, HKV, D, seed=seed + 1),
            _randn(B, Sk, HKV, D, seed=seed + 2))


def _ref_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
             dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, q [Sq, Hq, D] over k/v [Sk, Hkv, D]: (out [Sq, Hq, D], lse [Hq, Sq]) with
    the bottom-right causal mask (query i sees keys 0 .. i + Sk - Sq); a row that sees no key
    gives 0 and -inf, as the kernel does."""
    sq, sk = q.shape[0], k.shape[0]
    scale = scale or D ** -0.5
    kk = k.to(dtype).repeat_interleave(HQ // HKV, dim=1)
    vv = v.to(dtype).repeat_interleave(HQ // HKV, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.to(dtype), kk).float() * scale
    keep = (torch.arange(sk, device="cuda")[None, :]
            <= torch.arange(sq, device="cuda")[:, None] + (sk - sq))
    s.masked_fill_(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", p.to(dtype), vv)
    return out, lse


def _ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw) -> tuple[torch.Tensor, ...]:
    outs, lses = zip(*(_ref_one(q[b], k[b], v[b], **kw) for b in range(q.shape[0])),
                     strict=True)
    return torch.stack(outs), torch.stack(lses)


def _close(out: torch.Tensor, lse: torch.Tensor, q, k, v, **kw) -> None:
    """out within twice BF16 attention's own error of the FP32 reference (+1e-3), lse 2e-2."""
    ref, ref_lse = _ref(q, k, v, **kw)
    err = (out.float() - ref).abs().max().item()
    bf16, _ = _ref(q, k, v, dtype=BF16, **kw)
    err_bf16 = (bf16.float() - ref).abs().max().item()
    assert err <= 2 * err_bf16 + 1e-3, (err, err_bf16)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 2e-2


@pytest.mark.parametrize("B, Sq, Sk, scale", [
    (1, 2048, 8192, None),   # chunk: a chunked prefill's chunk over all keys so far
    (1, 512, 16384, None),   # chunk
    (2, 1000, 3000, None),   # short: a prompt continuing a cached prefix
    (1, 4096, 4100, 0.05),   # long
    (2, 1, 777, None),       # short: one query sees every key
    (1, 1500, 1500, None),   # short: a fresh prompt
])
def test_queries_over_a_longer_kv(lib, B: int, Sq: int, Sk: int, scale) -> None:
    q, k, v = _qkv(B, Sq, Sk, seed=Sq)
    out, lse = ops.attention(q, k, v, True, scale)
    assert out.shape == q.shape and lse.shape == (B, HQ, Sq)
    _close(out, lse, q, k, v, scale=scale)


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                        device="cuda")


def test_packed_with_separate_query_and_key_lengths(lib) -> None:
    lq = [1000, 1, 0, 333, 2048, 64]
    lk = [3000, 1, 5, 333, 2048, 5000]
    q = _randn(sum(lq), HQ, D, seed=10)
    k, v = _randn(sum(lk), HKV, D, seed=11), _randn(sum(lk), HKV, D, seed=12)
    out, lse = ops.attention(q, k, v, cu_seqlens_q=_cu(lq), cu_seqlens_k=_cu(lk),
                             max_seqlen_q=max(lq), max_seqlen_k=max(lk))
    assert out.shape == q.shape and lse.shape == (HQ, sum(lq))
    a = b = 0
    for nq, nk in zip(lq, lk, strict=True):
        if nq:
            _close(out[None, a:a + nq], lse[None, :, a:a + nq], q[None, a:a + nq],
                   k[None, b:b + nk], v[None, b:b + nk])
        a, b = a + nq, b + nk


def test_cache_seqlens(lib) -> None:
    """q [B, 64] over caches of 4096 rows, each entry using its first cache_seqlens[b] keys;
    an entry with fewer keys than queries leaves its first rows without a key (0, -inf)."""
    q, k, v = _qkv(4, 64, 4096, seed=20)
    lens = [4096, 100, 2000, 30]
    out, lse = ops.attention(q, k, v, cache_seqlens=torch.tensor(lens, dtype=torch.int32,
                                                                 device="cuda"))
    for b, n in enumerate(lens):
        _close(out[b:b + 1], lse[b:b + 1], q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n])
    # Packed queries over the same caches.
    lq = [64, 10, 64, 1]
    qp = _randn(sum(lq), HQ, D, seed=21)
    out, lse = ops.attention(qp, k, v, cu_seqlens_q=_cu(lq), max_seqlen_q=64,
                             cache_seqlens=torch.tensor(lens, dtype=torch.int32, device="cuda"))
    a = 0
    for b, (nq, n) in enumerate(zip(lq, lens, strict=True)):
        _close(out[None, a:a + nq], lse[None, :, a:a + nq], qp[None, a:a + nq],
               k[b:b + 1, :n], v[b:b + 1, :n])
        a += nq


def test_strided_views_are_read_in_place(lib) -> None:
    """Fused QKV views and a [B, H, S, D] cache give exactly what dense copies give."""
    fused = _randn(2, 1024, HQ + 2 * HKV, D, seed=30)
    q, k, v = fused[:, :, :HQ], fused[:, :, HQ:HQ + HKV], fused[:, :, HQ + HKV:]
    with warnings.catch_warnings():
        warnings.simplefilter("error", checks.CopyWarning)
        out, lse = ops.attention(q, k, v)
        want = ops.attention(q.contiguous(), k.contiguous(), v.contiguous())
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
        cache_k = _randn(1, HKV, 6000, D, seed=31)  # transformers' cache memory
        cache_v = _randn(1, HKV, 6000, D, seed=32)
        qc = _randn(1, 512, HQ, D, seed=33)
        out, lse = ops.attention(qc, cache_k.transpose(1, 2), cache_v.transpose(1, 2))
        dense = (cache_k.transpose(1, 2).contiguous(), cache_v.transpose(1, 2).contiguous())
        want = ops.attention(qc, *dense)
        assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    _close(out, lse, qc, *dense)


def test_a_view_tma_cannot_read_is_copied(lib) -> None:
    q, k, v = _qkv(1, 256, 256, seed=40)
    flat = torch.empty(k.numel() + 1, device="cuda", dtype=BF16)
    odd = flat[1:].view(k.shape)  # 2 bytes past a 16-byte boundary
    odd.copy_(k)
    checks._warned.clear()
    with pytest.warns(checks.CopyWarning, match="copies k"):
        out, lse = ops.attention(q, odd, v)
    want = ops.attention(q, k, v)
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])


def test_compile_fullgraph(lib) -> None:
    def f(q, k, v, cu_q, cu_k, lens):
        a, _ = torch.ops.fa_tune.attention(q, k, v, True, None)
        b, _ = torch.ops.fa_tune.attention(q[0], k[0], v[0], True, None, cu_q, cu_k, 700, 1300)
        c, _ = torch.ops.fa_tune.attention(q, k, v, True, None, None, None, None, None, lens)
        return a.float() * 2, b, c

    q, k, v = _qkv(1, 1000, 2000, seed=50)
    args = (q, k, v, _cu([300, 700]), _cu([700, 1300]),
            torch.tensor([1500], dtype=torch.int32, device="cuda"))
    eager = f(*args)
    compiled = torch.compile(f, fullgraph=True)(*args)
    for e, c in zip(eager, compiled, strict=True):
        assert torch.equal(e, c)


def test_cuda_graphs(lib) -> None:
    """Fixed length over a longer KV (its setup run before the capture), a packed batch and a
    cache (first used inside the capture): replays equal eager calls on new data."""
    q, k, v = _qkv(1, 2048, 8192, seed=60)
    qp, kp = _randn(3000, HQ, D, seed=61), _randn(7000, HKV, D, seed=62)
    cu_q, cu_k = _cu([1000, 2000]), _cu([3000, 4000])
    lens = torch.tensor([5000], dtype=torch.int32, device="cuda")
    ops.attention(q, k, v)  # the fixed-length shape's one-time setup
    torch.cuda.synchronize()

    def calls():
        return (ops.attention(q, k, v), ops.attention(qp, kp, kp, True, None, cu_q, cu_k, 2000,
                                                      4000),
                ops.attention(q, k, v, cache_seqlens=lens))

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = calls()
    for seed in (63, 64):
        nq, nk, nv = _qkv(1, 2048, 8192, seed=seed)
        q.copy_(nq)
        k.copy_(nk)
        v.copy_(nv)
        kp.copy_(_randn(7000, HKV, D, seed=seed + 10))
        lens.fill_(3000 + seed)
        graph.replay()
        want = calls()
        torch.cuda.synchronize()
        for (o, lse), (wo, wl) in zip(outs, want, strict=True):
            assert torch.equal(o, wo) and torch.equal(lse, wl)


# ---- malformed device metadata --------------------------------------------------------------
LQ, LK = [700, 300, 1000], [1500, 300, 2200]  # a good batch: 2000 query, 4000 key rows


# (what, the fields that break it, what the error says); everything else as the good batch.
BAD_CASES = [
    ("cu_seqlens_q not monotonic", {"cu_q": [0, 700, 600, 2000]}, "cu_seqlens_q does not"),
    ("cu_seqlens_q past the end", {"cu_q": [0, 700, 1000, 2600]}, "cu_seqlens_q does not"),
    ("cu_seqlens_q negative", {"cu_q": [0, -5, 1000, 2000]}, "cu_seqlens_q does not"),
    ("cu_seqlens_q not from 0", {"cu_q": [4, 700, 1000, 2000]}, "cu_seqlens_q does not"),
    ("cu_seqlens_k not monotonic", {"cu_k": [0, 1500, 1400, 4000]}, "cu_seqlens_k does not"),
    ("cu_seqlens_k past the end", {"cu_k": [0, 1500, 1800, 1 << 30]}, "cu_seqlens_k does not"),
    ("cu_seqlens_k negative", {"cu_k": [0, 1500, -1800, 4000]}, "cu_seqlens_k does not"),
    ("max_seqlen_q too small", {"max_q": 500}, "a query length exceeds max_seqlen_q"),
    ("max_seqlen_k too small", {"max_k": 1000}, "a key length exceeds max_seqlen_k"),
    ("seqused_k negative", {"seqused": [1500, -1, 2200]}, "seqused_k is negative"),
    ("seqused_k past its keys", {"seqused": [1500, 301, 2200]}, "seqused_k is negative or "
                                                                 "exceeds"),
]


def _packed_call(case: dict, seed: int = 70):
    q = _randn(2000, HQ, D, seed=seed)
    k, v = _randn(4000, HKV, D, seed=seed + 1), _randn(4000, HKV, D, seed=seed + 2)
    ints = {"dtype": torch.int32, "device": "cuda"}
    cu_q = torch.tensor(case.get("cu_q", [0, 700, 1000, 2000]), **ints)
    cu_k = torch.tensor(case.get("cu_k", [0, 1500, 1800, 4000]), **ints)
    seqused = torch.tensor(case["seqused"], **ints) if "seqused" in case else None
    out, lse = ops.attention(q, k, v, True, None, cu_q, cu_k, case.get("max_q", 1000),
                             case.get("max_k", 2200), seqused)
    return (q, k, v), out, lse


def _context_still_works() -> None:
    """A normal call after a bad batch gives correct results: the context is usable."""
    q, k, v = _qkv(1, 300, 900, seed=80)
    out, lse = ops.attention(q, k, v)
    torch.cuda.synchronize()
    _close(out, lse, q, k, v)


@pytest.mark.parametrize("name, case, needle", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_malformed_metadata_never_faults(lib, name: str, case: dict, needle: str) -> None:
    # Default: no sync; the next call on the device raises.
    _, out, lse = _packed_call(case)
    torch.cuda.synchronize()
    assert out.isnan().all() and lse.isnan().all(), name  # nothing computed, nothing stale
    with pytest.raises(ValueError) as e:
        ops.attention(*_qkv(1, 64, 64, seed=1))
    msg = str(e.value)
    assert msg.startswith("fa_tune::attention: an earlier call on cuda:") and needle in msg
    assert "its out and lse are NaN" in msg and "\n" not in msg
    _context_still_works()
    # check(): synchronise and raise at once.
    _packed_call(case)
    with pytest.raises(ValueError, match=needle):
        ops.check()
    _context_still_works()
    # Sync-check mode: the call itself raises.
    ops.set_sync_check(True)
    try:
        with pytest.raises(ValueError, match=f"this call on cuda:.*{needle}"):
            _packed_call(case)
    finally:
        ops.set_sync_check(False)
    _context_still_works()


def test_rows_past_the_last_offsets_are_padding(lib) -> None:
    """cu_seqlens ending before q's and k's rows (a CUDA graph's padded batch, as FlashAttention
    allows): the sequences are computed, the padding rows are not touched, nothing is flagged."""
    q = _randn(2000, HQ, D, seed=90)
    k, v = _randn(4000, HKV, D, seed=91), _randn(4000, HKV, D, seed=92)
    lq, lk = [700, 300, 900], [1500, 300, 1200]  # 1900 of 2000 query rows, 3000 of 4000 keys
    out, lse = ops.attention(q, k, v, cu_seqlens_q=_cu(lq), cu_seqlens_k=_cu(lk),
                             max_seqlen_q=max(lq), max_seqlen_k=max(lk))
    ops.check()  # raises if the schedule flagged the metadata
    a = b = 0
    for nq, nk in zip(lq, lk, strict=True):
        _close(out[None, a:a + nq], lse[None, :, a:a + nq], q[None, a:a + nq],
               k[None, b:b + nk], v[None, b:b + nk])
        a, b = a + nq, b + nk
    _context_still_works()


def test_malformed_cache_seqlens_on_a_fixed_length_cache(lib) -> None:
    q, k, v = _qkv(2, 64, 1024, seed=90)
    for lens in ([1024, -3], [1025, 10]):
        out, lse = ops.attention(q, k, v, cache_seqlens=torch.tensor(lens, dtype=torch.int32,
                                                                     device="cuda"))
        with pytest.raises(ValueError, match="seqused_k is negative or exceeds the keys its "
                                             "sequence holds"):
            ops.check()
        assert out.isnan().all() and lse.isnan().all()
        _context_still_works()


def test_a_good_batch_after_the_bad_ones(lib) -> None:
    (q, k, v), out, lse = _packed_call({})
    ops.check()
    a = b = 0
    for nq, nk in zip(LQ, LK, strict=True):
        _close(out[None, a:a + nq], lse[None, :, a:a + nq], q[None, a:a + nq],
               k[None, b:b + nk], v[None, b:b + nk])
        a, b = a + nq, b + nk
