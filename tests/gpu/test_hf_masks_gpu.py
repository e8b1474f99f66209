"""On the GPU: the models whose attention has the models' masks (issue 36), through
attn_implementation="fa_tune" in transformers, prefill and generate(): Mistral (a sliding window
on every layer), Gemma-2 (softcap 50, head dim 256, local windowed layers and global ones) and
gpt-oss (sinks, head dim 64, windowed and full layers), each with random weights, 2 layers (one
of each kind) and the model's attention shapes, from a workload library exported for it (one
bucket per kind of layer, the window a routing key).

Every prefill layer runs the kernel (fa_tune_ops.stats()), the decode steps the stated
fallback, and each generated step's logits are as close to the FP32 model's as the BF16 eager
model's are (eager is the one implementation in transformers that has all three masks).

Needs torch with CUDA and transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from op_exports import export_and_load

pytestmark = pytest.mark.gpu
from op_exports import cuda_torch  # noqa: E402

torch = cuda_torch()
transformers = pytest.importorskip("transformers", reason="pip install transformers")
ops = pytest.importorskip("tuner.ship.fa_tune_ops")

BF16 = torch.bfloat16
PROMPT, NEW = 2048, 8
ONE = [{"name": "all", "max_s": None}]
TRAFFIC = {"shapes": [{"B": 1, "S": PROMPT}]}
KINDS = ["sliding_attention", "full_attention"]

# name: (workload, bucket source, model class, config kwargs)
MODELS: dict[str, tuple[dict[str, Any], str | dict, str, dict[str, Any]]] = {
    "mistral": (
        {"attention": {"Hq": 32, "Hkv": 8, "head_dim": 128, "causal": True, "window": 512}},
        "preset:default", "MistralForCausalLM",
        {"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
         "sliding_window": 512}),
    "gemma2": (
        {"attention": {"Hq": 16, "Hkv": 8, "head_dim": 256, "causal": True, "softcap": 50},
         "layers": [{"name": "local", "window": 512, "count": 1}, {"name": "global", "count": 1}]},
        # d256 at 128 x 80 spills with a window (docs/PERF.md steps 50, 61): its default there.
        "preset:d256-window", "Gemma2ForCausalLM",
        {"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
         "sliding_window": 512, "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 256,
         "layer_types": KINDS}),
    "gpt_oss": (
        {"attention": {"Hq": 64, "Hkv": 8, "head_dim": 64, "causal": True, "sinks": True},
         "layers": [{"name": "window", "window": 128, "count": 1}, {"name": "full", "count": 1}]},
        "preset:d64", "GptOssForCausalLM",
        {"num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
         "sliding_window": 128, "layer_types": KINDS, "num_local_experts": 4,
         "num_experts_per_tok": 2}),
}


def _source(tmp: Path, src: str | dict) -> str:
    if isinstance(src, str):
        return src
    from tuner.kernel.config import load_preset

    cfg = load_preset(src["preset"]).to_dict()
    cfg.update({k: v for k, v in src.items() if k != "preset"})
    path = tmp / "bucket.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    name = request.param
    workload, src, cls_name, kw = MODELS[name]
    tmp = tmp_path_factory.mktemp(name)
    wl = {"name": f"{name}-test", "buckets": ONE, "traffic": TRAFFIC, **workload}
    kinds = [k["name"] for k in workload.get("layers", [])] or [""]
    buckets = {(f"{k}-all" if k else "all"): _source(tmp, src) for k in kinds}
    export_and_load(ops, tmp, wl, buckets)
    ops.register_hf()
    cls = getattr(transformers, cls_name)
    cfg = cls.config_class(hidden_size=1024, intermediate_size=2048, vocab_size=32000,
                           num_hidden_layers=2, max_position_embeddings=PROMPT + NEW,
                           bos_token_id=1, eos_token_id=None, pad_token_id=0, **kw)
    torch.manual_seed(0)
    m = cls(cfg).to(device="cuda", dtype=BF16).eval()
    m.generation_config.eos_token_id = None
    return name, m


def _generate(m, ids, impl: str):
    m.set_attn_implementation(impl)
    with torch.inference_mode():
        return m.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                          output_logits=True, return_dict_in_generate=True)


def _fp32_logits(m, seq):
    """The FP32 eager model's logits for the last NEW positions' next tokens (no cache)."""
    m.float()
    m.set_attn_implementation("eager")
    try:
        with torch.inference_mode():
            return m(seq[:, :-1], use_cache=False, logits_to_keep=NEW).logits[0].float()
    finally:
        m.to(dtype=BF16)


def test_generate_runs_the_kernel_as_close_to_fp32_as_eager(model) -> None:
    name, m = model
    g = torch.Generator(device="cuda").manual_seed(3)
    ids = torch.randint(2, 32000, (1, PROMPT), device="cuda", generator=g)
    errs = {}
    for impl in ("eager", "fa_tune"):
        ops.reset_stats()
        r = _generate(m, ids, impl)
        if impl == "fa_tune":
            stats = ops.stats()
        steps = torch.stack([lg[0] for lg in r.logits]).float()
        ref = _fp32_logits(m, r.sequences)
        errs[impl] = (steps - ref).abs().mean(-1) / ref.abs().mean(-1)
    print(f"{name}: stats {stats}; per-step error vs FP32: fa_tune "
          + " ".join(f"{x:.2e}" for x in errs["fa_tune"].tolist()) + "; eager "
          + " ".join(f"{x:.2e}" for x in errs["eager"].tolist()))
    assert stats.get("fa_tune") == 2, stats  # both layers' prefill through the kernel
    assert sum(stats.values()) == 2 * NEW, stats
    tol = 1.25 * torch.clamp(errs["eager"], min=errs["eager"].median().item()) + 1e-3
    bad = (errs["fa_tune"] > tol).nonzero().flatten().tolist()
    assert not bad, f"{name} steps {bad}: {errs['fa_tune'][bad].tolist()}"
