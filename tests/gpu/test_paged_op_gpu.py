"""On the GPU: the op over a paged KV cache (issue 37, C ABI 5), through a library built for a
paged class (preset default, D 128, causal, varlen, paged). Pages in a random order, against an
FP32 reference over the same keys gathered into sequences and against the same library's
fixed-length (unpaged) kernel; fixed and packed q; a block table changed in place between CUDA
graph replays (the kernel reads it at run time); out-of-range entries: one clear ValueError,
NaN outputs, nothing read out of bounds, the context used again after; and the C++ launch path
building the same call as the Python one. Needs torch with CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prebuild import Artifact

from tuner.kernel import build
from tuner.kernel.config import load_preset
from tuner.problem import ProblemClass

PAGED = Artifact(load_preset("default"), ProblemClass(128, True, True, paged=True))
pytestmark = [pytest.mark.gpu, pytest.mark.builds(PAGED)]
from op_exports import cuda_torch  # noqa: E402

torch = cuda_torch()
ops = pytest.importorskip("tuner.ship.fa_tune_ops")

BF16 = torch.bfloat16
HQ, HKV, D = 32, 8, 128
UNUSED = 1 << 30  # table entries no sequence needs: never read, so never checked


@pytest.fixture(scope="module")
def lib_path() -> Path:
    res = build.build_config(PAGED.config, pclass=PAGED.pclass)
    assert res.unfit is None, res.unfit
    return Path(res.so_path)


@pytest.fixture
def lib(lib_path: Path):
    loaded = ops.load(str(lib_path))
    assert loaded.paged and loaded.varlen and loaded.head_dim == D
    return loaded


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=BF16, generator=_gen(seed))


def _pool(num_pages: int, page_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v pages [num_pages, page_size, Hkv, D], every row finite (rows past a sequence's
    keys in its last page are read and masked: fa_tune.h)."""
    return (_randn(num_pages, page_size, HKV, D, seed=seed),
            _randn(num_pages, page_size, HKV, D, seed=seed + 1))


def _table(lens: list[int], page_size: int, num_pages: int, max_pages: int,
           seed: int) -> torch.Tensor:
    """[B, max_pages] int32: each sequence's pages drawn at random from the pool, distinct; the
    entries past those it needs hold UNUSED."""
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).tolist()
    rows = []
    for n in lens:
        need = -(-n // page_size)
        assert need <= max_pages and need <= len(order)
        rows.append(order[:need] + [UNUSED] * (max_pages - need))
        order = order[need:]
    return torch.tensor(rows, dtype=torch.int32, device="cuda")


def _gather(pages: torch.Tensor, row: torch.Tensor, n: int) -> torch.Tensor:
    """A sequence's n keys [n, Hkv, D] out of the pages its table row names."""
    need = -(-n // pages.shape[1])
    return pages[row[:need].long()].reshape(-1, HKV, D)[:n]


def _ref_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """q [Sq, Hq, D] over k/v [Sk, Hkv, D], bottom-right causal: (out [Sq, Hq, D], lse [Hq, Sq]);
    a row that sees no key gives 0 and -inf, as the kernel does."""
    sq, sk = q.shape[0], k.shape[0]
    kk = k.to(dtype).repeat_interleave(HQ // HKV, dim=1)
    vv = v.to(dtype).repeat_interleave(HQ // HKV, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.to(dtype), kk).float() * D ** -0.5
    keep = (torch.arange(sk, device="cuda")[None, :]
            <= torch.arange(sq, device="cuda")[:, None] + (sk - sq))
    s.masked_fill_(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p.to(dtype), vv), lse


def _close(out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
           v: torch.Tensor) -> None:
    """One sequence: out within twice BF16 attention's own error of the FP32 reference
    (+1e-3), lse 2e-2."""
    ref, ref_lse = _ref_one(q, k, v)
    bf16, _ = _ref_one(q, k, v, dtype=BF16)
    err = (out.float() - ref).abs().max().item()
    err_bf16 = (bf16.float() - ref).abs().max().item()
    assert err <= 2 * err_bf16 + 1e-3, (err, err_bf16)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert (lse[fin] - ref_lse[fin]).abs().max().item() < 2e-2


def _check_fixed(out, lse, q, kp, vp, table, lens) -> None:
    for b, n in enumerate(lens):
        _close(out[b], lse[b], q[b], _gather(kp, table[b], n), _gather(vp, table[b], n))


@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_paged_matches_the_reference(lib, page_size: int) -> None:
    lens = [1000, 300, 513]
    max_pages = -(-max(lens) // page_size) + 3  # spare entries: UNUSED, never read
    num_pages = sum(-(-n // page_size) for n in lens) + 5
    kp, vp = _pool(num_pages, page_size, seed=page_size)
    table = _table(lens, page_size, num_pages, max_pages, seed=page_size)
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    # q fixed length: each sequence's 128 queries are its last 128 positions
    q = _randn(3, 128, HQ, D, seed=1)
    out, lse = ops.attention(q, kp, vp, cache_seqlens=used, page_table=table)
    ops.check()
    assert out.shape == q.shape and lse.shape == (3, HQ, 128)
    _check_fixed(out, lse, q, kp, vp, table, lens)
    # packed q (flash_attn_varlen_func's page_table form), one sequence longer than 128
    lq = [100, 37, 513]
    qp = _randn(sum(lq), HQ, D, seed=2)
    cu = torch.tensor([0, 100, 137, 650], dtype=torch.int32, device="cuda")
    out, lse = ops.attention(qp, kp, vp, cu_seqlens_q=cu, max_seqlen_q=513, seqused_k=used,
                             block_table=table)
    ops.check()
    assert out.shape == qp.shape and lse.shape == (HQ, sum(lq))
    a = 0
    for b, (nq, nk) in enumerate(zip(lq, lens, strict=True)):
        _close(out[a:a + nq], lse[:, a:a + nq], qp[a:a + nq], _gather(kp, table[b], nk),
               _gather(vp, table[b], nk))
        a += nq


def test_paged_matches_the_unpaged_op(lib) -> None:
    """Equal lengths: the paged call against the same library's fixed-length kernel over the
    same keys laid out densely."""
    B, S, ps = 2, 1024, 64
    kp, vp = _pool(40, ps, seed=7)
    table = _table([S, S], ps, 40, S // ps, seed=7)
    q = _randn(B, S, HQ, D, seed=8)
    k = torch.stack([_gather(kp, table[b], S) for b in range(B)])
    v = torch.stack([_gather(vp, table[b], S) for b in range(B)])
    paged, paged_lse = ops.attention(q, kp, vp, block_table=table)  # max_seqlen_k keys each
    dense, dense_lse = ops.attention(q, k, v)
    ops.check()
    assert (paged.float() - dense.float()).abs().max().item() < 2e-2
    assert (paged_lse - dense_lse).abs().max().item() < 1e-3
    _check_fixed(paged, paged_lse, q, kp, vp, table, [S, S])


def test_a_table_changed_between_cuda_graph_replays(lib) -> None:
    """The graph holds the table's address; each replay attends through the entries (and
    seqused_k) it finds there."""
    ps, num_pages, max_pages = 64, 64, 16
    kp, vp = _pool(num_pages, ps, seed=20)
    q = _randn(2, 128, HQ, D, seed=21)
    lens_a, lens_b = [700, 450], [300, 1000]
    table = _table(lens_a, ps, num_pages, max_pages, seed=22)
    used = torch.tensor(lens_a, dtype=torch.int32, device="cuda")
    ops.attention(q, kp, vp, cache_seqlens=used, page_table=table)  # the status words, made
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = ops.attention(q, kp, vp, cache_seqlens=used, page_table=table)
    for seed, lens in ((22, lens_a), (23, lens_b), (24, lens_a)):
        new = _table(lens, ps, num_pages, max_pages, seed=seed)
        table.copy_(new)
        used.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        _check_fixed(out, lse, q, kp, vp, new, lens)
        eager, eager_lse = ops.attention(q, kp, vp, cache_seqlens=used, page_table=table)
        ops.check()
        assert torch.equal(out, eager) and torch.equal(lse, eager_lse)


BAD_ENTRIES = [("an entry past the pages", 64), ("a negative entry", -1),
               ("the largest int32", 2**31 - 1)]


@pytest.mark.parametrize("name, entry", BAD_ENTRIES, ids=[b[0] for b in BAD_ENTRIES])
def test_a_bad_table_is_one_clear_error_and_the_context_survives(lib, name: str,
                                                                 entry: int) -> None:
    ps, num_pages = 64, 64
    kp, vp = _pool(num_pages, ps, seed=30)
    q = _randn(2, 128, HQ, D, seed=31)
    lens = [700, 450]
    good = _table(lens, ps, num_pages, 16, seed=32)
    used = torch.tensor(lens, dtype=torch.int32, device="cuda")
    bad = good.clone()
    bad[1, 3] = entry  # sequence 1 needs its first 8 entries
    needle = "a block table entry lies outside the KV cache's pages"

    def ok() -> None:  # a good call after the bad one gives correct results
        out, lse = ops.attention(q, kp, vp, cache_seqlens=used, page_table=good)
        ops.check()
        _check_fixed(out, lse, q, kp, vp, good, lens)

    out, lse = ops.attention(q, kp, vp, cache_seqlens=used, page_table=bad)
    torch.cuda.synchronize()
    assert out.isnan().all() and lse.isnan().all(), name  # nothing computed, nothing stale
    with pytest.raises(ValueError) as e:
        ops.attention(q, kp, vp, cache_seqlens=used, page_table=good)
    msg = str(e.value)
    assert msg.startswith("fa_tune::attention: an earlier call on cuda:") and needle in msg
    assert "(first at sequence 1)" in msg and "\n" not in msg
    ok()
    ops.set_sync_check(True)
    try:
        with pytest.raises(ValueError, match=f"this call on cuda:.*{needle}"):
            ops.attention(q, kp, vp, cache_seqlens=used, page_table=bad)
    finally:
        ops.set_sync_check(False)
    ok()
    # An entry no sequence needs is never read: no error.
    spare = good.clone()
    spare[1, 12] = entry
    out, lse = ops.attention(q, kp, vp, cache_seqlens=used, page_table=spare)
    ops.check()
    _check_fixed(out, lse, q, kp, vp, good, lens)


_NATIVE_PROBE = r"""
import torch
from tuner.ship import fa_tune_ops as ops
from tuner.ship.fa_tune_ops import native

assert ops.library().paged  # loads $FA_TUNE_LIB and binds the extension found beside it
assert native.status() == "active", native.status()
g = torch.Generator(device="cuda").manual_seed(5)
kp = torch.randn(64, 64, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
vp = torch.randn(64, 64, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
q = torch.randn(2, 128, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g)
qp = torch.randn(300, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g)
cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
wide = torch.randperm(64, device="cuda").to(torch.int32).view(2, 32)
table = wide[:, :12]  # a strided view: row stride 32
used = torch.tensor([700, 450], dtype=torch.int32, device="cuda")
# (q, k, v, causal, scale, cu_q, cu_k, max_q, max_k, seqused_k, window, softcap, sinks, table)
forms = [(q, kp, vp, True, None, None, None, None, None, used, 0, 0.0, None, table),
         (qp, kp, vp, True, 0.1, cu, None, 200, None, used, 0, 0.0, None, table),
         (q, kp, vp, True, None, None, None, None, 640, None, 0, 0.0, None, table)]
ops.attention(q, kp, vp, cache_seqlens=used, page_table=table)  # the key's first call: Python
ops.check()
for args in forms:
    native.reset_calls()
    cpp = torch.ops.fa_tune.attention(*args)
    py = torch.ops.fa_tune._attention_py(*args)  # the Python implementation, by its own name
    ops.check()
    assert native.calls() == 1, native.calls()
    assert all(torch.equal(a, b) for a, b in zip(cpp, py))
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    out, lse = torch.ops.fa_tune.attention(*forms[0])
wide.copy_(torch.randperm(64, device="cuda").to(torch.int32).view(2, 32))
graph.replay()
want = torch.ops.fa_tune._attention_py(*forms[0])
ops.check()
assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
print("native paged ok")
"""


def test_the_cpp_launch_path_builds_the_same_paged_call(lib_path: Path, tmp_path: Path) -> None:
    """The extension beside the library runs paged calls once their key's first call went to
    Python: the same results as the Python implementation for fixed and packed q, a strided
    table, max_seqlen_k without seqused_k, and in a CUDA graph replayed after the table
    changed."""
    from tuner.ship.fa_tune_ops import native

    lib = tmp_path / "lib" / "libfa_tune_fwd.so"
    lib.parent.mkdir()
    shutil.copy2(lib_path, lib)
    native.build(lib.parent)
    env = {**os.environ, "FA_TUNE_LIB": str(lib), "FA_TUNE_OPS_NATIVE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.run([sys.executable, "-c", _NATIVE_PROBE], capture_output=True, text=True,
                       timeout=600, env=env)
    assert p.returncode == 0 and "native paged ok" in p.stdout, p.stderr[-3000:]
