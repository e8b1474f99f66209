"""Issue 34 on an H200: q, k, v in the memory layouts inference hands them over
(``Problem.layout``): ``:qkv``, views of one fused QKV projection, and ``:bhsd``, k and v over
[B, Hkv, S_k, D] memory (transformers' KV cache). The oracle's strided copy mirrors the
generated dense inputs into the layout buffer bit for bit; the kernel reads the views (offsets
and strides through the C ABI) and passes the gate on every input set, and reads nothing else
(a wiped layout buffer fails it); FA3 and cuDNN are gated on the same views; ``fa-tune
compare`` of a ``:qkv`` problem keeps its own buffers and rows.

    pytest -s -m gpu tests/gpu/test_layout_gpu.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gate_cases import gate_peer, peer_launch
from numpy.lib.stride_tricks import as_strided

from tuner.analysis import compare
from tuner.kernel import build
from tuner.kernel.config import load_preset
from tuner.kernel.runtime import AttnBuffers
from tuner.measure import oracle as O
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.measure.timing import Protocol
from tuner.problem import Problem, ProblemClass

pytestmark = pytest.mark.gpu

QUICK = Protocol(warmup=2, repeat=10, rounds=2, settle_s=0.2, temp_wait_s=5)

# The brief's two, then GQA / MQA / MHA, S not a multiple of a tile, D 64 and 256, non-causal.
LAYOUTS = [
    Problem.parse("2x8/2x1000:qkv"),
    Problem.parse("1x8/2x333:k1000:bhsd"),
    Problem.parse("1x8/1x777:qkv"),
    Problem.parse("2x4x130:k300:bhsd"),
    Problem.parse("1x8/2x1000:d64:full:qkv"),
    Problem.parse("1x4/2x200:k640:d256:bhsd"),
]
# One kernel library per problem class the cases need (the default preset per head dim).
PRESETS = {64: "d64", 128: "default", 256: "d256"}


@pytest.fixture(scope="module")
def kernels() -> dict[ProblemClass, KernelLaunch]:
    out = {}
    for pclass in sorted({p.problem_class for p in LAYOUTS}, key=str):
        res = build.build_config(load_preset(PRESETS[pclass.head_dim]), pclass=pclass)
        res.require_timeable()
        out[pclass] = KernelLaunch(res.so_path)
    return out


def _layout_tensor(bufs: AttnBuffers, p: Problem, name: str) -> np.ndarray:
    """Tensor ``name`` read back from the device the way a launchable reads it: its view
    (Problem.view) over the layout buffer, as NumPy uint16 BF16 bits."""
    tv = p.view(name)
    buf = bufs.layout_bufs.get(tv.buffer) or getattr(bufs, tv.buffer)
    mem = buf.copy_to_host(np.uint16)
    return as_strided(mem[tv.offset:], tv.dims, tuple(2 * s for s in (*tv.strides, 1)))


@pytest.mark.parametrize("p", LAYOUTS, ids=str)
@pytest.mark.parametrize("input_set", sorted(O.INPUT_SETS))
def test_mirror_equals_the_dense_inputs_bit_for_bit(bench: Bench, p: Problem,
                                                    input_set: str) -> None:
    """After every fill the layout buffer holds the generated inputs: each view equals the dense
    tensor (and the NumPy twin of the generator), and a fused buffer is q, k, v's heads side by
    side with nothing left unwritten."""
    bufs = bench.buffers(p)
    for b in bufs.layout_bufs.values():
        b.memset_u8(0xFF)  # a NaN pattern: any element the mirror misses shows
    O.fill_inputs(bench.oracle, bufs, input_set, bench.seed, bench.stream)
    bench.stream.synchronize()
    dense = dict(zip("qkv", O.inputs_to_host(bufs), strict=True))
    twin = dict(zip("qkv", O.host_inputs(p, input_set, bench.seed), strict=True))
    for name in ("q", "k", "v"):
        got = _layout_tensor(bufs, p, name)
        assert np.array_equal(got, dense[name]), name
        assert np.array_equal(got, twin[name]), name
    if p.layout == "qkv":
        fused = bufs.layout_bufs["qkv"].copy_to_host(np.uint16).reshape(p.B, p.S, -1, p.D)
        assert np.array_equal(fused, np.concatenate([dense["q"], dense["k"], dense["v"]], 2))
    else:
        for name in ("k", "v"):
            cache = bufs.layout_bufs[f"{name}_cache"].copy_to_host(np.uint16)
            assert np.array_equal(cache.reshape(p.B, p.Hkv, p.S_k, p.D),
                                  dense[name].transpose(0, 2, 1, 3)), name
    bench.release(p)


@pytest.mark.parametrize("p", LAYOUTS, ids=str)
def test_kernel_passes_the_gate_on_the_views(bench: Bench, kernels: dict, p: Problem) -> None:
    """Every input set, the BF16 budget, poisoned outputs: the kernel given the layout's
    pointers and strides computes the dense inputs' attention."""
    kernel = kernels[p.problem_class]
    assert kernel.supports(p) is None
    g = bench.gate(kernel, p)
    print(f"fa-tune {g.summary()}")
    assert g.passed, g.summary()
    assert [m.input_set for m in g.sets] == list(bench.input_sets)
    # The kernel reads the views and nothing else: with the layout buffer wiped, the same
    # launch on the same (dense) inputs no longer matches the reference.
    bufs = bench.buffers(p)
    for b in bufs.layout_bufs.values():
        b.memset_u8(0)
    kernel.forward(bufs, bench.stream)
    bench.stream.synchronize()
    wiped = bench.check_output(kernel, p)
    assert not wiped.passed, wiped.brief()
    bench.release(p)


def test_kernel_on_a_layout_matches_the_dense_problem_bit_for_bit(bench: Bench,
                                                                  kernels: dict) -> None:
    """The same values read through strides or densely give the same output: the layout changes
    where the kernel loads from, never what it computes."""
    outs = []
    for text in ("2x8/2x1000", "2x8/2x1000:qkv"):
        p = Problem.parse(text)
        kernel = kernels[p.problem_class]
        bufs = bench.load_inputs(p)
        kernel.prepare(p, bench.stream)
        O.poison(bench.oracle, bufs, bench.stream)
        kernel.forward(bufs, bench.stream)
        bench.stream.synchronize()
        outs.append(bufs.o.copy_to_host(np.uint16))
        bench.release(p)
    assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("peer_name", ["fa3", "cudnn"])
def test_peers_pass_the_gate_on_the_same_views(peer_name: str) -> None:
    """FA3 and cuDNN read the very views the kernel reads (torch.as_strided over the layout
    buffer: same addresses, same strides) and pass the gate; FA3 must run every one without a
    copy (strided_views_reason), cuDNN may decline one, never fail one."""
    torch = pytest.importorskip("torch")
    from tuner.measure.launch import torch_views

    launch = peer_launch(peer_name)
    bench = Bench(0)
    declined, failed = [], []
    try:
        for p in LAYOUTS:
            bufs = bench.load_inputs(p)
            q, k, v, o, _ = torch_views(bufs)
            for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
                ptr, strides = bufs.view(name)
                assert t.data_ptr() == ptr and t.stride() == (*strides, 1), (p, name)
                assert t.dtype == torch.bfloat16 and tuple(t.shape) == p.view(name).dims
            assert launch.supports(p) is None, p
            if gate_peer(bench, launch, peer_name, p, declined, failed) is not None:
                bench.release(p)
    finally:
        bench.close()
    print(f"{peer_name} declined: {declined}")
    assert not failed, failed
    if peer_name == "fa3":
        assert not declined, declined


def test_compare_of_a_fused_qkv_problem_end_to_end(tmp_path: Path) -> None:
    """fa-tune compare on 1x8/2x1000 and 1x8/2x1000:qkv in one run: two problems with their own
    buffers (Bench keys on the layout), rows, shape text and CSV layout; the kernel and FA3 are
    gated and timed on the fused views."""
    so = build.build_config(load_preset("default")).so_path
    shapes = ["1x8/2x1000", "1x8/2x1000:qkv"]
    payload = compare.run_compare(so, shapes, "fa3", QUICK, results_root=tmp_path, log=print)
    rows = {(r["shape"], r["backend"]): r for r in payload["summary"]}
    for shape in shapes:
        assert rows[(shape, "fa-tune")]["status"] == "ok", rows[(shape, "fa-tune")]
    assert rows[("1x8/2x1000:qkv", "fa-tune")]["layout"] == "qkv"
    assert [s["shape"] for s in payload["shapes"]] == shapes
    assert payload["shapes"][1]["layout"] == "qkv" and "layout" not in payload["shapes"][0]
    assert ":qkv as q, k, v views" in payload["inputs"]["layout"]
    fa3 = rows.get(("1x8/2x1000:qkv", "fa3"))
    if fa3 is not None and fa3["status"] != "unavailable":
        assert fa3["status"] == "ok", fa3
