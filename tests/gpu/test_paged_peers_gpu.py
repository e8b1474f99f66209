"""On the GPU: the peers that read a paged KV cache (issue 37), FlashAttention-3 (page_table) and
FlashInfer (BatchPrefillWithPagedKVCacheWrapper), through the same gate as every backend
(gate_cases.gate_peer_on: every input set against the FP32 reference on the dense K and V, O
and the LSE): page sizes 16 .. 256 (128 = FA3's key tile at D 64 and 128: its TMA path), the
pages in the problem's random order, odd sequences sharing sequence 0's first page, partial last
pages, packed batches with empty sequences, GQA and MQA, S_q < S_k and S_q > S_k, D 64, 128 and
256, and the models' masks (FlashInfer declines sinks, nothing else); the pools' unused rows zero
(AttnBuffers zeroes them at allocation: the mirror never writes them); and a short timing of
each on one serving-sized problem.

    pytest -s -m gpu tests/gpu/test_paged_peers_gpu.py

FlashInfer builds its prefill module (nvcc) on its first run of each head dim and of a window
or a softcap: minutes on a fresh host (lab/h200/flashinfer_stage.sh, FI_SMOKE=1, builds D 128
ahead; the JIT cache lives in .device/.cache/flashinfer under gpu_session.sh env).
"""

from __future__ import annotations

import pytest
from gate_cases import gate_peer_on, peer_launch

from tuner.measure.bench import Bench
from tuner.measure.timing import Protocol
from tuner.problem import Problem

pytestmark = pytest.mark.gpu

QUICK = Protocol(warmup=2, repeat=10, rounds=2, settle_s=0.2, temp_wait_s=5)

PAGED = [Problem.parse(t) for t in (
    "2x8/2x300:k1000:p16",  # sequence 1 reads sequence 0's first page; partial last pages
    "3x8/2x130:k700:p128",  # one key tile per page (FA3's TMA path); a 60-row last page
    "2x8/2x200:k1500:p256",
    "1x8/1x333:k2049:p32",  # MQA; 2049 keys: one key on the last page
    "4x8/2x256:full:p64",  # non-causal, S_q = S_k
    "2x8/2x500:k300:full:p16",  # S_q > S_k non-causal: the first rows see every key
    "2x8/2x300:k1000:d64:p128",  # D 64: the TMA page size too
    "2x8/2x300:k1000:d256:p64",  # D 256 (FA3's key tile 80: cp.async at any page size)
    "8/2x[300:1000,0:64,128:128,1:513]:p16",  # packed: no queries over keys, one query
    "8/2x[200:900*3,77:78,0]:p64",  # an empty sequence; three sequences share a page
    "8/2x[100:4096,17:300,256:256]:p256",
)]
MASKED = [Problem.parse(t) for t in (
    "2x8/2x300:k1000:w128:p16",
    "2x8/2x300:k600:full:w50:p128",
    "2x8/2x300:k1000:cap30:p64",
    "2x8/2x300:k1000:sinks:p32",
    "8/2x[100:300,65:700,0:40]:w48:cap20:sinks:p16",
)]


def test_fa3_passes_the_gate_on_pages() -> None:
    """FA3 runs every paged problem (flash_attn_varlen_func with page_table and seqused_k,
    fixed and packed queries, every page size, each mask) and passes, its LSE checked."""
    gates, declined = gate_peer_on("fa3", PAGED + MASKED, lambda p: False)
    assert not declined and len(gates) == len(PAGED + MASKED), declined


def test_flashinfer_passes_the_gate_on_pages() -> None:
    """FlashInfer runs every paged problem without sinks and passes, its LSE (base 2, converted
    to natural log) checked; it declines sinks up front, nothing at prepare."""
    gates, declined = gate_peer_on("flashinfer", PAGED + MASKED, lambda p: p.sinks)
    assert not declined and len(gates) == len([p for p in PAGED + MASKED if not p.sinks])
    assert all(m.lse_checked for g in gates for m in g.sets)


def test_flashinfer_without_pages_passes_the_gate() -> None:
    """The ragged wrapper for problems without pages: fixed (dense and a fused QKV tensor's
    slices) and packed; the [B, Hkv, S_k, D] cache declined up front."""
    problems = [Problem.parse(t) for t in ("2x8/2x300:k1000", "1x8/2x256:qkv",
                                           "8/2x[300:1000,0:64,1:513]", "1x8/2x256:k512:bhsd")]
    gates, declined = gate_peer_on("flashinfer", problems, lambda p: p.layout == "bhsd")
    assert not declined and len(gates) == 3
    assert all(m.lse_checked for g in gates for m in g.sets)


@pytest.mark.parametrize("peer_name", ["fa3", "flashinfer"])
@pytest.mark.parametrize("text", ["3x8/2x130:k700:p128", "8/2x[300:1000,1:513]:d64:p128"])
def test_unused_page_rows_are_zero(peer_name: str, text: str) -> None:
    """The mirror writes only the keys' rows; the rest of every last page is zero from the
    buffers' allocation (a kernel that loads whole pages, FA3 at one key tile per page,
    multiplies them by P = 0, and NaN there would poison O), and the gate passes."""
    import numpy as np

    problem = Problem.parse(text)
    launch = peer_launch(peer_name)
    bench = Bench(0)
    try:
        g = bench.gate(launch, problem)
        print(f"{peer_name} {g.summary()}")
        assert g.passed, g.summary()
        bufs = bench.buffers(problem)
        pages, row = problem.pages, problem.Hkv * problem.D
        for name in ("k_pages", "v_pages"):
            pool = bufs.layout_bufs[name].copy_to_host(np.uint16).reshape(
                pages.num_pages, pages.page_size, row)
            for c in pages.copies:
                assert (pool[c.page, c.rows:] == 0).all(), (name, c)
    finally:
        launch.release()
        bench.close()


@pytest.mark.parametrize("peer_name", ["fa3", "flashinfer"])
def test_paged_peers_time_and_recheck(peer_name: str) -> None:
    """Gate, a short timing and the re-check after it (compare's path) on a serving-sized
    paged problem: the plan made once at bind is reused by every timed launch."""
    problem = Problem.parse("4x32/8x2048:k8192:p64")
    launch = peer_launch(peer_name)
    bench = Bench(0)
    try:
        m = bench.measure(launch, problem, QUICK, gate=True, gate_after=True)
        assert m.status == "ok", m.reason
        assert m.timing is not None and m.timing.median_ms > 0
        print(f"{peer_name} {problem}: {m.timing.median_ms:.3f} ms, "
              f"{problem.tflops(m.timing.median_ms):.0f} TFLOPS; {launch.details()}")
    finally:
        launch.release()
        bench.close()
