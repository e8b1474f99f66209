#!/usr/bin/env python3
"""A Llama-3-8B-shaped prefill with attn_implementation="fa_tune" and "sdpa", in one process.

The model is built from LlamaConfig with random weights (nothing is downloaded): hidden 4096, 32
query heads, 8 K/V heads, head dim 128, MLP 14336, vocab 128256, RoPE theta 500000 (Llama-3-8B's
sizes), with the layers cut to --layers (default 4). The same weights and token ids run a
prefill of --seq tokens (default 8192, batch 1) through both backends; the logits are compared
(BF16 tolerance: each BF16 run's mean |difference| / mean |logit| against the same model in
FP32 with sdpa; fa_tune's at most 1.25x sdpa's + 1e-3; top-1 agreement is reported) and each
backend's prefill is timed with CUDA events, alternating the backends so drift hits both alike.
With --packed LENGTHS the same is done for a packed varlen batch as well: one row of all the
sequences' tokens, position_ids restarting at 0 for each, which transformers turns into
per-sequence causal attention (fa_tune: its varlen kernel; sdpa: a block-diagonal mask).

Needs an sm_90 GPU, torch with CUDA, transformers, and a workload export whose library serves
the model's heads (Hq 32, Hkv 8) at --seq, e.g.:

    fa-tune export --workload llama3-8b --default preset:multicast --out /tmp/l8b
    python scripts/llama_prefill.py --export /tmp/l8b --packed 4096,2048,1024*2

Exit 0 when the logits agree, 1 when they do not, 2 for a usage error (one line).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def fail(msg: str) -> None:
    sys.stderr.write(f"llama_prefill: error: {msg}\n")
    raise SystemExit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export", required=True, type=Path,
                    help="A workload export folder (holds fa_tune_ops/ and lib/).")
    ap.add_argument("--seq", type=int, default=8192, help="Prefill tokens (default 8192).")
    ap.add_argument("--batch", type=int, default=1, help="Batch size (default 1).")
    ap.add_argument("--layers", type=int, default=4, help="Decoder layers (default 4).")
    ap.add_argument("--warmup", type=int, default=2, help="Untimed prefills per backend.")
    ap.add_argument("--iters", type=int, default=5, help="Timed prefills per backend.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--packed", default=None,
                    help="Also a packed varlen batch of these lengths, e.g. 4096,2048,1024*2.")
    ap.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    ap.add_argument("--generate", action="store_true",
                    help="Also time to first token: a 1-token generate() per backend (default "
                         "DynamicCache), fa_tune with use_cache=False too, and model() with and "
                         "without the cache; backends alternated.")
    ap.add_argument("--profile", type=Path, default=None,
                    help="With --generate: write each backend's CUDA kernel totals of one "
                         "1-token generate() (torch.profiler) into this folder.")
    a = ap.parse_args(argv)
    a.lengths = None
    if a.packed:
        from tuner.errors import ShapeError
        from tuner.problem import Problem  # the one parser of length lists

        try:
            a.lengths = list(Problem.parse(f"32/8x[{a.packed}]").seqlens)
        except ShapeError as e:
            fail(f"--packed: {e}")
    for name in ("seq", "batch", "layers", "iters"):
        if getattr(a, name) < 1:
            fail(f"--{name} must be at least 1")
    if not (a.export / "fa_tune_ops" / "__init__.py").is_file():
        fail(f"{a.export} is not a workload export (no fa_tune_ops/); make one with "
             "`fa-tune export --workload llama3-8b ... --out DIR`")
    return a


def build_model(layers: int, seed: int, max_positions: int = 8192) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, intermediate_size=14336, vocab_size=128256,
                      num_hidden_layers=layers, max_position_embeddings=max_positions,
                      rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                          "rope_theta": 500000.0})
    torch.manual_seed(seed)
    # Built on the GPU in BF16 directly: a CPU FP32 init of ~2 B parameters takes minutes.
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    model.generation_config.eos_token_id = None  # every generate() makes exactly the tokens asked
    return model.eval()


def prefill_ms(model: Any, ids: Any, pos: Any) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.inference_mode():
        start.record()
        model(ids, position_ids=pos, use_cache=False, logits_to_keep=1)
        end.record()
    end.synchronize()
    return start.elapsed_time(end)


def run_case(model: Any, ids: Any, pos: Any, a: argparse.Namespace) -> dict[str, Any]:
    """Logits of both backends against the FP32 model, and each backend's prefill timed."""
    import torch

    backends = ("sdpa", "fa_tune")
    # Correctness: full logits of one prefill per backend.
    logits = {}
    for impl in backends:
        model.set_attn_implementation(impl)
        with torch.inference_mode():
            logits[impl] = model(ids, position_ids=pos, use_cache=False).logits.float()
    ours, ref = logits["fa_tune"], logits["sdpa"]
    rel = ((ours - ref).abs().mean() / ref.abs().mean()).item()
    max_abs = (ours - ref).abs().max().item()
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()

    # Timing: the last position's logits only (the prefill a server runs), backends alternated.
    times: dict[str, list[float]] = {b: [] for b in backends}
    for i in range(a.warmup + a.iters):
        for impl in (backends if i % 2 == 0 else backends[::-1]):
            model.set_attn_implementation(impl)
            ms = prefill_ms(model, ids, pos)
            if i >= a.warmup:
                times[impl].append(ms)
    med = {b: statistics.median(v) for b, v in times.items()}

    # "Within BF16 tolerance" judged against the same model in FP32 (sdpa): fa_tune's BF16 logits
    # must be about as close to it as sdpa's BF16 logits are. Random weights make the logits
    # near-uniform, so top-1 flips between two BF16 runs say little (it is reported, not judged).
    model.float()
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        ref32 = model(ids, position_ids=pos, use_cache=False).logits.float()
    model.to(dtype=torch.bfloat16)
    scale = ref32.abs().mean()
    err = {b: ((logits[b] - ref32).abs().mean() / scale).item() for b in backends}
    del logits, ours, ref, ref32
    torch.cuda.empty_cache()
    ok = err["fa_tune"] <= 1.25 * err["sdpa"] + 1e-3
    return {
        "logits": {"mean_rel_diff": rel, "max_abs_diff": max_abs, "top1_agreement": agree,
                   "rel_err_vs_fp32": err, "ok": ok},
        "prefill_ms": {b: {"median": med[b], "all": times[b]} for b in backends},
        "speedup_vs_sdpa": med["sdpa"] / med["fa_tune"],
    }


def _wall_ms(fn: Any) -> float:
    import time

    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _generate_1(model: Any, ids: Any, use_cache: bool) -> None:
    import torch

    with torch.inference_mode():
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False,
                       use_cache=use_cache)


def _forward(model: Any, ids: Any, use_cache: bool) -> None:
    import torch

    with torch.inference_mode():
        model(ids, use_cache=use_cache, logits_to_keep=1)


def time_to_first_token(model: Any, ids: Any, a: argparse.Namespace) -> dict[str, Any]:
    """Wall times (ms, synchronised) of a 1-token generate() per backend with the default cache,
    fa_tune's with use_cache=False, and the bare forward with and without the cache; every case
    once per round, the order reversed every other round (clock drift hits all alike)."""
    cases = {
        "generate sdpa": ("sdpa", lambda: _generate_1(model, ids, True)),
        "generate fa_tune": ("fa_tune", lambda: _generate_1(model, ids, True)),
        "generate sdpa use_cache=False": ("sdpa", lambda: _generate_1(model, ids, False)),
        "generate fa_tune use_cache=False": ("fa_tune", lambda: _generate_1(model, ids, False)),
        "model() sdpa cache": ("sdpa", lambda: _forward(model, ids, True)),
        "model() fa_tune cache": ("fa_tune", lambda: _forward(model, ids, True)),
        "model() sdpa no cache": ("sdpa", lambda: _forward(model, ids, False)),
        "model() fa_tune no cache": ("fa_tune", lambda: _forward(model, ids, False)),
    }
    times: dict[str, list[float]] = {c: [] for c in cases}
    order = list(cases)
    for i in range(a.warmup + a.iters):
        for name in (order if i % 2 == 0 else order[::-1]):
            impl, fn = cases[name]
            model.set_attn_implementation(impl)
            ms = _wall_ms(fn)
            if i >= a.warmup:
                times[name].append(ms)
    if a.profile:
        profile_kernels(model, ids, a.profile)
    return {c: {"median": statistics.median(v), "min": min(v), "max": max(v), "all": v}
            for c, v in times.items()}


def profile_kernels(model: Any, ids: Any, folder: Path) -> None:
    """Each backend's CUDA kernel totals over one 1-token generate() with and without the cache
    (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    folder.mkdir(parents=True, exist_ok=True)
    for impl in ("sdpa", "fa_tune"):
        for cache in (True, False):
            model.set_attn_implementation(impl)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                _generate_1(model, ids, cache)
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=60,
                                              max_name_column_width=90)
            (folder / f"{impl}{'' if cache else '_nocache'}.txt").write_text(table)


def report(title: str, r: dict[str, Any], iters: int) -> None:
    lg, err = r["logits"], r["logits"]["rel_err_vs_fp32"]
    print(title)
    print(f"  logits fa_tune vs sdpa: mean |diff| / mean |logit| = {lg['mean_rel_diff']:.2e}, "
          f"max |diff| = {lg['max_abs_diff']:.3f}, top-1 agreement "
          f"{100 * lg['top1_agreement']:.2f}%")
    print(f"  vs the FP32 model (sdpa): fa_tune {err['fa_tune']:.2e}, sdpa {err['sdpa']:.2e} "
          f"mean |diff| / mean |logit| -> {'OK' if lg['ok'] else 'FAIL'} "
          "(fa_tune <= 1.25 x sdpa + 1e-3)")
    for b, t in r["prefill_ms"].items():
        print(f"  prefill {b:8s}: median {t['median']:.2f} ms over {iters} "
              f"(min {min(t['all']):.2f}, max {max(t['all']):.2f})")
    print(f"  fa_tune / sdpa speedup: {r['speedup_vs_sdpa']:.3f}x")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        import torch
        import transformers
    except ImportError as e:
        fail(f"needs torch with CUDA and transformers: {e}")
    if not torch.cuda.is_available():
        fail("torch sees no CUDA GPU")
    sys.path.insert(0, str(a.export.resolve()))
    import fa_tune_ops

    lib = fa_tune_ops.library()
    if lib.bucket_for(32, 8, a.seq) == -1:
        fail(f"{lib.path} serves no bucket for B={a.batch} Hq=32 Hkv=8 S={a.seq}; it serves "
             f"{lib.serves_text()}")
    if a.lengths and lib.bucket_for(32, 8, max(a.lengths)) == -1:
        fail(f"{lib.path} serves no bucket for max_seqlen {max(a.lengths)}")
    fa_tune_ops.register_hf()
    model = build_model(a.layers, a.seed, a.seq + 64)
    g = torch.Generator(device="cuda").manual_seed(a.seed + 1)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq), device="cuda", generator=g)
    result: dict[str, Any] = {
        "model": f"Llama-3-8B-shaped, {a.layers} layers, random weights", "batch": a.batch,
        "seq": a.seq, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "transformers": transformers.__version__, "library": str(lib.path),
        **run_case(model, ids, None, a),
    }
    report(f"{result['model']}, B={a.batch}, S={a.seq}, {result['gpu']}", result, a.iters)
    ok = result["logits"]["ok"]
    if a.generate:
        ttft = time_to_first_token(model, ids, a)
        result["time_to_first_token_ms"] = ttft
        print(f"wall times, {a.iters} rounds after {a.warmup}, alternated:")
        for c, t in ttft.items():
            print(f"  {c:34s} median {t['median']:.2f} ms (min {t['min']:.2f}, max {t['max']:.2f})")
    if a.lengths:
        # One row of every sequence's tokens; position_ids restart per sequence (packing).
        pos = torch.cat([torch.arange(n, device="cuda") for n in a.lengths])[None]
        ids = torch.randint(0, model.config.vocab_size, (1, pos.shape[1]), device="cuda",
                            generator=g)
        packed = {"lengths": a.lengths, **run_case(model, ids, pos, a)}
        result["packed"] = packed
        report(f"packed varlen batch {a.packed} ({pos.shape[1]} tokens)", packed, a.iters)
        ok = ok and packed["logits"]["ok"]
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
