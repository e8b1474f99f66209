"""The exported PyTorch package (tuner/fa_tune_ops) without a GPU: op registration, the fake
implementation (FakeTensorMode, meta tensors, torch.compile tracing), one clear error for every
unsupported input, and the transformers backend's registration and refusals. The library is
the real generated dispatcher over stub buckets (tests/dispatch_stub.py). Skipped without torch
(an optional extra: pip install torch; transformers for the backend tests)."""

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
    (lambda: qkv(), {"cu_seqlens": torch.zeros(2, dtype=torch.int32, device="meta")},
     "varlen (cu_seqlens, max_seqlen) is not built yet"),
    (lambda: qkv(S=64, device="cpu"), {}, "must be CUDA tensors; got cpu"),
])
def test_unsupported_input_is_one_clear_error(stub_lib: Path, make, kwargs, needle) -> None:
    q, k, v = make()
    with pytest.raises(ValueError) as e:
        torch.ops.fa_tune.attention(q, k, v, **kwargs)
    msg = str(e.value)
    assert msg.startswith("fa_tune::attention: ") and needle in msg and "\n" not in msg


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
