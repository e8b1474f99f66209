"""On the GPU: transformers' generate() with attn_implementation="fa_tune" against "sdpa" in the
same process (issue 34). A Llama-3-8B-shaped model with random weights (hidden 4096, 32 query
and 8 K/V heads of 128, MLP 14336, vocabulary 128256, rope theta 500000) with 4 of its 32
layers, BF16; a workload export with Llama-3-8B's heads (short: S_q <= 2048, preset default;
long: the rest, preset multicast).

* A prompt of 8192 tokens, 32 generated greedily with the default DynamicCache: each step's
  logits are as close to the FP32 model's (on the same tokens) as sdpa's are; the prefill runs
  the fa-tune kernel (once per layer, counted in fa_tune_ops.stats()), the 31 decode steps the
  stated fallback (FA3 where it imports, else sdpa); time to first token is printed and lower
  than sdpa's, and no higher than the same generate() with use_cache=False.
* A prompt continuing a cached prefix (2048 queries over 6144 cached + 2048 keys) runs the
  kernel too, reading the cache in place, as close to FP32 as sdpa.

Needs torch with CUDA and transformers."""

from __future__ import annotations

import statistics
import time

import pytest
from op_exports import export_and_load

pytestmark = pytest.mark.gpu
from op_exports import cuda_torch  # noqa: E402

torch = cuda_torch()
transformers = pytest.importorskip("transformers", reason="pip install transformers")
ops = pytest.importorskip("tuner.ship.fa_tune_ops")

BF16 = torch.bfloat16
LAYERS = 4  # of Llama-3-8B's 32: the attention shapes are the model's, the run stays short
PROMPT, NEW = 8192, 32
TWO = {
    "name": "llama3-8b-two",
    "attention": {"Hq": 32, "Hkv": 8, "head_dim": 128, "causal": True},
    "buckets": [{"name": "short", "max_s": 2048}, {"name": "long", "max_s": None}],
    "traffic": {"shapes": [{"B": 1, "S": 2048, "Sk": 8192}, {"B": 1, "S": 8192}]},
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    export_and_load(ops, tmp_path_factory.mktemp("hfgen"), TWO,
                    {"short": "preset:default", "long": "preset:multicast"})
    ops.register_hf()
    cfg = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                                   vocab_size=128256, num_hidden_layers=LAYERS,
                                   rope_theta=500000.0, max_position_embeddings=PROMPT + NEW,
                                   bos_token_id=1, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=BF16).eval()
    m.generation_config.eos_token_id = None  # every run generates exactly NEW tokens
    return m


def _generate(model, ids: torch.Tensor, impl: str, new: int = NEW, use_cache: bool = True):
    model.set_attn_implementation(impl)
    with torch.inference_mode():
        return model.generate(ids, max_new_tokens=new, do_sample=False, output_logits=True,
                              return_dict_in_generate=True, min_new_tokens=new,
                              use_cache=use_cache)


def _fp32_step_logits(model, seq: torch.Tensor, steps: int) -> torch.Tensor:
    """The FP32 model's logits for the last ``steps`` positions' next tokens of ``seq`` (sdpa,
    no cache); the model is back in BF16 afterwards (its weights were BF16: exact)."""
    model.float()
    model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            logits = model(seq[:, :-1], use_cache=False, logits_to_keep=steps).logits
    finally:
        model.to(dtype=BF16)
    return logits[0].float()  # [steps, vocab]


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per row: mean |a - ref| / mean |ref|."""
    return (a.float() - ref).abs().mean(-1) / ref.abs().mean(-1)


def _tolerance(err_sdpa: torch.Tensor) -> torch.Tensor:
    """What fa-tune's error may be at each step: 1.25 x sdpa's at that step, or sdpa's median
    over the steps where that is larger (one step's error is noisy), + 1e-3."""
    return 1.25 * torch.clamp(err_sdpa, min=err_sdpa.median().item()) + 1e-3


def _ms(fns: dict, reps: int = 7) -> dict[str, float]:
    """Median wall time of each fn() in ms (synchronised). The fns take turns within each rep,
    so a slow spell of the host weighs on all alike (step 67: in turn, the cache read 3.4 %
    over use_cache=False once on an H100, 0.1 % under in the rerun)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def test_generate_matches_sdpa_and_prefills_faster(model) -> None:
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(2, model.config.vocab_size, (1, PROMPT), device="cuda", generator=g)
    runs = {}
    for impl in ("sdpa", "fa_tune"):
        _generate(model, ids, impl, new=2)  # warm-up: one-time setup, FA3's JIT, allocator
        ops.reset_stats()
        runs[impl] = _generate(model, ids, impl)
        if impl == "fa_tune":
            stats = ops.stats()
    # Where the calls went: the prefill through the kernel, each decode step to a fallback.
    decode = {k: n for k, n in stats.items() if k.startswith("fallback:") and "decode" in k}
    print(f"stats: {stats}")
    assert stats.get("fa_tune") == LAYERS, stats
    assert sum(decode.values()) == LAYERS * (NEW - 1) and len(decode) == 1, stats
    assert sum(stats.values()) == LAYERS * NEW, stats
    # Each step's logits against the FP32 model on the same tokens.
    err = {}
    for impl, r in runs.items():
        steps = torch.stack([lg[0] for lg in r.logits])  # [NEW, vocab]
        ref = _fp32_step_logits(model, r.sequences, NEW)
        err[impl] = _rel_err(steps, ref)
    print("per-step error vs FP32: fa_tune "
          + " ".join(f"{x:.2e}" for x in err["fa_tune"].tolist()) + "; sdpa "
          + " ".join(f"{x:.2e}" for x in err["sdpa"].tolist()))
    bad = (err["fa_tune"] > _tolerance(err["sdpa"])).nonzero().flatten().tolist()
    assert not bad, f"steps {bad}: fa_tune {err['fa_tune'][bad].tolist()}, sdpa " \
                    f"{err['sdpa'][bad].tolist()}"
    # Time to first token (a 1-token generate: the prefill and its sampling), and the same
    # generate() with use_cache=False through fa-tune (the only path that ran before issue 34).
    ttft = _ms({"sdpa": lambda: _generate(model, ids, "sdpa", new=1),
                "fa_tune": lambda: _generate(model, ids, "fa_tune", new=1),
                "no_cache": lambda: _generate(model, ids, "fa_tune", new=1, use_cache=False)})
    no_cache = ttft["no_cache"]
    print(f"time to first token, prompt {PROMPT}, {LAYERS} layers: fa_tune {ttft['fa_tune']:.2f} "
          f"ms, sdpa {ttft['sdpa']:.2f} ms; fa_tune with use_cache=False {no_cache:.2f} ms")
    # Wall time of a whole generate() step: at 4 layers the attention is a few ms of ~33, so
    # the two read as a tie on the H200 (2026-12-04: 33.43 against 33.48 ms; docs/PERF.md step
    # 45; at 32 layers fa_tune is 1.8 % lower, scripts/llama_prefill.py --generate, step 46).
    # Hold fa-tune to no slower than sdpa beyond that noise.
    assert ttft["fa_tune"] <= 1.02 * ttft["sdpa"]
    # The cache costs a copy of each layer's K and V (32 MB a layer here): within noise of none.
    assert ttft["fa_tune"] <= 1.02 * no_cache


def test_a_prompt_continuing_a_cached_prefix(model) -> None:
    """6144 tokens into a DynamicCache, then 2048 more in one call: the second call is 2048
    queries over 8192 keys (bottom-right causal), through the kernel, the cache read in place."""
    g = torch.Generator(device="cuda").manual_seed(2)
    ids = torch.randint(2, model.config.vocab_size, (1, 8192), device="cuda", generator=g)
    logits = {}
    for impl in ("sdpa", "fa_tune"):
        model.set_attn_implementation(impl)
        cache = transformers.DynamicCache(config=model.config)
        ops.reset_stats()
        with torch.inference_mode():
            model(ids[:, :6144], past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits[impl] = model(ids[:, 6144:], past_key_values=cache, use_cache=True,
                                 logits_to_keep=64).logits[0].float()
        if impl == "fa_tune":
            assert ops.stats() == {"fa_tune": 2 * LAYERS}
    model.float()
    model.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            ref = model(ids, use_cache=False, logits_to_keep=64).logits[0].float()
    finally:
        model.to(dtype=BF16)
    err = {k: _rel_err(v, ref) for k, v in logits.items()}
    print(f"continuation error vs FP32 (mean over 64 positions): fa_tune "
          f"{err['fa_tune'].mean():.2e}, sdpa {err['sdpa'].mean():.2e}")
    assert (err["fa_tune"] <= _tolerance(err["sdpa"])).all()
