"""cuDNN attention and FlashAttention-2 through PyTorch's SDPA backends.

``scaled_dot_product_attention`` wants [B, H, S, D]; our inputs are BSHD. We pass
``q.transpose(1, 2)`` views (no copy): SDPA accepts strided inputs whose last dimension is
contiguous, and both backends read BSHD-strided tensors natively (cuDNN takes arbitrary strides,
FA2 is a BSHD kernel underneath), so no transpose kernel runs inside the timed region. The output
comes back as a [B, H, S, D] tensor; we return its ``transpose(1, 2)`` view, which is [B, S, H, D]
again, for the gate. If a backend ever copied its inputs to a contiguous BHSD layout, that copy
would be timed too -- deliberately: it is what a BSHD user of the backend pays. The same holds
for a problem's strided layouts (``:qkv``: slices of one fused QKV tensor; ``:bhsd``: k and v over
[B, Hkv, S_k, D] memory, whose transpose is then the dense [B, H, S, D] tensor SDPA's callers
hold): the backends get those very views; one that cannot take them raises at ``prepare``.

``sdpa_kernel([backend])`` allows exactly one backend, so a backend that cannot take the inputs
raises instead of silently falling back to another (a peer is never replaced by another); that
error at ``prepare`` is reported as ``Unsupported`` (the row says "unavailable" and why).

The problem family: ``is_causal`` follows the problem's mask where S_q = S_k (top-left and
bottom-right alignment agree there). SDPA aligns ``is_causal`` TOP-left when S_q != S_k, while
the problem's causal mask is bottom-right (FlashAttention's: query i sees keys 0 .. i + S_k -
S_q), so a causal problem with S_q < S_k gets an explicit boolean mask instead, built once in
``prepare``: the cuDNN and memory-efficient backends take one (or refuse it at ``prepare``:
Unsupported); the FA2 backend takes no mask and refuses ``is_causal`` on non-square problems, so
it declines them up front. GQA/MQA (k, v with Hkv < Hq heads) passes ``enable_gqa=True``
(torch >= 2.5), which the FA2 and cuDNN backends take without copying K/V; the memory-efficient
backend rejects unequal head counts, so it reports GQA as unsupported up front.

The models' masks: a sliding window is a boolean mask too (the keys max(0, a - W + 1) .. a, or
.. S_k - 1 non-causal, a = i + S_k - S_q), built once in ``prepare`` for the backends that take
one (cuDNN, memory-efficient; FA2's backend declines it up front). A softcap is not expressible
through SDPA (no score modifier), and neither are attention sinks exactly: an extra key column
with the sink as an additive mask would hold the sink in the inputs' BF16 (an error of up to
2^-9 |sink| in its exponent) and LSE comes back without it; both are declined up front.
"""

from __future__ import annotations

from typing import Any

from tuner.measure.peers.base import (
    Peer,
    PeerMasks,
    PeerPages,
    Unsupported,
    problem_reason,
    torch_cuda_reason,
)

# name -> (SDPBackend member, label)
SDPA_BACKENDS: dict[str, tuple[str, str]] = {
    "cudnn": ("CUDNN_ATTENTION", "cuDNN SDPA (torch backend CUDNN_ATTENTION)"),
    "fa2": ("FLASH_ATTENTION", "FlashAttention-2 (torch backend FLASH_ATTENTION)"),
    "mem_efficient": ("EFFICIENT_ATTENTION", "torch memory-efficient backend"),
}


class SdpaPeer(Peer):
    def __init__(self, name: str) -> None:
        if name not in SDPA_BACKENDS:
            raise ValueError(f"unknown SDPA backend {name!r}; choose from {sorted(SDPA_BACKENDS)}")
        self.name = name
        self.backend_member, self.label = SDPA_BACKENDS[name]
        self._views: tuple[Any, Any, Any] | None = None
        self._causal = True
        self._gqa = False
        self._mask: Any = None  # the boolean mask [S_q, S_k] (bottom-right causal, window)
        self._window = 0

    def available(self) -> tuple[bool, str]:
        reason = torch_cuda_reason()
        if reason:
            return False, reason
        from torch.nn.attention import SDPBackend

        if not hasattr(SDPBackend, self.backend_member):
            return False, f"this torch has no SDPBackend.{self.backend_member}"
        if self.name == "cudnn":
            import torch

            if not torch.backends.cudnn.is_available():
                return False, "torch reports cuDNN unavailable"
        return True, "ok"

    def version(self) -> str:
        import torch

        parts = [f"torch {torch.__version__}", f"CUDA {torch.version.cuda}"]
        if self.name == "cudnn":
            parts.append(f"cuDNN {torch.backends.cudnn.version()}")
        return ", ".join(parts)

    def supports(self, problem: Any) -> str | None:
        # The memory-efficient backend needs equal head counts; FA2 takes no mask (and refuses
        # a non-square is_causal); the others are asked at prepare. A window is a mask.
        fa2 = self.name == "fa2"
        return problem_reason(problem, gqa=self.name != "mem_efficient",
                              kv_len="noncausal" if fa2 else "any",
                              masks=() if fa2 else ("window",), who=self.name)

    def prepare(self, q: Any, k: Any, v: Any, causal: bool,
                varlen: tuple[Any, Any, int, int] | None = None,
                masks: PeerMasks | None = None, pages: PeerPages | None = None) -> None:
        import torch

        if pages is not None:  # supports() declines a paged cache: never read pages as tensors
            raise Unsupported(f"{self.name} reads no paged KV cache")
        m = masks or PeerMasks()
        if m.softcap > 0 or m.sinks is not None:  # supports() declines them: never approximate
            raise Unsupported(f"{self.name} cannot express a softcap or attention sinks exactly")
        self._views = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        self._causal = bool(causal)
        self._gqa = k.shape[2] != q.shape[2]
        self._window = int(m.window)
        sq, sk = q.shape[1], k.shape[1]
        self._mask = None
        # is_causal would be top-left where S_q != S_k; a window is no is_causal at all: give
        # the mask itself (key j of row i, diagonal key a = i + S_k - S_q: j <= a causal,
        # j > a - W with a window).
        if self._window > 0 or (self._causal and sq != sk):
            keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
            if self._causal:
                keep = keep.tril(sk - sq)
            if self._window > 0:
                keep = keep.triu(sk - sq - self._window + 1)
            self._mask = keep
        try:
            self.run()  # surfaces "backend cannot run these inputs" before timing
        except RuntimeError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            self._views = None
            raise Unsupported(
                f"{self.name} (SDPBackend.{self.backend_member}) cannot run q "
                f"{tuple(q.shape)}, k/v {tuple(k.shape)}, causal={self._causal}: {first}"
            ) from None

    def run(self) -> Any:
        import torch.nn.functional as F

        assert self._views is not None, "prepare() first"
        q, k, v = self._views
        kw = {"enable_gqa": True} if self._gqa else {}
        # sdpa_kernel is a one-shot context manager over a global flag: cheap to enter per call
        # (host side only), and it keeps the backend choice from leaking into the other peers.
        if self._mask is not None:
            kw["attn_mask"] = self._mask
        with self._ctx_manager():
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=self._causal and self._mask is None, **kw)
        return out.transpose(1, 2)

    def _ctx_manager(self) -> Any:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, self.backend_member)])

    def details(self) -> dict[str, Any]:
        return {
            "backend": f"SDPBackend.{self.backend_member}",
            "inputs": "BSHD tensors passed as q.transpose(1, 2) views (no copy)",
            "is_causal": self._causal and self._mask is None,
            "attn_mask": None if self._mask is None else (
                ("bottom-right causal" if self._causal else "no causal")
                + (f", window {self._window}" if self._window else "")
                + f", bool {list(self._mask.shape)}"),
            "enable_gqa": self._gqa,
        }

    def release(self) -> None:
        self._views = None
        self._mask = None
