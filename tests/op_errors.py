"""How the op's CPU test files read a refusal (imported by name: tests/ is on sys.path): one
ValueError of one line, with the op's prefix."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def one_error(call: Callable[[], Any]) -> str:
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert msg.startswith("fa_tune::attention: ") and "\n" not in msg, msg
    return msg
