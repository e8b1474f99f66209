"""On the GPU: a workload library (two buckets behind the dispatcher, Llama-3-8B's heads) and its
PyTorch op. The library passes fa-tune's own gate through the dispatcher; the op matches
PyTorch SDPA, runs under torch.compile(fullgraph=True) and in CUDA graph replay, costs at most
10 us of host time per call over a direct launch of the same kernel (strided inputs within 2 us
of dense ones), and serves a Llama model through transformers (attn_implementation="fa_tune").
Needs torch with CUDA (and transformers for the model test). Queries over a longer KV, caches,
strides and bad metadata: test_inference_op_gpu.py; generate(): test_hf_generate_gpu.py."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import pytest
from op_exports import export_and_load

pytestmark = pytest.mark.gpu
from op_exports import cuda_torch  # noqa: E402

torch = cuda_torch()
ops = pytest.importorskip("tuner.ship.fa_tune_ops")

F = torch.nn.functional
BF16 = torch.bfloat16
HQ, HKV, D = 32, 8, 128
SHORT_MAX = 2048  # bucket short (preset default) serves S <= 2048, long (multicast) the rest
TWO = {
    "name": "two",
    "attention": {"Hq": HQ, "Hkv": HKV, "head_dim": D, "causal": True},
    "buckets": [{"name": "short", "max_s": SHORT_MAX}, {"name": "long", "max_s": None}],
    "traffic": {"shapes": [{"B": 1, "S": 1024}, {"B": 1, "S": 8192}]},
}


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out, _ = export_and_load(ops, tmp_path_factory.mktemp("wlib"), TWO,
                             {"short": "preset:default", "long": "preset:multicast"})
    return out


def _qkv(B: int, S: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(B, S, HQ, D, device="cuda", dtype=BF16, generator=g),
            torch.randn(B, S, HKV, D, device="cuda", dtype=BF16, generator=g),
            torch.randn(B, S, HKV, D, device="cuda", dtype=BF16, generator=g))


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None,
          dtype: torch.dtype) -> torch.Tensor:
    o = F.scaled_dot_product_attention(q.transpose(1, 2).to(dtype), k.transpose(1, 2).to(dtype),
                                       v.transpose(1, 2).to(dtype), is_causal=True, scale=scale,
                                       enable_gqa=True)
    return o.transpose(1, 2)


def test_library_passes_the_gate(lib_dir: Path) -> None:
    """fa-tune's own FP32 oracle, every input set, through the dispatcher's C ABI."""
    from tuner.errors import FaTuneError
    from tuner.measure.bench import Bench
    from tuner.measure.launch import KernelLaunch
    from tuner.problem import Problem

    bench = Bench(0)
    launch = KernelLaunch(lib_dir / "lib" / "libfa_tune_fwd.so", "two")
    for shape in ("1x32/8x1000", "2x32/8x2048", "1x32/8x2049", "1x32/8x8192"):
        g = bench.gate(launch, Problem.parse(shape))
        assert g.passed, (shape, g.summary())
    with pytest.raises(FaTuneError, match="no bucket of this library serves"):
        bench.gate(launch, Problem(1, 64, 256, Hkv=8))


@pytest.mark.parametrize("B, S, scale", [(1, 1000, None), (2, 2048, None), (1, 4096, None),
                                         (1, 3000, 0.05)])
def test_op_matches_sdpa(lib_dir: Path, B: int, S: int, scale: float | None) -> None:
    q, k, v = _qkv(B, S)
    out, lse = torch.ops.fa_tune.attention(q, k, v, True, scale)
    ref = _sdpa(q, k, v, scale, torch.float32)
    err = (out.float() - ref).abs().max().item()
    err_sdpa = (_sdpa(q, k, v, scale, BF16).float() - ref).abs().max().item()
    print(f"B={B} S={S}: fa_tune max err {err:.2e}, sdpa bf16 {err_sdpa:.2e}")
    assert err <= 2 * err_sdpa + 1e-3
    # LSE against log-sum-exp of the masked, scaled scores (FP32), one batch at a time.
    sc = scale or D ** -0.5
    kk = k.float().repeat_interleave(HQ // HKV, dim=2)
    for b in range(B):
        s = torch.einsum("shd,thd->hst", q[b].float(), kk[b]) * sc
        s.masked_fill_(torch.ones(S, S, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
        ref_lse = torch.logsumexp(s, dim=-1)
        assert (lse[b] - ref_lse).abs().max().item() < 2e-2
        del s


def test_compile_fullgraph(lib_dir: Path) -> None:
    def f(q, k, v):
        out, lse = torch.ops.fa_tune.attention(q, k, v, True, None)
        return out.float() * 2.0, lse

    q, k, v = _qkv(1, 1536, seed=1)
    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])


@pytest.mark.parametrize("S", [1024, 4096])  # one per bucket (grid, static multicast)
def test_cuda_graph_replay(lib_dir: Path, S: int) -> None:
    q, k, v = _qkv(1, S, seed=2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (and the shape's one-time setup) off the capture
        for _ in range(2):
            torch.ops.fa_tune.attention(q, k, v, True, None)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = torch.ops.fa_tune.attention(q, k, v, True, None)
    for seed in (3, 4):
        nq, nk, nv = _qkv(1, S, seed=seed)
        q.copy_(nq)
        k.copy_(nk)
        v.copy_(nv)
        graph.replay()
        want_out, want_lse = torch.ops.fa_tune.attention(q, k, v, True, None)
        torch.cuda.synchronize()
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_first_call_of_a_shape_inside_a_capture_is_refused(lib_dir: Path) -> None:
    q, k, v = _qkv(1, 1111, seed=5)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="run it once before capturing"):
        with torch.cuda.graph(graph):
            torch.ops.fa_tune.attention(q, k, v, True, None)


def _host_us_per_call(calls: dict, n: int = 200, reps: int = 7) -> dict[str, float]:
    """Host time per call of n back-to-back launches (the GPU keeps up: small problem), the
    best of reps for each call. The calls take turns within each rep, so a slow spell of the
    host (an H100 run, step 67: every varlen and op call 1.6x slower in one test, not in its
    rerun) weighs on all of them alike, not on whichever was being timed."""
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(reps):
        for name, fn in calls.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / n * 1e6)
            torch.cuda.synchronize()
    return best


def test_host_overhead_per_call(lib_dir: Path) -> None:
    """The op (its C++ launch path, native.py) vs the same kernel launched directly through
    ctypes (bucket short's own entry point, a prebuilt argument struct, preallocated outputs):
    at most 10 us more per call; q, k, v as views of one fused QKV tensor cost at most 2 us
    more than dense ones (issue 34). The Python implementation (fa_tune::_attention_py) and a
    varlen call are measured beside it."""
    from tuner.ship.fa_tune_ops import abi, native

    assert native.status() == "active", native.status()
    q, k, v = _qkv(1, 256, seed=6)
    fused = torch.cat([q, k, v], dim=2)  # [1, 256, Hq + 2 Hkv, D]
    fq, fk, fv = fused[:, :, :HQ], fused[:, :, HQ:HQ + HKV], fused[:, :, HQ + HKV:]
    out = torch.empty_like(q)
    lse = torch.empty(1, HQ, 256, device="cuda", dtype=torch.float32)
    raw = ctypes.CDLL(str(lib_dir / "lib" / "libfa_tune_fwd.so"))
    direct = raw.fa_tune_b0_forward
    direct.argtypes = [ctypes.POINTER(abi.Args), ctypes.c_void_p]
    stream = torch.cuda.current_stream().cuda_stream
    dense = (256 * HQ * D, HQ * D, D), (256 * HKV * D, HKV * D, D)
    args = abi.make_args(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(),
                         lse=lse.data_ptr(), q_stride=dense[0], k_stride=dense[1],
                         v_stride=dense[1], batch=1, heads_q=HQ, heads_kv=HKV, head_dim=D,
                         seqlen_q=256, seqlen_k=256, causal=1)
    # Varlen: two sequences of 128 in the same tensors, through bucket short's entry point.
    cu = torch.tensor([0, 128, 256], dtype=torch.int32, device="cuda")
    qv, kv, vv = q[0], k[0], v[0]
    out_v = torch.empty_like(qv)
    lse_v = torch.empty(HQ, 256, device="cuda", dtype=torch.float32)
    args_v = abi.make_args(q=qv.data_ptr(), k=kv.data_ptr(), v=vv.data_ptr(),
                           o=out_v.data_ptr(), lse=lse_v.data_ptr(), q_stride=(0, HQ * D, D),
                           k_stride=(0, HKV * D, D), v_stride=(0, HKV * D, D), batch=2,
                           heads_q=HQ, heads_kv=HKV, head_dim=D, seqlen_q=128, seqlen_k=128,
                           total_q=256, total_k=256, cu_seqlens_q=cu.data_ptr(),
                           cu_seqlens_k=cu.data_ptr(), causal=1)
    ws_bytes = raw.fa_tune_b0_workspace_bytes
    ws_bytes.argtypes, ws_bytes.restype = [ctypes.POINTER(abi.Args)], ctypes.c_size_t
    nbytes = ws_bytes(ctypes.byref(args_v))
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    args_v.workspace, args_v.workspace_bytes = ws.data_ptr(), nbytes
    attn = torch.ops.fa_tune.attention
    calls = {
        "direct": lambda: direct(ctypes.byref(args), stream),
        "op": lambda: attn(q, k, v, True, None),
        "op fused views": lambda: attn(fq, fk, fv, True, None),
        "python op": lambda: torch.ops.fa_tune._attention_py(q, k, v, True, None),
        "direct varlen": lambda: direct(ctypes.byref(args_v), stream),
        "op varlen": lambda: attn(qv, kv, vv, True, None, cu, cu, 128, 128),
        "python op varlen": lambda: torch.ops.fa_tune._attention_py(qv, kv, vv, True, None, cu,
                                                                    cu, 128, 128),
    }
    for fn in calls.values():
        fn()
    torch.cuda.synchronize()
    assert torch.equal(out, attn(q, k, v, True, None)[0])
    assert torch.equal(out, attn(fq, fk, fv, True, None)[0])
    assert torch.equal(torch.ops.fa_tune._attention_py(q, k, v, True, None)[0], out)
    assert torch.equal(out_v, attn(qv, kv, vv, True, None, cu, cu, 128, 128)[0])
    t = _host_us_per_call(calls)
    print("host us per call: " + ", ".join(f"{n} {x:.2f}" for n, x in t.items())
          + f"; overhead: op {t['op'] - t['direct']:.2f}, fused views "
          f"{t['op fused views'] - t['direct']:.2f}, python op {t['python op'] - t['direct']:.2f}"
          f", op varlen {t['op varlen'] - t['direct varlen']:.2f}, python op varlen "
          f"{t['python op varlen'] - t['direct varlen']:.2f}")
    assert t["op"] - t["direct"] < 10.0
    assert t["op fused views"] - t["op"] < 2.0


def _fp32_logits(model: object, ids: object) -> object:
    """The model's logits in FP32 with sdpa; the model is back in BF16 afterwards."""
    model.float()
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        out = model(ids, use_cache=False).logits.float()
    model.to(dtype=BF16)
    return out


def test_transformers_llama_prefill(lib_dir: Path) -> None:
    """A 2-layer Llama-3-8B-shaped model (random weights): fa_tune's logits match sdpa's."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    ops.register_hf()
    cfg = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=HQ,
                                   num_key_value_heads=HKV, intermediate_size=2048,
                                   vocab_size=1024, num_hidden_layers=2)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=BF16).eval()
    for S in (1500, 4096):
        ids = torch.randint(0, cfg.vocab_size, (1, S), device="cuda")
        logits = {}
        for impl in ("sdpa", "fa_tune"):
            model.set_attn_implementation(impl)
            with torch.inference_mode():
                logits[impl] = model(ids, use_cache=False).logits.float()
        # BF16 tolerance against the same model in FP32 (scripts/llama_prefill.py says why):
        # random weights make top-1 flips between two BF16 runs meaningless (97.5 % on the H200).
        ref32 = _fp32_logits(model, ids)
        err = {k: ((v - ref32).abs().mean() / ref32.abs().mean()).item()
               for k, v in logits.items()}
        print(f"S={S}: error vs FP32: fa_tune {err['fa_tune']:.2e}, sdpa {err['sdpa']:.2e}")
        assert err["fa_tune"] <= 1.25 * err["sdpa"] + 1e-3, err


def test_library_gates_varlen_through_the_dispatcher(lib_dir: Path) -> None:
    """Packed batches through the dispatcher (device metadata): short (default preset)
    serves max_seqlen <= 2048, long (multicast: its clusters dealt the task list statically)
    the rest."""
    from tuner.measure.bench import Bench
    from tuner.measure.launch import KernelLaunch
    from tuner.problem import Problem
    bench = Bench(0)
    launch = KernelLaunch(lib_dir / "lib" / "libfa_tune_fwd.so", "two")
    for shape in ("32/8x[1000,0,1,17,2048,777]", "32/8x[64*20,129]", "32/8x[4096,100,3000]"):
        g = bench.gate(launch, Problem.parse(shape))
        bench.release(Problem.parse(shape))
        assert g.passed, (shape, g.summary())


def _packed(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, ...]:
    total = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(total, HQ, D, device="cuda", dtype=BF16, generator=g)
    k = torch.randn(total, HKV, D, device="cuda", dtype=BF16, generator=g)
    v = torch.randn(total, HKV, D, device="cuda", dtype=BF16, generator=g)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda",
                      dtype=torch.int32)
    return q, k, v, cu


def test_op_varlen_matches_sdpa_per_sequence_and_replays_in_a_graph(lib_dir: Path) -> None:
    lengths = [1500, 1, 0, 333, 2048, 64]
    q, k, v, cu = _packed(lengths, seed=3)
    out, lse = torch.ops.fa_tune.attention(q, k, v, True, None, cu, cu, max(lengths),
                                           max(lengths))
    assert out.shape == q.shape and lse.shape == (HQ, q.shape[0])
    start = 0
    for s in lengths:
        if s:
            sl = slice(start, start + s)
            ref = _sdpa(q[None, sl], k[None, sl], v[None, sl], None, torch.float32)[0]
            err = (out[sl].float() - ref).abs().max().item()
            assert err < 2e-2, (s, err)
        start += s
    # CUDA graph: first use inside the capture (the schedule is built on the device).
    q2, k2, v2, cu2 = _packed([700, 300, 1024], seed=4)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph, _ = torch.ops.fa_tune.attention(q2, k2, v2, True, None, cu2, cu2, 1024, 1024)
    graph.replay()
    torch.cuda.synchronize()
    o_eager, _ = torch.ops.fa_tune.attention(q2, k2, v2, True, None, cu2, cu2, 1024, 1024)
    assert torch.equal(o_graph, o_eager)
