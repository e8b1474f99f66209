"""The exported PyTorch package (tuner/ship/fa_tune_ops) without a GPU: op registration and schema,
the fake implementation for every call form (fixed length with S_q <= S_k, packed q and k with
their own cu_seqlens, a cache with seqused_k / cache_seqlens, strided views), torch.compile
tracing, one clear error for every unsupported input, the strides the kernel reads and the
copies it cannot avoid (said once), the bad-metadata status words, stats(); and the
transformers backend: its mask function, its routing to the op or a stated fallback, the
fallbacks' results, a tiny Llama model end to end on CPU (all fallback) and on meta tensors (the
op's fake implementation: prefill, a continuation over a DynamicCache, decode). The library is
the real generated dispatcher over stub buckets (tests/dispatch_stub.py). Skipped without torch
(an optional extra: pip install torch; transformers for the backend tests)."""

from __future__ import annotations

import ctypes
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="fa_tune_ops needs PyTorch (pip install torch)")

from dispatch_stub import build_stub_library  # noqa: E402
from op_errors import one_error  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402

from tuner.ship import dispatch  # noqa: E402
from tuner.ship.workload import workload_from_dict  # noqa: E402

ops = pytest.importorskip("tuner.ship.fa_tune_ops", reason="fa_tune_ops needs PyTorch")
from tuner.ship.fa_tune_ops import checks, fallback, hf, status  # noqa: E402

BF16 = torch.bfloat16
WORKLOAD = {
    "name": "two",
    "attention": {"Hq": 32, "Hkv": 8, "head_dim": 128, "causal": True},
    "buckets": [{"name": "short", "max_s": 2048}, {"name": "long", "max_s": 16384}],
    "traffic": {"shapes": [{"S": 1024}, {"S": 8192}]},
}


@pytest.fixture(scope="module")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    w = workload_from_dict(WORKLOAD)
    t = dispatch.table_for_workload(w, dispatch.bucket_sources(w, default="preset:default"))
    so = build_stub_library(t, tmp_path_factory.mktemp("opslib"))
    ops.load(str(so))
    return so


@pytest.fixture
def four_buckets(stub_lib: Path, tmp_path_factory: pytest.TempPathFactory):
    """llama3-8b's four buckets over the stub's: s1k and s2k serve varlen, s4k and s8k were
    built without it. Loaded for the test, then the two-bucket library again."""
    from tuner.ship.workload import load_workload

    w = load_workload("llama3-8b")
    t = dispatch.table_for_workload(w, dispatch.bucket_sources(
        w, ["s8k=preset:multicast"], default="preset:default"))
    so = build_stub_library(t, tmp_path_factory.mktemp("opslib4"))
    yield ops.load(str(so))
    ops.load(str(stub_lib))


def empty(*shape: int, device: str = "meta", dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.empty(*shape, device=device, dtype=dtype)


def qkv(B: int = 1, S: int = 1024, hq: int = 32, hkv: int = 8, d: int = 128, Sk: int = 0,
        device: str = "meta", dtype: torch.dtype = BF16) -> tuple[torch.Tensor, ...]:
    Sk = Sk or S
    return (empty(B, S, hq, d, device=device, dtype=dtype),
            empty(B, Sk, hkv, d, device=device, dtype=dtype),
            empty(B, Sk, hkv, d, device=device, dtype=dtype))


def packed(total: int = 5000, total_k: int = 0, hq: int = 32, hkv: int = 8, d: int = 128,
           device: str = "meta", dtype: torch.dtype = BF16) -> tuple[torch.Tensor, ...]:
    """Varlen q [total, Hq, D] and k, v [total_k, Hkv, D]."""
    total_k = total_k or total
    return (empty(total, hq, d, device=device, dtype=dtype),
            empty(total_k, hkv, d, device=device, dtype=dtype),
            empty(total_k, hkv, d, device=device, dtype=dtype))


def ints(n: int = 4, dtype: torch.dtype = torch.int32, device: str = "meta") -> torch.Tensor:
    return torch.empty(n, dtype=dtype, device=device)


def test_op_is_registered(stub_lib: Path) -> None:
    s = str(torch.ops.fa_tune.attention.default._schema)
    assert s == ("fa_tune::attention(Tensor q, Tensor k, Tensor v, bool causal=True, "
                 "float? softmax_scale=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
                 "SymInt? max_seqlen_q=None, SymInt? max_seqlen_k=None, Tensor? seqused_k=None, "
                 "int window=0, float softcap=0., Tensor? sinks=None, Tensor? block_table=None) "
                 "-> (Tensor out, Tensor lse)")
    assert str(torch.ops.fa_tune._attention_py.default._schema).startswith(
        "fa_tune::_attention_py(Tensor q")
    assert ops.library().path == stub_lib and ops.library().head_dim == 128


def _fused(B: int, S: int, hq: int = 32, hkv: int = 8, d: int = 128) -> tuple[torch.Tensor, ...]:
    """q, k, v as views of one fused QKV projection [B, S, (Hq + 2 Hkv) * D]."""
    qkv_ = empty(B, S, (hq + 2 * hkv) * d).view(B, S, hq + 2 * hkv, d)
    return qkv_[:, :, :hq], qkv_[:, :, hq:hq + hkv], qkv_[:, :, hq + hkv:]


def _cache(B: int, S: int, hkv: int = 8, d: int = 128) -> torch.Tensor:
    """transformers' cache memory [B, H, S, D] as the op reads it: BSHD through strides."""
    return empty(B, hkv, S, d).transpose(1, 2)


# (name, q/k/v maker, kwargs, out shape, lse shape): every call form the op takes.
FORMS = [
    ("fixed", lambda: qkv(2, 3000), {}, (2, 3000, 32, 128), (2, 32, 3000)),
    ("queries over a longer KV", lambda: qkv(1, 2048, Sk=8192), {}, (1, 2048, 32, 128),
     (1, 32, 2048)),
    ("fused QKV views", lambda: _fused(2, 1024), {}, (2, 1024, 32, 128), (2, 32, 1024)),
    ("a [B, H, S, D] cache", lambda: (qkv(1, 512)[0], _cache(1, 4096), _cache(1, 4096)), {},
     (1, 512, 32, 128), (1, 32, 512)),
    ("packed q and k", lambda: packed(5000, 9000),
     {"cu_seqlens_q": ints(4), "cu_seqlens_k": ints(4), "max_seqlen_q": 2000,
      "max_seqlen_k": 4000}, (5000, 32, 128), (32, 5000)),
    ("packed q over a cache", lambda: (packed(300)[0], *qkv(3, 1, Sk=4096)[1:]),
     {"cu_seqlens_q": ints(4), "max_seqlen_q": 200, "seqused_k": ints(3)},
     (300, 32, 128), (32, 300)),
    ("fixed q over packed k", lambda: (qkv(3, 64)[0], *packed(9000)[1:]),
     {"cu_seqlens_k": ints(4), "max_seqlen_k": 4000}, (3, 64, 32, 128), (3, 32, 64)),
    ("a cache with seqused_k", lambda: qkv(4, 128, Sk=8192), {"seqused_k": ints(4)},
     (4, 128, 32, 128), (4, 32, 128)),
    ("a cache, max_seqlen_k below its rows", lambda: qkv(4, 128, Sk=16384),
     {"seqused_k": ints(4), "max_seqlen_k": 2048}, (4, 128, 32, 128), (4, 32, 128)),
]


@pytest.mark.parametrize("name, make, kwargs, out_shape, lse_shape", FORMS,
                         ids=[f[0] for f in FORMS])
def test_every_call_form_has_its_shapes(stub_lib: Path, name, make, kwargs, out_shape,
                                        lse_shape) -> None:
    q, k, v = make()
    out, lse = ops.attention(q, k, v, **kwargs)
    assert out.shape == out_shape and out.dtype == BF16 and out.is_contiguous()
    assert lse.shape == lse_shape and lse.dtype == torch.float32 and lse.device == q.device
    with FakeTensorMode():  # torch.compile's tracing: fake CUDA tensors, the same strides

        def fake(t: torch.Tensor) -> torch.Tensor:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")

        conv = {k_: fake(v_) if isinstance(v_, torch.Tensor) else v_ for k_, v_ in kwargs.items()}
        out, lse = ops.attention(fake(q), fake(k), fake(v), **conv)
        assert isinstance(out, FakeTensor) and out.shape == out_shape and out.device.type == "cuda"
        assert lse.shape == lse_shape and out.is_contiguous()


def test_cache_seqlens_is_seqused_k(stub_lib: Path) -> None:
    """flash_attn_with_kvcache's name: the same checks, the same shapes; an int means one
    length for every batch entry."""
    q, k, v = qkv(3, 128, Sk=4096)
    out, lse = ops.attention(q, k, v, cache_seqlens=ints(3))
    assert out.shape == q.shape and lse.shape == (3, 32, 128)
    assert ops.attention(q, k, v, cache_seqlens=1000)[0].shape == q.shape
    assert "seqused_k must have batch = 3 entries" in one_error(
        lambda: ops.attention(q, k, v, cache_seqlens=ints(4)))
    assert "give seqused_k or cache_seqlens" in one_error(
        lambda: ops.attention(q, k, v, seqused_k=ints(3), cache_seqlens=ints(3)))


@pytest.mark.parametrize("form", ["fixed", "queries over a longer KV", "packed q and k",
                                  "a cache with seqused_k"])
def test_compile_fullgraph_traces_the_op(stub_lib: Path, form: str) -> None:
    _, make, kwargs, out_shape, lse_shape = next(f for f in FORMS if f[0] == form)
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    scalars = {k: v for k, v in kwargs.items() if k not in tensors}

    def f(q, k, v, meta):
        out, lse = torch.ops.fa_tune.attention(q, k, v, True, None, meta.get("cu_seqlens_q"),
                                               meta.get("cu_seqlens_k"),
                                               scalars.get("max_seqlen_q"),
                                               scalars.get("max_seqlen_k"), meta.get("seqused_k"))
        return out * 2, lse

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    out, lse = torch.compile(f, fullgraph=True, backend=backend)(*make(), tensors)
    assert out.shape == out_shape and lse.shape == lse_shape
    assert "torch.ops.fa_tune.attention" in graphs[0].code
    # AOT autograd's tracing runs the fake implementation too.
    out, _ = torch.compile(f, fullgraph=True, backend="aot_eager")(*make(), tensors)
    assert out.shape == out_shape


@pytest.mark.parametrize("make, kwargs, needle", [
    (lambda: qkv(dtype=torch.float16), {}, "q is torch.float16; the kernel takes torch.bfloat16"),
    (lambda: qkv(d=64), {}, "head dim 64: this library is built for head dim 128"),
    (lambda: qkv(), {"causal": False}, "causal=False: this library is built causal only"),
    (lambda: qkv(), {"softmax_scale": 0.0}, "softmax_scale must be finite and > 0"),
    (lambda: qkv(), {"softmax_scale": float("nan")}, "softmax_scale must be finite"),
    (lambda: qkv(hq=64), {}, "no bucket of libfa_tune_fwd.so serves B=1 Hq=64 Hkv=8 S_q=1024 "
                             "S_k=1024"),
    (lambda: qkv(S=20000), {}, "it serves Hq=32 Hkv=8 S 1..2048 (short); Hq=32 Hkv=8 S "
                               "2049..16384 (long)"),
    (lambda: qkv(hq=30, hkv=8), {}, "Hq=30 must be a multiple of Hkv=8"),
    (lambda: qkv(hkv=0), {}, "Hq=32 must be a multiple of Hkv=0"),
    (lambda: qkv(S=0), {}, "is empty; B, S and Hq must be at least 1"),
    (lambda: qkv(S=2048, Sk=1024), {}, "causal with S_q=2048 queries over S_k=1024 keys: the mask "
                                       "is aligned bottom-right"),
    (lambda: (qkv()[0], *qkv(B=2)[1:]), {}, "k and v must be [1, S_k, Hkv, 128]"),
    (lambda: (qkv()[0][0], *qkv()[1:]), {}, "must be 4-D BSHD"),
    (lambda: qkv(), {"max_seqlen_q": 1024}, "max_seqlen_q and max_seqlen_k go with "
                                            "cu_seqlens_q / cu_seqlens_k (varlen) or seqused_k"),
    (lambda: qkv(S=64, device="cpu"), {}, "must be CUDA tensors; got cpu"),
    # device metadata
    (lambda: qkv(), {"cu_seqlens_q": ints()}, "with cu_seqlens_q, q is packed [total_q, Hq"),
    (lambda: packed(), {"cu_seqlens_q": ints()}, "cu_seqlens_q needs max_seqlen_q"),
    (lambda: packed(), {"cu_seqlens_q": ints(), "max_seqlen_q": 100},
     "k and v [5000, 8, 128] are packed [total_k, Hkv, head_dim]: pass cu_seqlens_k and "
     "max_seqlen_k too"),
    (lambda: packed(), {"cu_seqlens_k": ints(), "max_seqlen_k": 100},
     "q [5000, 32, 128] is packed [total_q, Hq, head_dim]: pass cu_seqlens_q"),
    (lambda: packed(), {"cu_seqlens_q": ints(), "cu_seqlens_k": ints(), "max_seqlen_q": 100},
     "cu_seqlens_k needs max_seqlen_k"),
    (lambda: packed(), {"cu_seqlens_q": ints(dtype=torch.int64), "cu_seqlens_k": ints(),
                        "max_seqlen_q": 100, "max_seqlen_k": 100},
     "cu_seqlens_q is torch.int64; the kernel takes torch.int32"),
    (lambda: packed(), {"cu_seqlens_q": ints(1), "max_seqlen_q": 100},
     "cu_seqlens_q must be 1-D [num_seqs + 1] with at least 2 entries; got [1]"),
    (lambda: packed(), {"cu_seqlens_q": ints(), "cu_seqlens_k": ints(5), "max_seqlen_q": 100,
                        "max_seqlen_k": 100}, "cu_seqlens_k must have num_seqs + 1 = 4 entries"),
    (lambda: packed(), {"cu_seqlens_q": ints(device="cpu"), "cu_seqlens_k": ints(),
                        "max_seqlen_q": 100, "max_seqlen_k": 100},
     "cu_seqlens_q must be on q's device meta (the kernel reads it there); got cpu"),
    (lambda: packed(), {"cu_seqlens_q": ints(8)[::2], "cu_seqlens_k": ints(),
                        "max_seqlen_q": 100, "max_seqlen_k": 100},
     "cu_seqlens_q with stride (2,) is not contiguous"),
    (lambda: packed(), {"cu_seqlens_q": ints(), "cu_seqlens_k": ints(), "max_seqlen_q": 0,
                        "max_seqlen_k": 100}, "max_seqlen_q must be at least 1"),
    (lambda: packed(), {"cu_seqlens_q": ints(), "cu_seqlens_k": ints(), "max_seqlen_q": 20000,
                        "max_seqlen_k": 20000},
     "no bucket of libfa_tune_fwd.so serves varlen Hq=32 Hkv=8 max_seqlen_q=20000 "
     "max_seqlen_k=20000; it serves Hq=32 Hkv=8 S 1..2048 (short)"),
    (lambda: packed(total=0), {"cu_seqlens_q": ints(), "cu_seqlens_k": ints(),
                               "max_seqlen_q": 100, "max_seqlen_k": 100},
     "q [0, 32, 128] is empty"),
    (lambda: qkv(3, 64, Sk=4096), {"seqused_k": ints(4)},
     "seqused_k must have batch = 3 entries; got [4]"),
    (lambda: qkv(3, 64, Sk=4096), {"seqused_k": ints(3, dtype=torch.int64)},
     "seqused_k is torch.int64"),
    (lambda: qkv(3, 64, Sk=4096), {"seqused_k": ints(3), "max_seqlen_k": 5000},
     "max_seqlen_k 5000 exceeds the cache's 4096 rows"),
    (lambda: qkv(3, 64, Sk=4096), {"seqused_k": ints(3), "max_seqlen_q": 32},
     "max_seqlen_q goes with cu_seqlens_q; q [3, 64, 32, 128] is fixed length"),
    (lambda: (packed(300)[0], *qkv(2, 1, Sk=4096)[1:]),
     {"cu_seqlens_q": ints(4), "max_seqlen_q": 200},
     "k and v [2, 4096, 8, 128] must hold one cache row per sequence (3)"),
    (lambda: packed(device="cpu"), {"cu_seqlens_q": ints(device="cpu"),
                                    "cu_seqlens_k": ints(device="cpu"), "max_seqlen_q": 100,
                                    "max_seqlen_k": 100}, "must be CUDA tensors; got cpu"),
])
def test_unsupported_input_is_one_clear_error(stub_lib: Path, make, kwargs, needle) -> None:
    q, k, v = make()
    assert needle in one_error(lambda: ops.attention(q, k, v, **kwargs))


def test_varlen_refused_by_a_bucket_without_it(four_buckets) -> None:
    q, k, v = packed()
    meta = {"cu_seqlens_q": ints(), "cu_seqlens_k": ints()}
    out, _ = ops.attention(q, k, v, max_seqlen_q=2048, max_seqlen_k=2048, **meta)  # s2k
    assert out.shape == q.shape
    for max_q, needle in (
            (4096, "bucket s4k of libfa_tune_fwd.so cannot run varlen: it was built without "
                   "the varlen kernel (fa-tune export leaves it out where the config cannot "
                   "serve varlen: its README says why) (max_seqlen_q=4096 max_seqlen_k=4096 "
                   "picks it)"),
            (8192, "bucket s8k of libfa_tune_fwd.so cannot run varlen")):
        assert needle in one_error(lambda m=max_q: ops.attention(
            q, k, v, max_seqlen_q=m, max_seqlen_k=m, **meta))
    # Fixed length is untouched by a bucket's varlen; a chunk runs its query length's bucket.
    assert ops.attention(*qkv(1, 8192))[0].shape == (1, 8192, 32, 128)
    assert ops.library().bucket_for(32, 8, 2048, 8192) == 1


def test_missing_library_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ops.LibraryError, match="no kernel library at .*FA_TUNE_LIB"):
        ops.load(str(tmp_path / "none.so"))


def test_one_copy_per_process(stub_lib: Path, tmp_path: Path) -> None:
    """The exported copy and fa-tune's own cannot both register fa_tune::attention."""
    import os
    import shutil

    shutil.copytree(Path(ops.__file__).parent, tmp_path / "fa_tune_ops")
    code = ("import tuner.ship.fa_tune_ops\n"
            "try:\n    import fa_tune_ops\nexcept ImportError as e:\n    print('refused:', e)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": f"{tmp_path}"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "refused: the op fa_tune::attention is registered already" in p.stdout


# ---- strides ------------------------------------------------------------------------------------
def _cpu(*shape: int) -> torch.Tensor:
    return torch.zeros(*shape, dtype=BF16)


def test_kernel_strides_read_views_in_place() -> None:
    """Fused-QKV views and a [B, H, S, D] cache transposed are read through their strides;
    size-1 dimensions get a dense tensor's stride (the library checks every one)."""
    fused = _cpu(2, 64, 48 * 128).view(2, 64, 48, 128)
    q, v = fused[:, :, :32], fused[:, :, 40:]
    assert checks.kernel_strides(q) == ((64 * 48 * 128, 48 * 128, 128), "")
    assert checks.kernel_strides(v) == ((64 * 48 * 128, 48 * 128, 128), "")
    cache = _cpu(2, 8, 300, 128).transpose(1, 2)  # [B, S, H, D] view of [B, H, S, D]
    assert checks.kernel_strides(cache) == ((8 * 300 * 128, 128, 300 * 128), "")
    one = _cpu(128).as_strided((1, 1, 1, 128), (7, 5, 3, 1))  # B = S = H = 1: any strides
    assert checks.kernel_strides(one) == ((128, 128, 128), "")
    rows = _cpu(100, 48, 128)[:, 8:40]  # packed rows, a head slice
    assert checks.kernel_strides(rows) == ((0, 48 * 128, 128), "")
    t, s = checks.kernel_tensor(q, "q")
    assert t is q and s[1] == 48 * 128  # no copy


@pytest.mark.parametrize("make, why", [
    (lambda: _cpu(1, 64, 8, 129)[..., :128], "its head stride 129 is not a positive multiple of "
                                              "8 elements"),
    (lambda: _cpu(64 * 1028).as_strided((1, 64, 8, 128), (64 * 1028, 1028, 128, 1)),
     "its sequence stride 1028 is not"),
    (lambda: _cpu(1, 64, 8, 128).flatten()[1:8193].view(1, 64, 1, 128),
     "its data pointer is 2 bytes past a 16-byte boundary (storage offset 1)"),
    (lambda: _cpu(1, 64, 128, 8).transpose(2, 3), "its head dim has stride 8, not 1"),
    (lambda: _cpu(1, 1, 8, 128).expand(1, 64, 8, 128), "its sequence stride 0 is not"),
])
def test_layouts_tma_cannot_read_are_copied_once(make, why: str) -> None:
    t = make()
    strides, got = checks.kernel_strides(t)
    assert strides is None and got.startswith(why), got
    checks._warned.clear()
    with pytest.warns(checks.CopyWarning, match="fa_tune::attention copies k .* on every such "
                                                 "call: .*said once per process"):
        copy, s = checks.kernel_tensor(t, "k")
    assert copy is not t and copy.is_contiguous() and torch.equal(copy, t)
    assert s == checks.kernel_strides(copy)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second time: silent
        checks.kernel_tensor(make(), "k")


# ---- bad metadata: the status words --------------------------------------------------------------
def test_status_words_raise_once_and_clear(monkeypatch: pytest.MonkeyPatch) -> None:
    words = (ctypes.c_int32 * 2)(0, 0)
    monkeypatch.setitem(status._status, 7, (torch.zeros(2), words))
    status.raise_pending(7)  # nothing pending
    words[0], words[1] = 2 | 16, 5
    with pytest.raises(ValueError) as e:
        status.raise_pending(7)
    assert str(e.value) == (
        "fa_tune::attention: an earlier call on cuda:7 had bad device metadata: cu_seqlens_k "
        "does not run from 0, non-decreasing, within the key rows; a key length exceeds "
        "max_seqlen_k (first at sequence 5); its out and lse are NaN (the kernel read nothing "
        "out of bounds)")
    assert list(words) == [0, 0]
    status.raise_pending(7)  # raised once
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: None)
    words[0] = 1
    with pytest.raises(ValueError, match="a call on cuda:7 had bad device metadata: "
                                         "cu_seqlens_q does not run"):
        ops.check()
    ops.check()


def test_sync_check_mode_and_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    was = status.sync_check()
    try:
        ops.set_sync_check(True)
        assert status.sync_check() is True
        ops.set_sync_check(False)
        assert status.sync_check() is False
    finally:
        ops.set_sync_check(was)
    ops.reset_stats()
    status.count("fallback:sdpa:decode (S_q=1 < 64)")
    status.count("fa_tune")
    status.count("fa_tune")
    assert ops.stats() == {"fa_tune": 2, "fallback:sdpa:decode (S_q=1 < 64)": 1}
    assert list(ops.stats())[0] == "fa_tune"
    ops.reset_stats()
    assert ops.stats() == {}


# ---- transformers backend: routing ---------------------------------------------------------------
class _Module(torch.nn.Module):
    is_causal = True


def _bhsd(B: int, S: int, H: int, d: int = 128, dtype: torch.dtype = BF16,
          device: str = "meta") -> torch.Tensor:
    """A [B, H, S, D] view of BSHD memory, as Llama's projections make it."""
    return torch.empty(B, S, H, d, dtype=dtype, device=device).transpose(1, 2)


@pytest.fixture
def kernel_calls(stub_lib: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The op calls the backend makes (hf._kernel), each as its arguments."""
    calls: list[tuple] = []
    real = hf._kernel
    monkeypatch.setattr(hf, "_kernel", lambda *a: calls.append(a) or real(*a))
    ops.reset_stats()
    return calls


def test_hf_backend_calls_the_op_with_views(kernel_calls: list) -> None:
    # A prefill, and a prompt continuing a cached prefix: 512 queries over the cache's 4096 +
    # 512 keys in the DynamicCache's [B, H, S, D] memory, read in place.
    cache_k, cache_v = (torch.empty(1, 8, 4608, 128, dtype=BF16, device="meta") for _ in "kv")
    for q, k, v in ((_bhsd(1, 1024, 32), _bhsd(1, 1024, 8), _bhsd(1, 1024, 8)),
                    (_bhsd(1, 512, 32), cache_k, cache_v)):
        out, w = ops.hf_attention_forward(_Module(), q, k, v, None, scaling=0.088)
        assert out.shape == (1, q.shape[2], 32, 128) and w is None
        qq, kk, vv, causal, scale = kernel_calls[-1]
        assert (causal, scale) == (True, 0.088)
        assert kk.data_ptr() == k.data_ptr() and kk.stride() == k.transpose(1, 2).stride()
    assert kernel_calls[-1][1].shape == (1, 4608, 8, 128)
    assert kernel_calls[-1][1].stride() == (8 * 4608 * 128, 128, 4608 * 128, 1)


@pytest.mark.parametrize("change, key", [
    ({"attention_mask": torch.ones(1, 1, 1024, 1024, dtype=torch.bool, device="meta")},
     "fallback:sdpa:attention mask"),
    ({"query": _bhsd(1, 1, 32)}, "fallback:sdpa:decode (S_q=1 < 64)"),
    ({"query": _bhsd(1, 63, 32)}, "fallback:sdpa:decode (S_q=63 < 64)"),
    ({"sliding_window": 4096}, "fallback:sdpa:sliding window"),
    ({"softcap": 30.0}, "fallback:eager:softcap"),
    ({"s_aux": torch.zeros(32, dtype=BF16, device="meta")}, "fallback:eager:attention sinks"),
    ({"dropout": 0.1}, "fallback:sdpa:dropout"),
    ({"query": _bhsd(1, 1024, 32, dtype=torch.float16),
      "key": _bhsd(1, 1024, 8, dtype=torch.float16),
      "value": _bhsd(1, 1024, 8, dtype=torch.float16)}, "fallback:sdpa:dtype torch.float16"),
    ({"query": _bhsd(1, 1024, 32, 64), "key": _bhsd(1, 1024, 8, 64),
      "value": _bhsd(1, 1024, 8, 64)}, "fallback:sdpa:head dim 64"),
    ({"is_causal": False}, "fallback:sdpa:non-causal"),
    ({"query": _bhsd(1, 20000, 32), "key": _bhsd(1, 20000, 8), "value": _bhsd(1, 20000, 8)},
     "fallback:sdpa:no bucket (Hq=32 Hkv=8 S_q=20000 S_k=20000)"),
])
def test_hf_calls_the_kernel_does_not_serve_go_to_a_stated_fallback(
        kernel_calls: list, monkeypatch: pytest.MonkeyPatch, change: dict, key: str) -> None:
    monkeypatch.setattr(fallback, "_fa3_checked", True)
    monkeypatch.setattr(fallback, "_fa3", None)  # FA3 absent: sdpa, or eager where it cannot
    args = {"query": _bhsd(1, 1024, 32), "key": _bhsd(1, 1024, 8), "value": _bhsd(1, 1024, 8),
            "attention_mask": None, **change}
    out, w = ops.hf_attention_forward(_Module(), **args)
    q = args["query"]
    assert out.shape == (q.shape[0], q.shape[2], q.shape[1], q.shape[3]) and w is None
    assert kernel_calls == [] and ops.stats() == {key: 1}


def test_hf_fallback_prefers_fa3(kernel_calls: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where FA3 imports it takes decode steps, softcap and sinks: BSHD views, its own
    bottom-right causal mask; a call with a mask tensor stays with sdpa."""
    seen: list[tuple] = []

    def fake_fa3(q, k, v, **kw):
        seen.append((q, k, kw))
        return torch.empty(q.shape, dtype=q.dtype, device=q.device), None

    monkeypatch.setattr(fallback, "_fa3_checked", True)
    monkeypatch.setattr(fallback, "_fa3", fake_fa3)
    with FakeTensorMode():  # CUDA tensors without a GPU: FA3 takes CUDA calls only
        def t(B: int, S: int, H: int) -> torch.Tensor:
            return _bhsd(B, S, H, device="cuda")

        cache = torch.empty(1, 8, 4097, 128, dtype=BF16, device="cuda")
        out, _ = ops.hf_attention_forward(_Module(), t(1, 1, 32), cache, cache, None,
                                          scaling=0.1)
        q, k, kw = seen[-1]
        assert out.shape == (1, 1, 32, 128) and kw == {"softmax_scale": 0.1, "causal": True}
        assert q.shape == (1, 1, 32, 128) and k.shape == (1, 4097, 8, 128)  # BSHD views
        ops.hf_attention_forward(_Module(), t(1, 1024, 32), t(1, 1024, 8), t(1, 1024, 8), None,
                                 softcap=30.0, s_aux=torch.zeros(32, dtype=BF16, device="cuda"))
        assert seen[-1][2]["softcap"] == 30.0 and seen[-1][2]["learnable_sink"].shape == (32,)
        # FA3 takes no mask tensor and no window (transformers' window is not FA's): sdpa.
        mask = torch.ones(1, 1, 1, 4097, dtype=torch.bool, device="cuda")
        assert fallback.choose(t(1, 1, 32), mask, 0.0, None, None, None) == "sdpa"
        assert fallback.choose(t(1, 1, 32), None, 0.0, 4096, None, None) == "sdpa"
        assert fallback.choose(t(1, 1, 32), mask, 0.0, None, 30.0, None) == "eager"
        assert fallback.choose(t(1, 1, 32).float(), None, 0.0, None, None, None) == "sdpa"
    assert len(seen) == 2 and ops.stats() == {
        "fallback:fa3:decode (S_q=1 < 64)": 1, "fallback:fa3:softcap": 1}


def test_hf_refusals_are_one_line(stub_lib: Path) -> None:
    class BlockMask:
        pass

    with pytest.raises(ValueError, match="got a BlockMask mask; this backend's fallbacks take "
                                         "tensor masks"):
        ops.hf_attention_forward(_Module(), _bhsd(1, 64, 32), _bhsd(1, 64, 8), _bhsd(1, 64, 8),
                                 BlockMask())
    cu = torch.tensor([0, 5000], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"packed sequences \(dtype torch.float16\) have no "
                                         "fallback here"):
        ops.hf_attention_forward(_Module(), _bhsd(1, 5000, 32, dtype=torch.float16),
                                 _bhsd(1, 5000, 8, dtype=torch.float16),
                                 _bhsd(1, 5000, 8, dtype=torch.float16), None,
                                 cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=5000,
                                 max_length_k=5000)
    with pytest.raises(ValueError, match="cu_seq_lens_k, max_length_k are missing"):
        ops.hf_attention_forward(_Module(), _bhsd(1, 5000, 32), _bhsd(1, 5000, 8),
                                 _bhsd(1, 5000, 8), None, cu_seq_lens_q=cu, max_length_q=5000)


# ---- transformers backend: packed sequences ---------------------------------------------------
def _packed_call(q_len: int = 5000, k_len: int = 5000, **kwargs):
    return ops.hf_attention_forward(_Module(), _bhsd(1, q_len, 32), _bhsd(1, k_len, 8),
                                    _bhsd(1, k_len, 8), kwargs.pop("attention_mask", None),
                                    scaling=0.088, **kwargs)


def test_hf_backend_runs_flash_attention_kwargs_as_varlen(kernel_calls: list) -> None:
    """DataCollatorWithFlattening(return_flash_attn_kwargs=True)'s batch: cu_seq_lens_q/k and
    max_length_q/k reach the op's varlen path, q/k/v as [tokens, H, D] views; the key lengths
    may differ from the query lengths (each sequence continuing its own prefix)."""
    cu = torch.tensor([0, 1000, 3000, 5000], dtype=torch.int32)
    cu_k = torch.tensor([0, 3000, 6000, 9000], dtype=torch.int32)
    out, w = _packed_call(5000, 9000, cu_seq_lens_q=cu, cu_seq_lens_k=cu_k, max_length_q=2000,
                          max_length_k=3000, position_ids=torch.arange(5000)[None])
    assert out.shape == (1, 5000, 32, 128) and w is None
    (q, k, v, causal, scale, cu_q, cu_k2, max_q, max_k), = kernel_calls
    assert q.shape == (5000, 32, 128) and k.shape == v.shape == (9000, 8, 128)
    assert (causal, scale, max_q, max_k) == (True, 0.088, 2000, 3000)
    assert cu_q.dtype == cu_k2.dtype == torch.int32 and cu_q.device == q.device  # moved to q's
    _packed_call(cu_seq_lens_q=cu.long(), cu_seq_lens_k=cu.long(), max_length_q=2000,
                 max_length_k=torch.tensor(2100))  # int64 lengths are converted
    assert kernel_calls[-1][5].dtype == torch.int32 and kernel_calls[-1][8] == 2100


def test_hf_backend_runs_packed_sequences_as_varlen(kernel_calls: list) -> None:
    from tuner.ship.fa_tune_ops.hf import PackedSequences

    ids = torch.tensor([[0] * 3000 + [1] * 2000])
    out, _ = _packed_call(attention_mask=PackedSequences(ids))
    assert out.shape == (1, 5000, 32, 128)
    (q, _, _, _, _, cu_q, cu_k, max_q, max_k), = kernel_calls
    assert q.shape == (5000, 32, 128) and (max_q, max_k) == (3000, 3000) and cu_k is cu_q
    assert cu_q.device == q.device and cu_q.dtype == torch.int32


# ---- transformers backend: the mask function --------------------------------------------------
@pytest.fixture
def tiny_llama(stub_lib: Path):
    """A one-layer Llama with Llama-3-8B's heads on meta tensors, attn_implementation fa_tune."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    ops.register_hf()
    cfg = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                                   head_dim=128, intermediate_size=256, vocab_size=64,
                                   num_hidden_layers=1)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg).to(BF16)
    model.set_attn_implementation("fa_tune")
    return model


def _mask(model, q_len: int, attention_mask=None, cache=None, position_ids=None, **extra):
    import inspect

    from transformers.masking_utils import create_causal_mask

    past = cache.get_seq_length() if cache is not None else 0
    emb = torch.zeros(attention_mask.shape[0] if attention_mask is not None else 1, q_len, 8)
    if position_ids is None:
        position_ids = torch.arange(past, past + q_len)[None]
    base = {"config": model.config, "inputs_embeds": emb, "attention_mask": attention_mask,
            "past_key_values": cache, "position_ids": position_ids,
            "cache_position": torch.arange(past, past + q_len), **extra}
    params = inspect.signature(create_causal_mask).parameters
    return create_causal_mask(**{k: v for k, v in base.items() if k in params})


def _dynamic_cache(model, past: int, B: int = 1):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    kv = torch.zeros(B, 8, past, 128)
    cache.update(kv, kv, 0)
    return cache


def test_hf_mask_function_decisions(tiny_llama) -> None:
    """No mask exactly where the kernel's bottom-right causal mask is the whole story; a real
    mask (materialised, never sdpa's top-left 'use is_causal' None) for everything else."""
    from transformers import StaticCache

    from tuner.ship.fa_tune_ops.hf import PackedSequences

    model = tiny_llama
    ones = torch.ones(2, 24, dtype=torch.long)
    pad = ones.clone()
    pad[0, :3] = 0
    assert _mask(model, 16) is None  # a prompt, no cache
    assert _mask(model, 24, ones) is None  # generate() passes an all-ones mask
    m = _mask(model, 24, pad)
    assert isinstance(m, torch.Tensor) and m.shape == (2, 1, 24, 24) and m.dtype == torch.bool
    # A continuation over a DynamicCache: 8 queries after 16 cached keys, bottom-right.
    assert _mask(model, 8, ones, _dynamic_cache(model, 16, B=2)) is None
    assert _mask(model, 1, ones[:, :17], _dynamic_cache(model, 16, B=2)) is None  # decode
    m = _mask(model, 8, pad, _dynamic_cache(model, 16, B=2))
    assert m.shape == (2, 1, 8, 24) and not m[0, 0, :, :3].any() and m[1, 0, -1].all()
    # A static cache: its keys run past the queries; the mask says which are real.
    static = StaticCache(config=model.config, max_cache_len=64)
    m = _mask(model, 8, None, static)
    assert isinstance(m, torch.Tensor) and m.shape[-1] == 64 and not m[0, 0, 0, 8:].any()
    # Packed sequences: PackedSequences; with an overlay too: a real mask.
    pos = torch.cat([torch.arange(5), torch.arange(3), torch.arange(8)])[None]
    m = _mask(model, 16, position_ids=pos)
    assert isinstance(m, PackedSequences) and m.varlen()[0].tolist() == [0, 5, 8, 16]
    m = _mask(model, 16, position_ids=pos, and_mask_function=lambda b, h, q, kv: kv >= 0)
    assert isinstance(m, torch.Tensor) and m.shape == (1, 1, 16, 16)


def test_hf_llama_on_meta_prefill_continuation_decode(tiny_llama, kernel_calls: list) -> None:
    """model(...) with a DynamicCache: the prompt and its continuation run the op (the cache
    read in place), the decode step goes to the fallback; stats() says so."""
    from transformers import DynamicCache

    cache = DynamicCache(config=tiny_llama.config)
    with torch.no_grad():
        for n in (128, 64, 1):
            ids = torch.zeros(1, n, dtype=torch.long, device="meta")
            out = tiny_llama(input_ids=ids, past_key_values=cache, use_cache=True)
            assert out.logits.shape == (1, n, 64)
    assert [(c[0].shape[1], c[1].shape[1]) for c in kernel_calls] == [(128, 128), (64, 192)]
    assert kernel_calls[1][1].stride() == (8 * 192 * 128, 128, 192 * 128, 1)  # the cache's
    assert ops.stats() == {"fallback:sdpa:decode (S_q=1 < 64)": 1}


# ---- transformers backend: the fallbacks' numbers (CPU, FP32) ------------------------------------
def _ref(q, k, v, keep, scale, softcap=None, sink=None):
    """Attention written out per head, [B, H, S, D] in and [B, S, H, D] out."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~keep, float("-inf"))
    if sink is not None:
        s = torch.cat([s, sink.reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)], -1)
    p = torch.softmax(s, -1)[..., :k.shape[2]]
    return (p @ v).transpose(1, 2)


def test_fallbacks_compute_bottom_right_attention() -> None:
    assert fallback.bottom_right_mask(2, 4, torch.device("cpu")).tolist() == [
        [True, True, True, False], [True, True, True, True]]
    assert fallback.bottom_right_mask(2, 4, torch.device("cpu"), 2).tolist() == [
        [False, True, True, False], [False, False, True, True]]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 16, generator=g)
    k, v = (torch.randn(2, 2, 12, 16, generator=g) for _ in "kv")
    keep = fallback.bottom_right_mask(5, 12, q.device)
    want = _ref(q, k, v, keep, 0.25)
    for where in ("sdpa", "eager"):
        got = fallback.run(where, q, k, v, None, True, 0.25)
        assert torch.allclose(got, want, atol=1e-5), where
    # Decode: one query sees every key; a window; a mask as transformers gives it.
    one = fallback.run("sdpa", q[:, :, :1], k, v, None, True, 0.25)
    assert torch.allclose(one, _ref(q[:, :, :1], k, v, torch.ones(1, 12, dtype=torch.bool),
                                     0.25), atol=1e-5)
    win = fallback.run("sdpa", q, k, v, None, True, 0.25, sliding_window=4)
    assert torch.allclose(win, _ref(q, k, v, fallback.bottom_right_mask(5, 12, q.device, 4),
                                    0.25), atol=1e-5)
    mask = torch.rand(2, 1, 5, 12, generator=g) > 0.3
    mask[..., 0] = True
    for where in ("sdpa", "eager"):
        got = fallback.run(where, q, k, v, mask, True, 0.25)
        assert torch.allclose(got, _ref(q, k, v, mask, 0.25), atol=1e-5), where
    sink = torch.randn(4, generator=g)
    got = fallback.run("eager", q, k, v, None, True, 0.25, softcap=5.0, sinks=sink)
    assert torch.allclose(got, _ref(q, k, v, keep, 0.25, 5.0, sink), atol=1e-5)


def test_hf_llama_on_cpu_matches_sdpa_through_the_fallback(stub_lib: Path) -> None:
    """A tiny Llama on CPU (FP32): every call falls back (the kernel needs CUDA), and the
    logits of a padded batch and a greedy generate() equal sdpa's."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    ops.register_hf()
    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=16, intermediate_size=64, vocab_size=50,
                                   num_hidden_layers=2, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(1, 50, (2, 12))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    out = {}
    for impl in ("sdpa", "fa_tune"):
        model.set_attn_implementation(impl)
        ops.reset_stats()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
            gen = model.generate(ids[1:], max_new_tokens=5, do_sample=False)
        out[impl] = (logits, gen, ops.stats())
    assert torch.allclose(out["fa_tune"][0][:, 4:], out["sdpa"][0][:, 4:], atol=1e-5)
    assert torch.equal(out["fa_tune"][1], out["sdpa"][1])
    # The padded batch with its mask (2 layers); generate()'s prefill and 4 decode steps.
    assert out["fa_tune"][2] == {"fallback:sdpa:attention mask": 2,
                                 "fallback:sdpa:CPU tensors": 2 * 5}


# ---- the C++ launch path (native.py) -------------------------------------------------------------
_NATIVE_PROBE = """
import os, torch, tuner.ship.fa_tune_ops as ops
from tuner.ship.fa_tune_ops import native
print('at import:', native.status())
ops.load(os.environ.get('PROBE_LIB'))
print('after load:', native.status())
dump = torch._C._dispatch_dump('fa_tune::attention')
print('CUDA kernel:', [ln for ln in dump.splitlines() if ln.startswith('CUDA')])
q = torch.empty(1, 1024, 32, 128, dtype=torch.bfloat16, device='meta')
k = torch.empty(1, 4096, 8, 128, dtype=torch.bfloat16, device='meta')
out, lse = torch.ops.fa_tune.attention(q, k, k, True, None)
print('meta:', tuple(out.shape), tuple(lse.shape))
try:
    c = torch.empty(1, 1024, 8, 128, dtype=torch.bfloat16)
    torch.ops.fa_tune.attention(torch.empty(1, 1024, 32, 128), c, c, True, None)
except ValueError as e:
    print('refused:', e)
"""


def _torch_has_cuda_headers() -> bool:
    """A CPU build of torch ships c10/cuda headers without their generated macros file."""
    inc = Path(torch.__file__).resolve().parent / "include" / "c10" / "cuda" / "impl"
    return (inc / "cuda_cmake_macros.h").is_file()


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="needs g++")
@pytest.mark.skipif(not _torch_has_cuda_headers(),
                    reason="this torch is a CPU build: its c10/cuda headers are incomplete")
@pytest.mark.parametrize("when", ["import", "load", "off"])
def test_native_launch_path_builds_loads_and_binds(stub_lib: Path, tmp_path: Path,
                                                   when: str) -> None:
    """The extension compiles against this torch and fa_tune.h and becomes the op's CUDA
    kernel when found beside the library: the default one at import, or one given to load()
    later (it replaces the Python kernel); FA_TUNE_OPS_NATIVE=0 keeps the Python one. It binds
    on load and leaves the fake implementation and the errors as they were."""
    import os
    import shutil

    from tuner.ship.fa_tune_ops import native

    lib = tmp_path / "lib" / stub_lib.name
    lib.parent.mkdir()
    shutil.copy2(stub_lib, lib)
    ext = native.build(lib.parent)
    assert ext.name == native.ext_name() == (f"libfa_tune_torch.{torch.__version__}."
                                             f"abi{ops.abi.ABI_VERSION}.so")
    env = {**os.environ, "FA_TUNE_OPS_NATIVE": "0" if when == "off" else "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("FA_TUNE_LIB", None)
    env["FA_TUNE_LIB" if when == "import" else "PROBE_LIB"] = str(lib)
    p = subprocess.run([sys.executable, "-c", _NATIVE_PROBE], capture_output=True, text=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    if when != "off":
        first = "loaded, not bound yet" if when == "import" else "no libfa_tune_torch"
        assert f"at import: {first}" in out and "after load: active" in out
        assert "attention_op.cpp" in out.split("CUDA kernel:")[1].splitlines()[0]
    else:
        assert "at import: off (FA_TUNE_OPS_NATIVE=0)" in out
        assert "attention_op.cpp" not in out.split("CUDA kernel:")[1].splitlines()[0]
    assert "meta: (1, 1024, 32, 128) (1, 32, 1024)" in out
    assert "refused: fa_tune::attention: q is torch.float32" in out


def test_native_build_finds_the_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.ship.fa_tune_ops import native

    assert native.header_dir() == Path(ops.__file__).resolve().parents[3] / "cuda_src" / "fa_tune"
    if native._cuda_include() is not None:
        assert f"-I{native.header_dir()}" in native.compile_command(tmp_path / "x.so")
    monkeypatch.setenv("CXX", "false")
    if native._cuda_include() is None:
        pytest.skip("no CUDA headers here")
    with pytest.raises(native.NativeBuildError, match="^false failed"):
        native.build(tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-written


# ---- the models' masks (issue 36; ABI 4) --------------------------------------------------------
@pytest.mark.parametrize("kwargs, needle", [
    ({"window": 4096}, "window=4096: libfa_tune_fwd.so is built without sliding windows"),
    ({"softcap": 50.0}, "softcap=50.0: libfa_tune_fwd.so is built without softcapping"),
    ({"sinks": torch.zeros(32, device="meta")}, "sinks given: libfa_tune_fwd.so is built "
                                                "without attention sinks"),
    ({"window": -1}, "window must be a number of keys from 1 to 2^30"),
])
def test_masks_the_library_lacks_are_refused(stub_lib: Path, kwargs: dict, needle: str) -> None:
    """The fake implementation (what torch.compile traces) says it in one line, as the CUDA one."""
    msg = one_error(lambda: ops.attention(*qkv(), **kwargs))
    assert needle in msg, msg


def test_masks_a_library_carries_are_checked() -> None:
    from types import SimpleNamespace

    lib = SimpleNamespace(window=True, softcap=True, sinks=True, path=Path("lib.so"))
    q = empty(1, 128, 32, 128)
    sinks = torch.zeros(32, device="meta")
    checks._check_masks(q, 4096, 50.0, sinks, lib)  # type: ignore[arg-type]
    for args, needle in [((0, 0.0, None), "built for softcapped scores; pass the model's cap"),
                         ((0, 50.0, torch.zeros(8, device="meta")),
                          "sinks must be 1-D [Hq] = [32]"),
                         ((0, 50.0, torch.zeros(32, device="meta", dtype=BF16)),
                          "sinks is torch.bfloat16; the kernel takes torch.float32"),
                         ((0, float("nan"), None), "softcap must be finite and >= 0")]:
        with pytest.raises(ValueError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            checks._check_masks(q, *args, lib)  # type: ignore[arg-type]


# ---- transformers backend: the models' masks (issue 36) ---------------------------------------
def _tiny(kind: str, **cfg_kw):
    """A one-layer model of ``kind`` on meta tensors, attn_implementation fa_tune."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    ops.register_hf()
    cls_cfg = {"mistral": "MistralConfig", "gemma2": "Gemma2Config", "gpt_oss": "GptOssConfig"}
    cls_model = {"mistral": "MistralForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "gpt_oss": "GptOssForCausalLM"}
    cfg = getattr(transformers, cls_cfg[kind])(vocab_size=64, intermediate_size=256,
                                                num_hidden_layers=1, **cfg_kw)
    with torch.device("meta"):
        model = getattr(transformers, cls_model[kind])(cfg).to(BF16)
    model.set_attn_implementation("fa_tune")
    return model


@pytest.fixture
def masked_lib(stub_lib: Path, monkeypatch: pytest.MonkeyPatch):
    """The stub library as if its class had all three masks (its calls record the args)."""
    lib = ops.library()
    for name in ("window", "softcap", "sinks"):
        monkeypatch.setattr(lib, name, False)
    return lib


def test_hf_sliding_window_mask_is_the_kernels(stub_lib: Path) -> None:
    """Mistral's sliding-window layers: the mask function hands the window on (SlidingWindow)
    where the rest is the kernel's bottom-right causal mask; padding still makes a real mask."""
    from tuner.ship.fa_tune_ops.hf import SlidingWindow

    model = _tiny("mistral", hidden_size=512, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=128, sliding_window=64)
    from transformers.masking_utils import create_sliding_window_causal_mask

    emb = torch.zeros(1, 100, 8)
    m = create_sliding_window_causal_mask(config=model.config, inputs_embeds=emb,
                                          attention_mask=None, past_key_values=None,
                                          position_ids=torch.arange(100)[None])
    assert isinstance(m, SlidingWindow) and m.window == 64
    t = m.tensor()  # the fallback's: transformers' own window (64 keys, the diagonal included)
    assert t.shape == (1, 1, 100, 100) and bool(t[0, 0, 99, 36]) and not bool(t[0, 0, 99, 35])
    pad = torch.ones(2, 100, dtype=torch.long)
    pad[0, :3] = 0
    m = create_sliding_window_causal_mask(config=model.config, inputs_embeds=torch.zeros(2, 100, 8),
                                          attention_mask=pad, past_key_values=None,
                                          position_ids=torch.arange(100)[None])
    assert isinstance(m, torch.Tensor)


@pytest.mark.parametrize("kind, has, expect", [
    ("mistral", (), "fallback:sdpa:sliding window"),
    ("mistral", ("window",), None),
    ("gemma2", ("window",), "fallback:eager:softcap"),
    ("gemma2", ("window", "softcap"), None),
    ("gpt_oss", ("window",), "fallback:eager:attention sinks"),
    ("gpt_oss", ("window", "sinks"), None),
])
def test_hf_models_masks_run_the_kernel_where_the_library_has_them(
        masked_lib, kernel_calls: list, monkeypatch: pytest.MonkeyPatch, kind: str,
        has: tuple, expect: str | None) -> None:
    """A prefill of each model: with a library of the right class the op gets the window (in
    keys), the cap and the sinks (FP32); without, the stated fallback."""
    monkeypatch.setattr(fallback, "_fa3_checked", True)
    monkeypatch.setattr(fallback, "_fa3", None)
    for name in has:
        monkeypatch.setattr(masked_lib, name, True)
    kw = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
          "head_dim": 128}  # the stub library's buckets serve 32/8
    if kind == "mistral":
        kw["sliding_window"] = 64
    elif kind == "gemma2":
        kw.update(sliding_window=64, attn_logit_softcapping=50.0, final_logit_softcapping=None,
                  query_pre_attn_scalar=128, layer_types=["sliding_attention"])
    else:
        kw.update(sliding_window=64, num_local_experts=2, num_experts_per_tok=1,
                  layer_types=["sliding_attention"])
    model = _tiny(kind, **kw)
    from transformers import DynamicCache

    # A cache, as generate() has: transformers then looks for packed sequences in no position
    # ids (which meta tensors could not answer).
    with torch.no_grad():
        model(input_ids=torch.zeros(1, 128, dtype=torch.long, device="meta"),
              past_key_values=DynamicCache(config=model.config), use_cache=True)
    if expect is not None:
        assert kernel_calls == [] and ops.stats() == {expect: 1}
        return
    (call,) = kernel_calls
    window, softcap, sinks = call[10:13]
    assert window == 64
    assert softcap == (50.0 if kind == "gemma2" else 0.0)
    assert (sinks is not None) == (kind == "gpt_oss")
    if sinks is not None:
        assert sinks.dtype == torch.float32 and sinks.shape == (32,)
