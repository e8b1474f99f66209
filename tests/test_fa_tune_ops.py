"""The exported PyTorch package (tuner/fa_tune_ops) without a GPU: op registration, the fake
implementation (FakeTensorMode, meta tensors, torch.compile tracing), fixed length and varlen,
one clear error for every unsupported input, and the transformers backend's registration,
routing of packed sequences and refusals. The library is the real generated dispatcher over
stub buckets (tests/dispatch_stub.py). Skipped without torch (an optional extra: pip install
torch; transformers for the backend tests)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="fa_tune_ops needs PyTorch (pip install torch)")

from dispatch_stub import build_stub_library  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402

from tuner import dispatch  # noqa: E402
from tuner.workload import workload_from_dict  # noqa: E402

ops = pytest.importorskip("tuner.fa_tune_ops", reason="fa_tune_ops needs PyTorch")

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
    """llama3-8b's four buckets over the stub's: s1k and s2k serve varlen, s4k's object predates
    it, s8k (the multicast preset) has the functions without the kernel. Loaded for the test,
    then the two-bucket library again."""
    from tuner.workload import load_workload

    w = load_workload("llama3-8b")
    t = dispatch.table_for_workload(w, dispatch.bucket_sources(
        w, ["s8k=preset:multicast"], default="preset:default"))
    so = build_stub_library(t, tmp_path_factory.mktemp("opslib4"))
    yield ops.load(str(so))
    ops.load(str(stub_lib))


def packed(total: int = 5000, hq: int = 32, hkv: int = 8, d: int = 128, device: str = "meta",
           dtype: torch.dtype = BF16, seqs: int = 3) -> tuple[torch.Tensor, ...]:
    """Varlen q, k, v [total, H, D] and cu_seqlens int32 [seqs + 1] on one device."""
    return (torch.empty(total, hq, d, device=device, dtype=dtype),
            torch.empty(total, hkv, d, device=device, dtype=dtype),
            torch.empty(total, hkv, d, device=device, dtype=dtype),
            torch.empty(seqs + 1, device=device, dtype=torch.int32))


def qkv(B: int = 1, S: int = 1024, hq: int = 32, hkv: int = 8, d: int = 128,
        device: str = "meta", dtype: torch.dtype = BF16) -> tuple[torch.Tensor, ...]:
    return (torch.empty(B, S, hq, d, device=device, dtype=dtype),
            torch.empty(B, S, hkv, d, device=device, dtype=dtype),
            torch.empty(B, S, hkv, d, device=device, dtype=dtype))


def test_op_is_registered(stub_lib: Path) -> None:
    op = torch.ops.fa_tune.attention.default
    s = str(op._schema)
    assert s.startswith("fa_tune::attention(Tensor q, Tensor k, Tensor v, bool causal=True, "
                        "float? softmax_scale=None, Tensor? cu_seqlens=None")
    assert s.endswith("-> (Tensor out, Tensor lse)")
    assert ops.library().path == stub_lib and ops.library().head_dim == 128


def test_meta_and_fake_shapes(stub_lib: Path) -> None:
    q, k, v = qkv(2, 3000)
    out, lse = torch.ops.fa_tune.attention(q, k, v, True, None)
    assert out.shape == q.shape and out.dtype == BF16 and out.is_contiguous()
    assert lse.shape == (2, 32, 3000) and lse.dtype == torch.float32 and lse.device == q.device
    with FakeTensorMode():
        q, k, v = qkv(1, 8192, device="cuda")
        out, lse = ops.attention(q, k, v, softmax_scale=0.1)
        assert isinstance(out, FakeTensor) and out.device == q.device
        assert out.shape == (1, 8192, 32, 128) and lse.shape == (1, 32, 8192)


def test_varlen_meta_and_fake_shapes(stub_lib: Path) -> None:
    q, k, v, cu = packed(5000)
    out, lse = torch.ops.fa_tune.attention(q, k, v, True, None, cu, 2000)
    assert out.shape == (5000, 32, 128) and out.dtype == BF16 and out.is_contiguous()
    assert lse.shape == (32, 5000) and lse.dtype == torch.float32 and lse.device == q.device
    with FakeTensorMode():
        q, k, v, cu = packed(8192, device="cuda", seqs=4)
        out, lse = ops.attention(q, k, v, softmax_scale=0.1, cu_seqlens=cu, max_seqlen=16384)
        assert isinstance(out, FakeTensor) and out.device == q.device
        assert out.shape == (8192, 32, 128) and lse.shape == (32, 8192)


def test_compile_fullgraph_traces_varlen(stub_lib: Path) -> None:
    def f(q, k, v, cu, max_seqlen):
        out, lse = torch.ops.fa_tune.attention(q, k, v, True, None, cu, max_seqlen)
        return out * 2, lse

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    out, lse = torch.compile(f, fullgraph=True, backend=backend)(*packed(4096), 1500)
    assert out.shape == (4096, 32, 128) and lse.shape == (32, 4096)
    assert "torch.ops.fa_tune.attention" in graphs[0].code
    out, _ = torch.compile(f, fullgraph=True, backend="aot_eager")(*packed(1024), 1024)
    assert out.shape == (1024, 32, 128)


def test_compile_fullgraph_traces_the_op(stub_lib: Path) -> None:
    def f(q, k, v):
        out, lse = torch.ops.fa_tune.attention(q, k, v, True, None)
        return out * 2, lse

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    out, lse = torch.compile(f, fullgraph=True, backend=backend)(*qkv(1, 512))
    assert out.shape == (1, 512, 32, 128) and lse.shape == (1, 32, 512)
    assert "torch.ops.fa_tune.attention" in graphs[0].code
    # AOT autograd's tracing runs the fake implementation too.
    out, _ = torch.compile(f, fullgraph=True, backend="aot_eager")(*qkv(1, 1024))
    assert out.shape == (1, 1024, 32, 128)


def _noncontig() -> tuple[torch.Tensor, ...]:
    q, k, v = qkv()
    return q.transpose(1, 2).contiguous().transpose(1, 2), k, v


@pytest.mark.parametrize("make, kwargs, needle", [
    (lambda: qkv(dtype=torch.float16), {}, "q is torch.float16; the kernel takes torch.bfloat16"),
    (lambda: qkv(d=64), {}, "head dim 64: this library is built for head dim 128"),
    (lambda: qkv(), {"causal": False}, "causal=False: this library is built causal only"),
    (_noncontig, {}, "is not contiguous"),
    (lambda: qkv(), {"softmax_scale": 0.0}, "softmax_scale must be finite and > 0"),
    (lambda: qkv(), {"softmax_scale": float("nan")}, "softmax_scale must be finite"),
    (lambda: qkv(hq=64), {}, "no bucket of libfa_tune_fwd.so serves B=1 Hq=64 Hkv=8 S=1024"),
    (lambda: qkv(S=20000), {}, "it serves Hq=32 Hkv=8 S 1..2048 (short); Hq=32 Hkv=8 S "
                               "2049..16384 (long)"),
    (lambda: qkv(hq=30, hkv=8), {}, "Hq=30 must be a multiple of Hkv=8"),
    (lambda: qkv(hkv=0), {}, "Hq=32 must be a multiple of Hkv=0"),
    (lambda: qkv(S=0), {}, "is empty; B, S and Hq must be at least 1"),
    (lambda: (qkv()[0], qkv(S=512)[1], qkv(S=512)[2]), {}, "query length = key length"),
    (lambda: (qkv()[0][0], *qkv()[1:]), {}, "must be 4-D BSHD"),
    (lambda: qkv(S=64, device="cpu"), {}, "must be CUDA tensors; got cpu"),
])
def test_unsupported_input_is_one_clear_error(stub_lib: Path, make, kwargs, needle) -> None:
    q, k, v = make()
    with pytest.raises(ValueError) as e:
        torch.ops.fa_tune.attention(q, k, v, **kwargs)
    msg = str(e.value)
    assert msg.startswith("fa_tune::attention: ") and needle in msg and "\n" not in msg


def _cu(n: int = 4, dtype: torch.dtype = torch.int32, device: str = "meta") -> torch.Tensor:
    return torch.empty(n, dtype=dtype, device=device)


@pytest.mark.parametrize("make, kwargs, needle", [
    (lambda: qkv(), {"cu_seqlens": _cu()}, "varlen needs max_seqlen (the longest sequence"),
    (lambda: qkv(), {"max_seqlen": 100}, "max_seqlen goes with cu_seqlens (varlen)"),
    (lambda: qkv(), {"cu_seqlens": _cu(), "max_seqlen": 100},
     "with cu_seqlens, q, k and v are 3-D packed [total_tokens, heads, head_dim]; got q [1, "),
    (lambda: packed()[:3], {"cu_seqlens": _cu(dtype=torch.int64), "max_seqlen": 100},
     "cu_seqlens is torch.int64; the kernel takes torch.int32"),
    (lambda: packed()[:3], {"cu_seqlens": _cu(1), "max_seqlen": 100},
     "cu_seqlens must be 1-D [num_seqs + 1] with at least 2 entries; got [1]"),
    (lambda: packed()[:3], {"cu_seqlens": torch.empty(2, 3, dtype=torch.int32, device="meta"),
                            "max_seqlen": 100}, "cu_seqlens must be 1-D"),
    (lambda: packed()[:3], {"cu_seqlens": _cu(device="cpu"), "max_seqlen": 100},
     "cu_seqlens must be on q's device meta (the kernel reads it there); got cpu"),
    (lambda: packed()[:3], {"cu_seqlens": _cu(8)[::2], "max_seqlen": 100},
     "cu_seqlens with stride (2,) is not contiguous"),
    (lambda: packed()[:3], {"cu_seqlens": _cu(), "max_seqlen": 0},
     "max_seqlen must be at least 1"),
    (lambda: packed()[:3], {"cu_seqlens": _cu(), "max_seqlen": 20000},
     "no bucket of libfa_tune_fwd.so serves varlen Hq=32 Hkv=8 max_seqlen=20000; it serves "
     "Hq=32 Hkv=8 S 1..2048 (short)"),
    (lambda: packed(hq=64)[:3], {"cu_seqlens": _cu(), "max_seqlen": 100},
     "no bucket of libfa_tune_fwd.so serves varlen Hq=64 Hkv=8"),
    (lambda: packed(dtype=torch.float16)[:3], {"cu_seqlens": _cu(), "max_seqlen": 100},
     "q is torch.float16; the kernel takes torch.bfloat16 only"),
    (lambda: packed(d=64)[:3], {"cu_seqlens": _cu(), "max_seqlen": 100},
     "head dim 64: this library is built for head dim 128"),
    (lambda: packed()[:3], {"cu_seqlens": _cu(), "max_seqlen": 100, "causal": False},
     "causal=False: this library is built causal only"),
    (lambda: packed(hq=30)[:3], {"cu_seqlens": _cu(), "max_seqlen": 100},
     "Hq=30 must be a multiple of Hkv=8"),
    (lambda: packed(total=0)[:3], {"cu_seqlens": _cu(), "max_seqlen": 100},
     "q [0, 32, 128] is empty; total_tokens and Hq must be at least 1"),
    (lambda: (packed()[0], packed(total=4000)[1], packed(total=4000)[2]),
     {"cu_seqlens": _cu(), "max_seqlen": 100},
     "k and v must be [5000, Hkv, 128] for q [5000, 32, 128]"),
    (lambda: (packed()[0].transpose(0, 1).contiguous().transpose(0, 1), *packed()[1:3]),
     {"cu_seqlens": _cu(), "max_seqlen": 100}, "not contiguous; the kernel reads dense packed"),
    (lambda: packed(device="cpu")[:3], {"cu_seqlens": _cu(device="cpu"), "max_seqlen": 100},
     "must be CUDA tensors; got cpu"),
])
def test_unsupported_varlen_input_is_one_clear_error(stub_lib: Path, make, kwargs,
                                                     needle) -> None:
    q, k, v = make()
    with pytest.raises(ValueError) as e:
        torch.ops.fa_tune.attention(q, k, v, **kwargs)
    msg = str(e.value)
    assert msg.startswith("fa_tune::attention: ") and needle in msg and "\n" not in msg


def test_varlen_refused_by_a_bucket_without_it(four_buckets) -> None:
    q, k, v, cu = packed()
    out, _ = torch.ops.fa_tune.attention(q, k, v, True, None, cu, 2048)  # s2k serves it
    assert out.shape == q.shape
    for max_seqlen, needle in (
            (4096, "bucket s4k of libfa_tune_fwd.so cannot run varlen: it was built without "
                   "the varlen kernel (fa-tune export leaves it out where the config cannot "
                   "serve varlen: its README says why) (max_seqlen=4096 picks it)"),
            (8192, "bucket s8k of libfa_tune_fwd.so cannot run varlen: it was built without "
                   "the varlen kernel")):
        with pytest.raises(ValueError) as e:
            torch.ops.fa_tune.attention(q, k, v, True, None, cu, max_seqlen)
        assert needle in str(e.value) and "\n" not in str(e.value)
    # Fixed length is untouched by a bucket's varlen.
    out, _ = torch.ops.fa_tune.attention(*qkv(1, 8192), True, None)
    assert out.shape == (1, 8192, 32, 128)


def test_varlen_refused_by_a_library_without_it(stub_lib: Path) -> None:
    lib = ops.library()
    q, k, v, cu = packed()
    lib.forward_varlen = None  # as a library from before varlen
    try:
        with pytest.raises(ValueError, match="libfa_tune_fwd.so predates the varlen kernel"):
            torch.ops.fa_tune.attention(q, k, v, True, None, cu, 100)
    finally:
        ops.load(str(stub_lib))


def test_missing_library_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ops.LibraryError, match="no kernel library at .*FA_TUNE_LIB"):
        ops.load(str(tmp_path / "none.so"))


def test_one_copy_per_process(stub_lib: Path, tmp_path: Path) -> None:
    """The exported copy and fa-tune's own cannot both register fa_tune::attention."""
    import shutil

    shutil.copytree(Path(ops.__file__).parent, tmp_path / "fa_tune_ops")
    code = ("import tuner.fa_tune_ops\n"
            "try:\n    import fa_tune_ops\nexcept ImportError as e:\n    print('refused:', e)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**__import__("os").environ,
                                                    "PYTHONPATH": f"{tmp_path}"})
    assert p.returncode == 0, p.stderr[-2000:]
    assert "refused: the op fa_tune::attention is registered already" in p.stdout


# ---- transformers backend ------------------------------------------------------------------------
class _Module(torch.nn.Module):
    is_causal = True


def _bhsd(B: int, S: int, H: int) -> torch.Tensor:
    """A [B, H, S, D] view of BSHD memory, as Llama's projections make it."""
    return torch.empty(B, S, H, 128, dtype=BF16, device="meta").transpose(1, 2)


def test_hf_backend_calls_the_op(stub_lib: Path) -> None:
    out, w = ops.hf_attention_forward(_Module(), _bhsd(1, 1024, 32), _bhsd(1, 1024, 8),
                                      _bhsd(1, 1024, 8), None, scaling=0.088, dropout=0.0,
                                      position_ids=None, use_cache=False)
    assert out.shape == (1, 1024, 32, 128) and w is None


@pytest.mark.parametrize("change, needle", [
    ({"attention_mask": torch.empty(1, 1, 1024, 1024, device="meta")}, "got an attention mask"),
    ({"dropout": 0.1}, "dropout 0.1 > 0 is not supported"),
    ({"softcap": 30.0}, "softcap is not supported"),
    ({"sliding_window": 4096}, "sliding_window is not supported"),
    ({"key": _bhsd(1, 2048, 8), "value": _bhsd(1, 2048, 8)}, "query length 1024 != key length"),
    ({"is_causal": False}, "causal=False: this library is built causal only"),
    ({"query": torch.empty(1, 32, 1024, 128, dtype=BF16, device="meta")}, "not contiguous"),
])
def test_hf_backend_refuses_clearly(stub_lib: Path, change: dict, needle: str) -> None:
    args = {"query": _bhsd(1, 1024, 32), "key": _bhsd(1, 1024, 8), "value": _bhsd(1, 1024, 8),
            "attention_mask": None, **change}
    with pytest.raises(ValueError) as e:
        ops.hf_attention_forward(_Module(), **args)
    assert needle in str(e.value)


def test_hf_registration_and_masks(stub_lib: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    from transformers import AttentionInterface, LlamaConfig
    from transformers.masking_utils import AttentionMaskInterface, create_causal_mask

    ops.register_hf()
    assert AttentionInterface._global_mapping["fa_tune"] is ops.hf_attention_forward
    assert "fa_tune" in AttentionMaskInterface._global_mapping
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=128, intermediate_size=256, vocab_size=64, num_hidden_layers=1)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    model.set_attn_implementation("fa_tune")
    assert model.config._attn_implementation == "fa_tune"
    # A causal prefill without padding reaches the backend with no mask; a padded one with a
    # mask (which the backend refuses), not silently without.
    # (create_causal_mask's arguments moved between transformers versions: pass what it takes.)
    params = inspect.signature(create_causal_mask).parameters
    emb = torch.zeros(2, 16, 256)
    base = {"config": model.config, "position_ids": torch.arange(16).expand(2, 16),
            "cache_position": torch.arange(16), "past_key_values": None, "cache": None,
            "inputs_embeds": emb, "input_embeds": emb}
    kw = {k: v for k, v in base.items() if k in params}
    pad = torch.ones(2, 16, dtype=torch.long)
    pad[0, :3] = 0
    assert create_causal_mask(attention_mask=None, **kw) is None
    assert create_causal_mask(attention_mask=pad, **kw) is not None


# ---- transformers backend: packed sequences --------------------------------------------------
def _packed_call(**kwargs):
    return ops.hf_attention_forward(_Module(), _bhsd(1, 5000, 32), _bhsd(1, 5000, 8),
                                    _bhsd(1, 5000, 8), kwargs.pop("attention_mask", None),
                                    scaling=0.088, **kwargs)


def test_hf_backend_runs_flash_attention_kwargs_as_varlen(stub_lib: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """DataCollatorWithFlattening(return_flash_attn_kwargs=True)'s batch: cu_seq_lens_q/k and
    max_length_q/k reach the op's varlen path, q/k/v flattened to [tokens, H, D] views."""
    calls = []
    real = torch.ops.fa_tune.attention

    def spy(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(torch.ops.fa_tune, "attention", spy)
    cu = torch.tensor([0, 1000, 3000, 5000], dtype=torch.int32)
    out, w = _packed_call(cu_seq_lens_q=cu, cu_seq_lens_k=cu.clone(), max_length_q=2000,
                          max_length_k=2000, position_ids=torch.arange(5000)[None])
    assert out.shape == (1, 5000, 32, 128) and w is None
    (q, k, v, causal, scale, cu_seqlens, max_seqlen), = calls
    assert q.shape == (5000, 32, 128) and k.shape == v.shape == (5000, 8, 128)
    assert (causal, scale, max_seqlen) == (True, 0.088, 2000)
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.device == q.device  # moved to q's
    # int64 lengths (e.g. made by hand) are converted; the larger of the two bounds is taken.
    _packed_call(cu_seq_lens_q=cu.long(), cu_seq_lens_k=cu.long(), max_length_q=2000,
                 max_length_k=torch.tensor(2100))
    assert calls[-1][5].dtype == torch.int32 and calls[-1][6] == 2100


@pytest.mark.parametrize("kwargs, needle", [
    ({"cu_seq_lens_q": torch.tensor([0, 5000], dtype=torch.int32),
      "cu_seq_lens_k": torch.tensor([0, 4000, 5000], dtype=torch.int32),
      "max_length_q": 5000, "max_length_k": 4000}, "cu_seq_lens_q != cu_seq_lens_k"),
    ({"cu_seq_lens_q": torch.tensor([0, 2000, 5000], dtype=torch.int32),
      "cu_seq_lens_k": torch.tensor([0, 3000, 5000], dtype=torch.int32),
      "max_length_q": 3000, "max_length_k": 3000}, "cu_seq_lens_q != cu_seq_lens_k"),
    ({"cu_seq_lens_q": torch.tensor([0, 5000], dtype=torch.int32), "max_length_q": 5000},
     "cu_seq_lens_k, max_length_k are missing"),
    ({"cu_seq_lens_q": torch.tensor([0, 5000], dtype=torch.int32),
      "cu_seq_lens_k": torch.tensor([0, 5000], dtype=torch.int32), "max_length_q": 30000,
      "max_length_k": 30000}, "no bucket of libfa_tune_fwd.so serves varlen Hq=32 Hkv=8 "
                              "max_seqlen=30000"),
    ({"attention_mask": torch.ones(1, 5000, dtype=torch.bool),
      "cu_seq_lens_q": torch.tensor([0, 5000], dtype=torch.int32),
      "cu_seq_lens_k": torch.tensor([0, 5000], dtype=torch.int32), "max_length_q": 5000,
      "max_length_k": 5000}, "got an attention mask"),
])
def test_hf_backend_refuses_bad_packing(stub_lib: Path, kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError) as e:
        _packed_call(**kwargs)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_hf_backend_packed_rows_must_be_bshd(stub_lib: Path) -> None:
    cu = torch.tensor([0, 3000, 5000], dtype=torch.int32)
    bhsd = torch.empty(1, 32, 5000, 128, dtype=BF16, device="meta")  # not a view of BSHD
    with pytest.raises(ValueError, match="query .* is not a view of BSHD memory"):
        ops.hf_attention_forward(_Module(), bhsd, _bhsd(1, 5000, 8), _bhsd(1, 5000, 8), None,
                                 cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=3000,
                                 max_length_k=3000)


def _mask_args(model, position_ids: torch.Tensor, **extra) -> dict:
    from transformers.masking_utils import create_causal_mask

    params = inspect.signature(create_causal_mask).parameters
    B, S = position_ids.shape
    emb = torch.zeros(B, S, 256)
    base = {"config": model.config, "position_ids": position_ids,
            "cache_position": torch.arange(S), "past_key_values": None, "cache": None,
            "inputs_embeds": emb, "input_embeds": emb, "attention_mask": None, **extra}
    return {k: v for k, v in base.items() if k in params}


def test_hf_mask_gives_packed_sequences(stub_lib: Path) -> None:
    """transformers finds packing in position_ids that restart; the backend's mask function
    hands that on as PackedSequences (cu_seqlens once per forward), not a [B, 1, S, S] mask;
    with anything more than the packing (an overlay) it gives sdpa's mask, which is refused."""
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    from transformers import LlamaConfig
    from transformers.masking_utils import create_causal_mask

    from tuner.fa_tune_ops.hf import PackedSequences

    ops.register_hf()
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=128, intermediate_size=256, vocab_size=64, num_hidden_layers=1)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(cfg)
    model.set_attn_implementation("fa_tune")
    pos = torch.cat([torch.arange(5), torch.arange(3), torch.arange(8)])[None]  # 5 + 3 + 8
    m = create_causal_mask(**_mask_args(model, pos))
    assert isinstance(m, PackedSequences)
    cu, max_seqlen = m.varlen()
    assert cu.tolist() == [0, 5, 8, 16] and cu.dtype == torch.int32 and max_seqlen == 8
    assert m.varlen()[0] is cu  # computed once, reused by every layer
    # Two rows, each packed: the sequences of both, over the 2 * 16 flattened tokens.
    pos2 = torch.cat([pos, torch.cat([torch.arange(10), torch.arange(6)])[None]])
    m2 = create_causal_mask(**_mask_args(model, pos2))
    assert m2.varlen()[0].tolist() == [0, 5, 8, 16, 26, 32] and m2.varlen()[1] == 10
    # Not packed: no mask at all (the fixed-length path), as before.
    assert create_causal_mask(**_mask_args(model, torch.arange(16)[None])) is None
    # Packing and a model's own overlay: sdpa's mask, refused by the backend.
    m3 = create_causal_mask(**_mask_args(model, pos, and_mask_function=lambda b, h, q, kv: kv >= 0))
    assert isinstance(m3, torch.Tensor) and m3.shape == (1, 1, 16, 16)
    with pytest.raises(ValueError, match="got an attention mask"):
        ops.hf_attention_forward(_Module(), _bhsd(1, 16, 32), _bhsd(1, 16, 8), _bhsd(1, 16, 8),
                                 m3)


def test_hf_backend_runs_packed_sequences_as_varlen(stub_lib: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.fa_tune_ops.hf import PackedSequences

    calls = []
    real = torch.ops.fa_tune.attention
    monkeypatch.setattr(torch.ops.fa_tune, "attention",
                        lambda *a: calls.append(a) or real(*a))
    ids = torch.tensor([[0] * 3000 + [1] * 2000])
    out, _ = _packed_call(attention_mask=PackedSequences(ids))
    assert out.shape == (1, 5000, 32, 128)
    (q, _, _, _, _, cu, max_seqlen), = calls
    assert q.shape == (5000, 32, 128) and max_seqlen == 3000
    assert cu.device == q.device and cu.dtype == torch.int32
    # The FlashAttention kwargs, when given too, describe the batch themselves.
    cu_kw = torch.tensor([0, 1000, 5000], dtype=torch.int32)
    _packed_call(attention_mask=PackedSequences(ids), cu_seq_lens_q=cu_kw, cu_seq_lens_k=cu_kw,
                 max_length_q=4000, max_length_k=4000)
    assert calls[-1][6] == 4000



# ---- the C++ launch path (native.py) -------------------------------------------------------------
_NATIVE_PROBE = """
import os, torch, tuner.fa_tune_ops as ops
from tuner.fa_tune_ops import native
print('at import:', native.status())
ops.load(os.environ.get('PROBE_LIB'))
print('after load:', native.status())
dump = torch._C._dispatch_dump('fa_tune::attention')
print('CUDA kernel:', [ln for ln in dump.splitlines() if ln.startswith('CUDA')])
q = torch.empty(1, 1024, 32, 128, dtype=torch.bfloat16, device='meta')
k = torch.empty(1, 1024, 8, 128, dtype=torch.bfloat16, device='meta')
out, lse = torch.ops.fa_tune.attention(q, k, k, True, None)
print('meta:', tuple(out.shape), tuple(lse.shape))
try:
    c = torch.empty(1, 1024, 8, 128, dtype=torch.bfloat16)
    torch.ops.fa_tune.attention(torch.empty(1, 1024, 32, 128), c, c, True, None)
except ValueError as e:
    print('refused:', e)
"""


@pytest.mark.skipif(__import__("shutil").which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("when", ["import", "load", "off"])
def test_native_launch_path_builds_loads_and_binds(stub_lib: Path, tmp_path: Path,
                                                   when: str) -> None:
    """The extension compiles against this torch and becomes the op's CUDA kernel when found
    beside the library: the default one at import, or one given to load() later (it replaces
    the Python kernel); FA_TUNE_OPS_NATIVE=0 keeps the Python one. It binds on load and leaves
    the fake implementation and the errors as they were."""
    import os
    import shutil

    from tuner.fa_tune_ops import native

    lib = tmp_path / "lib" / stub_lib.name
    lib.parent.mkdir()
    shutil.copy2(stub_lib, lib)
    ext = native.build(lib.parent)
    assert ext.name == native.ext_name() and ext.is_file()
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


def test_native_build_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.fa_tune_ops import native

    monkeypatch.setenv("CXX", "false")
    with pytest.raises(native.NativeBuildError, match="^false failed"):
        native.build(tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-written
