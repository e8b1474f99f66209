"""The C ABI's one Python mirror (tuner/ship/fa_tune_ops/abi.py) against its definition,
cuda_src/fa_tune/fa_tune.h: a small C program compiled against the header prints the version,
sizeof(fa_tune_args), the offset of every field and the status bits; abi.Args must agree field
by field, and hold exactly the header's fields in its order. Needs a C compiler (cc or gcc;
fa_tune.h's cuda_runtime.h is a one-line stub here: the struct uses no CUDA type)."""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess

import pytest

from tuner import _paths
from tuner.kernel.runtime import abi

HEADER = _paths.cuda_src_dir() / "fa_tune" / "fa_tune.h"


def _header_fields() -> list[str]:
    """The struct's field names, in order, as the header declares them."""
    text = HEADER.read_text()
    body = re.search(r"typedef struct fa_tune_args \{(.*?)\} fa_tune_args;", text, re.S)
    assert body is not None, "no typedef struct fa_tune_args in fa_tune.h"
    names = []
    for line in body.group(1).splitlines():
        decl = line.split("//")[0].strip()
        if decl:
            m = re.search(r"(\w+)\s*(\[\d+\])?\s*;$", decl)
            assert m is not None, decl
            names.append(m.group(1))
    return names


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("abi")
    fields = [name for name, _ in abi.Args._fields_]
    prints = "\n".join(f'  printf(",\\"{n}\\":%zu", offsetof(fa_tune_args, {n}));'
                       for n in fields)
    bits = "\n".join(f'  printf(",\\"bit_{b}\\":%d", {b} == {name});'
                     for b, name in zip(abi.BAD_METADATA, (
                         "FA_TUNE_BAD_CU_SEQLENS_Q", "FA_TUNE_BAD_CU_SEQLENS_K",
                         "FA_TUNE_BAD_SEQUSED_K", "FA_TUNE_BAD_MAX_SEQLEN_Q",
                         "FA_TUNE_BAD_MAX_SEQLEN_K", "FA_TUNE_BAD_BLOCK_TABLE"), strict=True))
    src = tmp / "abi.c"
    src.write_text(f"""\
#include <stddef.h>
#include <stdio.h>
#include "fa_tune.h"
int main(void) {{
  printf("{{\\"version\\":%d,\\"size\\":%zu", FA_TUNE_ABI_VERSION, sizeof(fa_tune_args));
{prints}
{bits}
  printf("}}\\n");
  return 0;
}}
""")
    exe = tmp / "abi"
    (tmp / "cuda_runtime.h").write_text("typedef struct CUstream_st* cudaStream_t;\n")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    cmd = [cc, "-std=c11", "-Wall", "-Werror", f"-I{tmp}", f"-I{HEADER.parent}", str(src), "-o",
           str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_version_and_size(compiled: dict) -> None:
    assert compiled["version"] == abi.ABI_VERSION
    assert compiled["size"] == ctypes.sizeof(abi.Args)
    assert abi.make_args().struct_bytes == compiled["size"]
    assert abi.make_args().abi_version == compiled["version"]


def test_every_field_at_the_same_offset(compiled: dict) -> None:
    for name, _ in abi.Args._fields_:
        assert getattr(abi.Args, name).offset == compiled[name], name


def test_the_same_fields_in_the_same_order() -> None:
    assert [name for name, _ in abi.Args._fields_] == _header_fields()


def test_status_bits_match(compiled: dict) -> None:
    for b in abi.BAD_METADATA:
        assert compiled[f"bit_{b}"] == 1, b


def test_make_args_and_texts() -> None:
    a = abi.make_args(q_stride=(1, 2, 3), heads_q=32, seqlen_k=8192)
    assert list(a.q_stride) == [1, 2, 3] and a.heads_q == 32 and a.seqlen_k == 8192
    assert list(a.k_stride) == [0, 0, 0] and not a.cu_seqlens_q
    assert abi.bad_metadata_text(2 | 4, 7) == (
        "cu_seqlens_k does not run from 0, non-decreasing, within the key rows; seqused_k is "
        "negative or exceeds the keys its sequence holds (first at sequence 7)")
    assert abi.bad_metadata_text(64, 0) == "code 64 (first at sequence 0)"
