"""CPU tests of the memory layouts (``Problem.layout``; issue 34): where q, k, v live for
``bshd``, ``qkv`` (views of one fused QKV projection) and ``bhsd`` (k, v over [B, Hkv, S_k, D]
memory), checked against torch's own split / transpose views and NumPy's ``as_strided``; the
buffers a layout adds; and the mirror of the generated inputs into them (fill_inputs ->
OracleModule.mirror_inputs -> oracle_copy_bf16_4d), run on a host "device" whose copy is the
NumPy twin of the oracle's strided copy kernel."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from tuner.kernel.oracle_module import OracleModule
from tuner.kernel.runtime import AttnBuffers, tensor_view
from tuner.measure import oracle as O
from tuner.measure.peers.base import strided_views_reason
from tuner.problem import HEAD_DIMS, Problem

torch = pytest.importorskip("torch")

LAYOUT_PROBLEMS = [
    Problem.parse("2x8/2x1000:qkv"),
    Problem.parse("1x8/2x333:k1000:bhsd"),
    Problem.parse("2x4x64:d64:full:qkv"),  # MHA
    Problem.parse("1x8/1x40:k72:d256:bhsd"),  # MQA
    Problem.parse("1x6/3x50:k70:full:bhsd"),
    Problem.parse("2x8/2x100"),  # bshd: every view dense
]


def _torch_views(p: Problem) -> dict[str, Any]:
    """q, k, v as torch makes them from the layout's memory: ``split`` of the fused projection
    (what a fused-QKV model does), ``transpose(1, 2)`` of the [B, H, S, D] cache, or dense."""
    B, Hq, Hkv, Sq, Sk, D = p.B, p.Hq, p.Hkv, p.S_q, p.S_k, p.D
    if p.layout == "qkv":
        fused = torch.arange(B * Sq * (Hq + 2 * Hkv) * D).reshape(B, Sq, Hq + 2 * Hkv, D)
        q, k, v = fused.split([Hq, Hkv, Hkv], dim=2)
        return {"q": q, "k": k, "v": v}
    q = torch.arange(B * Sq * Hq * D).reshape(B, Sq, Hq, D)
    if p.layout == "bhsd":
        kc = torch.arange(B * Hkv * Sk * D).reshape(B, Hkv, Sk, D)
        return {"q": q, "k": kc.transpose(1, 2), "v": (kc + 1).transpose(1, 2)}
    k = torch.arange(B * Sk * Hkv * D).reshape(B, Sk, Hkv, D)
    return {"q": q, "k": k, "v": k + 1}


@pytest.mark.parametrize("p", LAYOUT_PROBLEMS, ids=str)
def test_views_are_torchs_split_and_transpose(p: Problem) -> None:
    """Problem.view gives exactly the shape, strides and storage offset torch's own views of the
    layout's memory have (what a model hands to attention), and as_strided over the buffer with
    them reads the same elements."""
    views = _torch_views(p)
    for name, t in views.items():
        tv = p.view(name)
        assert tv.dims == tuple(t.shape), name
        assert (*tv.strides, 1) == t.stride(), name
        assert tv.offset == t.storage_offset(), name
        flat = t.untyped_storage()
        base = torch.empty(0, dtype=t.dtype).set_(flat)  # the whole buffer, 1-D
        assert torch.equal(torch.as_strided(base, tv.dims, (*tv.strides, 1), tv.offset), t)
        want = {"qkv": "qkv", "bhsd": f"{name}_cache" if name != "q" else "q"}.get(p.layout, name)
        assert tv.buffer == want
    o = p.view("o")  # O stays dense BSHD whatever the layout
    assert (o.buffer, o.offset, o.strides) == ("o", 0, (p.S_q * p.Hq * p.D, p.Hq * p.D, p.D))


@pytest.mark.parametrize("p", LAYOUT_PROBLEMS, ids=str)
def test_views_under_numpy_as_strided_semantics(p: Problem) -> None:
    """The same views through NumPy: as_strided over each layout buffer (strides in bytes) is the
    slice / transpose of the buffer's own [B, S, H, D] or [B, H, S, D] array; the qkv views
    cover the fused buffer exactly once and each view stays inside its buffer."""
    sizes = p.layout_buffers()
    if p.layout == "bshd":
        assert sizes == {}
        return
    for buf, n in sizes.items():
        mem = np.arange(n, dtype=np.int64)
        hits = np.zeros(n, dtype=np.int64)
        for name in ("q", "k", "v"):
            tv = p.view(name)
            if tv.buffer != buf:
                continue
            last = tv.offset + sum((d - 1) * s for d, s in zip(tv.dims, (*tv.strides, 1),
                                                                 strict=True))
            assert last < n  # inside the buffer
            got = as_strided(mem[tv.offset:], tv.dims,
                             tuple(8 * s for s in (*tv.strides, 1)), writeable=False)
            if p.layout == "qkv":
                fused = mem.reshape(p.B, p.S, p.Hq + 2 * p.Hkv, p.D)
                lo = {"q": 0, "k": p.Hq, "v": p.Hq + p.Hkv}[name]
                want = fused[:, :, lo:lo + tv.dims[2]]
            else:
                want = mem.reshape(p.B, p.Hkv, p.S_k, p.D).transpose(0, 2, 1, 3)
            assert np.array_equal(got, want), name
            hits[got.reshape(-1)] += 1
        assert (hits == 1).all(), buf  # every element belongs to exactly one view
    if p.layout == "qkv":
        assert sizes == {"qkv": p.B * p.S * (p.Hq + 2 * p.Hkv) * p.D}
    else:
        assert sizes == {"k_cache": p.B * p.Hkv * p.S_k * p.D,
                         "v_cache": p.B * p.Hkv * p.S_k * p.D}


@pytest.mark.parametrize(("layout", "D"), list(itertools.product(("qkv", "bhsd"), HEAD_DIMS)))
def test_views_meet_the_kernels_and_fa3s_alignment(layout: str, D: int) -> None:
    """The C ABI wants every stride a multiple of 8 elements and 16-byte aligned pointers (TMA);
    FlashAttention-3 reads a strided tensor in place only under the same rule. Every layout
    meets it (strides and offsets are multiples of D), so neither copies."""
    for hq, hkv, s in ((32, 8, 96), (8, 1, 40), (4, 4, 33)):
        p = Problem(1, hq, s, Hkv=hkv, D=D, layout=layout)
        for name in ("q", "k", "v"):
            tv = p.view(name)
            assert all(x % 8 == 0 for x in tv.strides) and (2 * tv.offset) % 16 == 0
        views = {n: t.to(torch.bfloat16) for n, t in _torch_views(p).items()}
        assert strided_views_reason("fa3", **views) is None


def test_strided_views_reason_names_a_copy() -> None:
    x = torch.zeros(1, 16, 4, 64, dtype=torch.bfloat16)
    assert strided_views_reason("fa3", q=x, k=x, v=x) is None
    why = strided_views_reason("fa3", q=x, k=x.transpose(2, 3), v=x)
    assert why is not None and why.startswith("fa3 would copy k (1, 16, 64, 4)")
    why = strided_views_reason("fa3", q=x[..., 4:], k=x, v=x)  # 8-byte aligned address
    assert why is not None and "q (1, 16, 4, 60)" in why and "\n" not in why


# ---- buffers and the mirror, on a host "device" ----------------------------------------------
class _Arena:
    """Device memory as one host array: buffers are 256-byte aligned spans of it (cuMemAlloc's
    alignment), pointers are arena offsets plus a fake base address."""

    BASE = 0x7F0000000000

    def __init__(self, nbytes: int = 1 << 24) -> None:
        self.mem = np.zeros(nbytes // 2, dtype=np.uint16)
        self.top = 0

    def alloc(self, nbytes: int) -> SimpleNamespace:
        ptr = self.BASE + self.top
        self.top += (nbytes + 255) // 256 * 256
        assert self.top <= 2 * self.mem.size, "arena too small"
        return SimpleNamespace(ptr=ptr, nbytes=nbytes, free=lambda: None)

    def words(self, ptr: int) -> np.ndarray:
        """The arena from ``ptr`` on, as 16-bit words."""
        assert (ptr - self.BASE) % 2 == 0
        return self.mem[(ptr - self.BASE) // 2:]

    def tensor(self, ptr: int, dims: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
        return as_strided(self.words(ptr), dims, tuple(2 * s for s in strides))


class _HostOracle:
    """The oracle's generator (its NumPy twin, bit for bit) and strided copy on the arena; the
    mirror itself is the real OracleModule.mirror_inputs."""

    mirror_inputs = OracleModule.mirror_inputs

    def __init__(self, arena: _Arena) -> None:
        self.arena = arena
        self.copies: list[tuple[Any, ...]] = []

    def gen_seed(self, q: int, k: int, v: int, B: int, Hq: int, Hkv: int, Sq: int, Sk: int,
                 D: int, seed: int, stream: Any) -> None:
        p = Problem(B, Hq, Sq, Hkv=Hkv, D=D, Sk=Sk)
        for ptr, t in zip((q, k, v), O.host_inputs(p, "seed", seed), strict=True):
            self.arena.words(ptr)[:t.size] = t.reshape(-1)

    def copy_bf16_4d(self, src: int, dst: int, dims: tuple[int, ...], src_strides: tuple[int, ...],
                     dst_strides: tuple[int, ...], stream: Any) -> None:
        # oracle_copy_bf16_4d's rule: dst[i . dst_strides] = src[i . src_strides], i < dims.
        self.copies.append((src, dst, tuple(dims), tuple(src_strides), tuple(dst_strides)))
        out = self.arena.tensor(dst, tuple(dims), tuple(dst_strides))
        out[...] = self.arena.tensor(src, tuple(dims), tuple(src_strides))


@pytest.mark.parametrize("p", LAYOUT_PROBLEMS, ids=str)
def test_buffers_and_views_of_a_layout(p: Problem) -> None:
    arena = _Arena()
    bufs = AttnBuffers(arena, p)  # type: ignore[arg-type]
    assert set(bufs.layout_bufs) == set(p.layout_buffers())
    for name, n in p.layout_buffers().items():
        assert bufs.layout_bufs[name].nbytes == 2 * n
    for name in ("q", "k", "v", "o"):
        tv = p.view(name)
        holder = bufs.layout_bufs.get(tv.buffer) or getattr(bufs, tv.buffer)
        assert bufs.view(name) == (holder.ptr + 2 * tv.offset, tv.strides)
        assert bufs.view(name)[0] % 16 == 0
    assert [n for n, _ in bufs.mirrored()] == (
        ["q", "k", "v"] if p.layout == "qkv" else ["k", "v"] if p.layout == "bhsd" else [])
    # Stand-in buffers without layout buffers (older tests, other callers) read as dense.
    dense = SimpleNamespace(shape=Problem(1, 2, 64), q=SimpleNamespace(ptr=0x1000))
    assert tensor_view(dense, "q") == (0x1000, (64 * 2 * 128, 2 * 128, 128))


@pytest.mark.parametrize("p", LAYOUT_PROBLEMS, ids=str)
def test_fill_inputs_mirrors_the_dense_inputs_into_the_layout(p: Problem) -> None:
    """After fill_inputs every view (pointer and strides as launchables get them) reads exactly
    the generated dense inputs; one strided copy per mirrored tensor, dense BSHD to the view."""
    arena = _Arena()
    orc = _HostOracle(arena)
    bufs = AttnBuffers(arena, p)  # type: ignore[arg-type]
    O.fill_inputs(orc, bufs, "seed", 42, None)  # type: ignore[arg-type]
    want = dict(zip("qkv", O.host_inputs(p, "seed", 42), strict=True))
    for name in ("q", "k", "v"):
        ptr, strides = bufs.view(name)
        got = arena.tensor(ptr, p.view(name).dims, (*strides, 1))
        assert np.array_equal(got, want[name]), name
    assert len(orc.copies) == len(bufs.mirrored())
    for (src, dst, dims, ss, ds), (name, tv) in zip(orc.copies, bufs.mirrored(), strict=True):
        assert src == getattr(bufs, name).ptr and (dst, ds[:3]) == bufs.view(name)
        assert dims == tv.dims and ss[3] == ds[3] == 1
        assert ss[:3] == (tv.dims[1] * tv.dims[2] * tv.dims[3], tv.dims[2] * tv.dims[3],
                          tv.dims[3])
    if p.layout == "qkv":  # the fused buffer is q, k, v's heads side by side, every element
        fused = arena.words(bufs.layout_bufs["qkv"].ptr)[:p.layout_buffers()["qkv"]]
        assert np.array_equal(fused.reshape(p.B, p.S, -1, p.D),
                              np.concatenate([want["q"], want["k"], want["v"]], axis=2))
    if p.layout == "bhsd":  # the cache is K, V transposed to [B, Hkv, S_k, D]
        for name in ("k", "v"):
            cache = arena.words(bufs.layout_bufs[f"{name}_cache"].ptr)[:want[name].size]
            assert np.array_equal(cache.reshape(p.B, p.Hkv, p.S_k, p.D),
                                  want[name].transpose(0, 2, 1, 3))
