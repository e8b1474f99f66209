"""Peer: fa-tune's own Triton flash-attention forward (see ``_triton_kernel.py``).

It stands for "what a good hand-written Triton kernel gets": FA2-style, causal, BF16, D=128,
autotuned over BLOCK_M, BLOCK_N, num_warps and num_stages (20 configs). It runs MHA, D 128,
causal, S_q = S_k only (its diagonal loop assumes as many keys as queries), none of the models'
masks (window, softcap, sinks): ``supports`` says so for every other problem, and ``prepare``
refuses them (``Unsupported``). Autotuning runs inside ``prepare`` (Triton times every config
once per (S, H) key), never in the timed region.
"""

from __future__ import annotations

import math
from typing import Any

from tuner.measure.peers.base import (
    Peer,
    PeerMasks,
    PeerPages,
    Unsupported,
    dist_version,
    module_missing,
    problem_reason,
    torch_cuda_reason,
)

HEAD_DIM = 128
LOG2E = 1.4426950408889634


class TritonPeer(Peer):
    name = "triton"
    label = "Triton FA2-style kernel (fa-tune's own, autotuned over 20 configs)"

    def __init__(self, write_lse: bool = True) -> None:
        self.write_lse = write_lse
        self._kernel: Any = None
        self._args: tuple[Any, ...] | None = None
        self._bh = 0
        self._S = 0
        self._out: Any = None
        self._lse: Any = None

    def available(self) -> tuple[bool, str]:
        reason = torch_cuda_reason() or module_missing("triton")
        if reason:
            return False, reason
        try:
            self._load()
        except Exception as exc:  # a Triton that cannot build the kernel is a reason, not a crash
            return False, f"Triton kernel does not load ({type(exc).__name__}: {exc})"
        return True, "ok"

    def _load(self) -> Any:
        if self._kernel is None:
            from tuner.measure.peers._triton_kernel import attn_fwd_kernel

            self._kernel = attn_fwd_kernel
        return self._kernel

    def version(self) -> str:
        return f"triton {dist_version('triton')}"

    def supports(self, problem: Any) -> str | None:
        return problem_reason(problem, gqa=False, head_dims=(HEAD_DIM,), causal_only=True,
                              kv_len="equal", who=self.name)

    def prepare(self, q: Any, k: Any, v: Any, causal: bool,
                varlen: tuple[Any, Any, int, int] | None = None,
                masks: PeerMasks | None = None, pages: PeerPages | None = None) -> None:
        B, S, H, D = q.shape
        if pages is not None:  # supports() declines a paged cache: never read pages as tensors
            raise Unsupported(f"{self.name} reads no paged KV cache")
        if masks is not None and masks.any:  # supports() declines them: never compute another
            raise Unsupported(f"{self.name} runs no sliding window, softcap or sinks")
        if D != HEAD_DIM or tuple(k.shape) != tuple(q.shape) or not causal:
            raise Unsupported(
                f"{self.name} runs MHA, D {HEAD_DIM}, causal, S_q = S_k only: got q "
                f"{tuple(q.shape)}, "
                f"k/v {tuple(k.shape)}, causal={bool(causal)}"
            )
        import torch

        self._load()
        for t in (q, k, v):
            if t.stride(-1) != 1:
                raise ValueError("the last (head) dimension must be contiguous")
        self._out = torch.empty_like(q)
        self._lse = torch.empty((B, H, S), device=q.device, dtype=torch.float32)
        qk_scale = LOG2E / math.sqrt(D)
        o, lse = self._out, self._lse
        self._args = (
            q,
            k,
            v,
            o,
            lse,
            qk_scale,
            S,
            H,
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            v.stride(0),
            v.stride(1),
            v.stride(2),
            o.stride(0),
            o.stride(1),
            o.stride(2),
            lse.stride(0),
            lse.stride(1),
        )
        self._bh = B * H
        self._S = S
        self.run()  # autotune now (benchmarks every config once for this key)

    def run(self) -> Any:
        assert self._args is not None, "prepare() first"
        bh, s = self._bh, self._S
        # The grid depends on the autotuned BLOCK_M, so it is a function of the chosen config.
        self._kernel[lambda meta: (triton_cdiv(s, meta["BLOCK_M"]), bh)](
            *self._args, HEAD_DIM=HEAD_DIM, WRITE_LSE=self.write_lse
        )
        return self._out

    def lse(self) -> Any | None:
        return self._lse if self.write_lse else None

    def details(self) -> dict[str, Any]:
        best = getattr(self._kernel, "best_config", None)
        if best is None:
            return {"autotune": "not run"}
        return {
            "best_config": {
                **dict(best.kwargs),
                "num_warps": best.num_warps,
                "num_stages": best.num_stages,
            },
            "configs_tried": len(getattr(self._kernel, "configs", [])),
        }

    def release(self) -> None:
        self._args = None
        self._out = None
        self._lse = None


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
