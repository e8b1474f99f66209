"""The knob table's machinery: one definition per knob, everything else derived from it.

Each knob is declared once, as a field of ``KernelConfig`` (tuner/kernel/config.py) made by
``knob()``: its default, its values, its C++ type (enums) and one line saying what it does. From
those fields come ``KNOBS`` (``table``), the value checks, the members of the rendered
template's ``struct Config`` (``cpp_members``, the template's ``${config_members}``) and the knob
table of docs/ARCHITECTURE.md (``markdown_table``; ``scripts/knob_table.py --write`` puts it
there, tests/test_knobs.py fails when the committed one differs).

A new knob: one ``knob()`` field (at the end of its group; the dataclass order is the template's
member order and the docs' row order, the config id sorts its keys), with ``id_neutral=True``
and a default that compiles the kernel as before so every published config id stays; then its
use in cuda_src/ through ``Config::<name>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from tuner.errors import ConfigError

KNOB_METADATA = "knob"  # the dataclasses.field metadata key knob() writes
# A field's annotation per kind (the config module uses `from __future__ import annotations`,
# so annotations are strings).
_ANNOTATION = {"int": "int", "bool": "bool", "enum": "str"}


@dataclass(frozen=True)
class Knob:
    """One knob: its kind, allowed values, default, C++ type and what it does."""

    name: str
    kind: str  # "int" | "bool" | "enum"
    choices: tuple[Any, ...]
    default: Any
    cpp_type: str | None = None  # enums only: fa_tune::<cpp_type>::<CamelCase>
    range_text: str | None = None  # compact wording for long int ranges
    doc: str = ""
    # Added after config ids were in use: left out of the canonical JSON (so of the id) at its
    # default, which must compile the kernel as before.
    id_neutral: bool = False
    # The problem-class flags (tuner.problem.ProblemClass attributes) a kernel must have for the
    # knob to change it; a search of another class keeps it at its default (SearchSpace.for_class).
    classes: tuple[str, ...] = ()

    def allowed_text(self) -> str:
        if self.range_text:
            return self.range_text
        return ", ".join(fmt(c) for c in self.choices)

    def check(self, value: Any) -> Any:
        """Return the value if allowed, else raise ConfigError naming the knob."""
        ok: bool
        if self.kind == "bool":
            ok = isinstance(value, bool)
        elif self.kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and value in self.choices
        else:
            ok = isinstance(value, str) and value in self.choices
        if not ok:
            # '128' and 128 print alike: say when the type is what is wrong (YAML quotes).
            want = {"bool": "bool", "int": "int"}.get(self.kind, "str")
            kind = type(value).__name__
            got = fmt(value)
            if kind != want:
                got += f", {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
                if kind == "str" and self._unquoted_ok(value):
                    got += ": write it without quotes"
            raise ConfigError(
                f"knob '{self.name}' must be {'one of ' if not self.range_text else ''}"
                f"{self.allowed_text()} (got {got})"
            )
        return value

    def _unquoted_ok(self, text: str) -> bool:
        """Whether ``text`` without its YAML quotes would be an allowed value."""
        try:
            value = yaml.safe_load(text)
            if isinstance(value, str):
                return False  # still a string: quotes are not what is wrong
            self.check(value)
        except (ConfigError, yaml.YAMLError):
            return False
        return True

    # ---- the template contract -----------------------------------------------------------
    def cpp_decl_type(self) -> str:
        return f"fa_tune::{self.cpp_type}" if self.kind == "enum" else self.kind

    def cpp_value(self, value: Any) -> str:
        """The value as a C++ literal: ``128``, ``true``, ``fa_tune::CacheHint::EvictFirst``."""
        if self.kind == "bool":
            return "true" if value else "false"
        if self.kind == "int":
            return str(int(value))
        return f"fa_tune::{self.cpp_type}::{camel_case(value)}"

    def cpp_member(self, value: Any) -> str:
        """The knob's line of the rendered template's ``struct Config``."""
        return f"  static constexpr {self.cpp_decl_type()} {self.name} = {self.cpp_value(value)};"


def knob(default: Any, choices: Iterable[Any] | None = None, *, doc: str,
         cpp_type: str | None = None, range_text: str | None = None,
         id_neutral: bool = False, classes: tuple[str, ...] = ()) -> Any:
    """A KernelConfig field declaring one knob: ``block_m: int = knob(128, (64, 128, 192),
    doc=...)``. The kind follows the default (bool, int, or str for an enum, which names its
    ``fa_tune::`` enum in cpp_type); a bool's choices are false and true."""
    if isinstance(default, bool):
        kind, values = "bool", (False, True)
    elif isinstance(default, int):
        kind, values = "int", tuple(choices or ())
    else:
        kind, values = "enum", tuple(choices or ())
        if not cpp_type:
            raise TypeError("an enum knob names its C++ enum (cpp_type)")
    if default not in values:
        raise TypeError(f"a knob's default {default!r} is not among its choices")
    meta = {"kind": kind, "choices": values, "cpp_type": cpp_type, "range_text": range_text,
            "doc": doc, "id_neutral": id_neutral, "classes": tuple(classes)}
    return dataclasses.field(default=default, metadata={KNOB_METADATA: meta})


def table(config_class: type) -> dict[str, Knob]:
    """name -> Knob for every field of the config dataclass, in field order."""
    out: dict[str, Knob] = {}
    for f in dataclasses.fields(config_class):
        meta = f.metadata.get(KNOB_METADATA)
        if meta is None:
            raise TypeError(f"{config_class.__name__}.{f.name} is not declared with knob()")
        k = Knob(name=f.name, default=f.default, **meta)
        if _ANNOTATION[k.kind] != (f.type if isinstance(f.type, str) else f.type.__name__):
            raise TypeError(f"{config_class.__name__}.{f.name}: the {k.kind} knob is annotated "
                            f"{f.type}")
        out[f.name] = k
    return out


def cpp_members(knobs: Mapping[str, Knob], values: Mapping[str, Any]) -> str:
    """The rendered template's ``struct Config`` members, one line per knob, in table order."""
    return "\n".join(k.cpp_member(values[name]) for name, k in knobs.items())


def markdown_table(knobs: Mapping[str, Knob]) -> str:
    """docs/ARCHITECTURE.md's knob table (Markdown, one row per knob, ending in a newline)."""
    rows = ["| knob | values | default | C++ type | what it does |", "|---|---|---|---|---|"]
    for k in knobs.values():
        cpp = f"`{k.cpp_decl_type()}`" if k.kind == "enum" else k.kind
        doc = k.doc + (f" Left out of the config id at {fmt(k.default)}." if k.id_neutral
                       else "")
        if k.classes:
            doc += f" Searched only for {' '.join(k.classes)} problem classes."
        rows.append(f"| {k.name} | {k.allowed_text()} | {fmt(k.default)} | {cpp} | {doc} |")
    return "\n".join(rows) + "\n"


# The table's place in docs/ARCHITECTURE.md.
DOC_BEGIN = "<!-- knob table: generated by scripts/knob_table.py --write, from KernelConfig -->\n"
DOC_END = "<!-- end of the knob table -->\n"


def docs_table(text: str) -> str:
    """The knob table between the markers of a Markdown text ('' when it has none)."""
    if DOC_BEGIN not in text or DOC_END not in text:
        return ""
    return text[text.index(DOC_BEGIN) + len(DOC_BEGIN):text.index(DOC_END)]


def fmt(v: Any) -> str:
    """A knob value as configs and messages write it: true/false, bare strings, ints."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    return repr(v)


def camel_case(value: str) -> str:
    """``evict_first`` -> ``EvictFirst`` (the template contract's enum spelling)."""
    return "".join(part[:1].upper() + part[1:] for part in value.split("_"))
