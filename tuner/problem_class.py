"""What a kernel library is compiled for (``ProblemClass``): head dim, mask, and which of the
models' masks and whether a paged KV cache its kernel carries. tuner.problem makes one from each
``Problem`` (``Problem.problem_class``); the build renders it into the kernel's Config and the
library reports it (``fa_tune_problem_class()``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.problem_text import DEFAULT_HEAD_DIM

if TYPE_CHECKING:
    from tuner.problem import Problem


@dataclass(frozen=True)
class ProblemClass:
    """What a kernel library is compiled for: head dim, mask, and which of the models' masks
    its kernel carries (Hq, Hkv, B, S, the window's width, the cap and the sinks' values are
    run-time arguments). Part of a built kernel's identity (its cache key) beside the config."""

    head_dim: int = DEFAULT_HEAD_DIM
    causal: bool = True
    # The library also holds the packed-sequence (varlen) kernel: a second instantiation of the
    # same pieces (~13 % more compile time); only exports and varlen problems ask for it.
    varlen: bool = False
    # Sliding windows: the KV range starts at the window's left edge and the tiles there are
    # masked. A window library also runs problems without one (the window then reaches key 0).
    window: bool = False
    # Logit softcap: a tanh per score, so only problems with a cap run on it.
    softcap: bool = False
    # Attention sinks: one more term in each row's denominator; a sinks library also runs
    # problems without (no sinks tensor: the term is 0).
    sinks: bool = False
    # A paged KV cache: the device-scheduled kernel reads K and V through a block table (its
    # producer looks each tile's page up), so a paged library's varlen kernel is paged only.
    paged: bool = False

    def __str__(self) -> str:
        extras = [name for name in ("varlen", "window", "softcap", "sinks", "paged")
                  if getattr(self, name)]
        return (f"D {self.head_dim}, {'causal' if self.causal else 'non-causal'}"
                + "".join(f", with {x}" for x in extras))

    def to_dict(self) -> dict:
        out: dict = {"head_dim": self.head_dim, "causal": self.causal}
        # Only those set: the stored classes of studies from before them stay as they were.
        for name in ("varlen", "window", "softcap", "sinks", "paged"):
            if getattr(self, name):
                out[name] = True
        return out

    @classmethod
    def from_dict(cls, d: dict) -> ProblemClass:
        return cls(int(d.get("head_dim", DEFAULT_HEAD_DIM)), bool(d.get("causal", True)),
                   bool(d.get("varlen", False)), bool(d.get("window", False)),
                   bool(d.get("softcap", False)), bool(d.get("sinks", False)),
                   bool(d.get("paged", False)))

    def serves(self, p: Problem, varlen: bool = True) -> str:
        """Why this class's library cannot run problem p ('' when it can); varlen=False leaves
        the varlen kernel out of the question (a workload's buckets each decide it)."""
        if p.D != self.head_dim:
            return f"it is built for head dim {self.head_dim}, the problem has D {p.D}"
        if p.causal != self.causal:
            return f"it is built for the {'causal' if self.causal else 'non-causal'} mask"
        missing = [name for name, need in (("varlen", varlen and p.device_scheduled),
                                           ("window", p.window > 0), ("sinks", p.sinks),
                                           ("paged", p.is_paged))
                   if need and not getattr(self, name)]
        if missing:
            return f"it is built without {' and '.join(missing)} (the problem needs them)"
        if self.paged and p.is_varlen and not p.is_paged:
            return ("its device-scheduled kernel reads a paged KV cache, the problem's K and V "
                    "are packed tensors")
        if (p.softcap > 0) != self.softcap:
            return ("it is built with softcapping, the problem has no cap" if self.softcap
                    else "it is built without softcapping, the problem has a cap")
        return ""


DEFAULT_CLASS = ProblemClass()
