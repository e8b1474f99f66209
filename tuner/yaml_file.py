"""A user's YAML file (config, search space, workload) read into Python data, or one line why not.

One reader for every such file, so each says the same things the same way: unreadable, not
UTF-8, not YAML (with the line), or a key given twice in one mapping. PyYAML keeps the last of
two equal keys without a word, so ``block_m: 128`` then ``block_m: 64`` ran 64 and failed on a
knob the user never wrote; such a file is refused instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tuner.errors import FaTuneError


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with a key given twice."""


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the base constructor says so
            break
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"key '{key}' is given twice (lines {first + 1} and "
                f"{key_node.start_mark.line + 1}); keep one", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def parse_yaml(text: str, source: str, error: type[FaTuneError]) -> Any:
    """``text`` (from ``source``) as Python data; ``error`` with one line if it is not YAML."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise error(f"{source}: cannot parse YAML:{line} {problem}") from None


def load_yaml(path: str | Path, what: str, error: type[FaTuneError]) -> Any:
    """The YAML file ``path`` (a ``what``: "config file", "search space", ...) as Python data."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {p} is not UTF-8 text (byte {e.start}: 0x{e.object[e.start]:02x}); "
                    "save it as UTF-8") from None
    except OSError as e:
        raise error(f"cannot read {what} {p}: {e.strerror or e}") from None
    return parse_yaml(text, str(p), error)
