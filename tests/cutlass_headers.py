"""Where the nvidia-cutlass wheel (a test dependency) keeps CuTe's headers: the operands test
checks the kernel's hand-written layouts against CuTe's. The kernel itself includes none."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def cutlass_include() -> Path | None:
    """The wheel's include folder (holds cute/ and cutlass/), found without importing it."""
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        inc = Path(loc) / "source" / "include"
        if (inc / "cute" / "tensor.hpp").is_file():
            return inc
    return None
