"""The exported op with a paged KV cache (issue 37, C ABI 5) without a GPU: the schema's
block_table, FA3's names (page_table, cache_seqlens), the fake implementation's shapes for every
paged form (meta tensors, FakeTensorMode, torch.compile), one clear error for every paged input
the library cannot run, the argument struct the op builds (through the real generated
dispatcher into stub buckets that record it: tests/dispatch_stub.py, built with STUB_PAGED=1),
the bad-block-table status word, and the C++ launch path's source against this torch's headers.
The GPU side (the kernel's numbers, CUDA graph replays with a changed table) is
tests/gpu/test_paged_op_gpu.py."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="fa_tune_ops needs PyTorch (pip install torch)")

from dispatch_stub import build_stub_library, last_args  # noqa: E402
from op_errors import one_error  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode  # noqa: E402

from tuner.ship import dispatch  # noqa: E402
from tuner.ship.workload import workload_from_dict  # noqa: E402

ops = pytest.importorskip("tuner.ship.fa_tune_ops", reason="fa_tune_ops needs PyTorch")
from tuner.ship.fa_tune_ops import abi, checks, status  # noqa: E402
from tuner.ship.fa_tune_ops import op as op_mod  # noqa: E402

BF16 = torch.bfloat16
HQ, HKV, D = 32, 8, 128
WORKLOAD = {  # bucket "short": lengths up to 2048, "long": up to 16384
    "name": "two",
    "attention": {"Hq": HQ, "Hkv": HKV, "head_dim": D, "causal": True},
    "buckets": [{"name": "short", "max_s": 2048}, {"name": "long", "max_s": 16384}],
    "traffic": {"shapes": [{"S": 1024}, {"S": 8192}]},
}


def _build(folder: Path, paged: bool) -> Path:
    w = workload_from_dict(WORKLOAD)
    t = dispatch.table_for_workload(w, dispatch.bucket_sources(w, default="preset:default"))
    return build_stub_library(t, folder, ("STUB_PAGED=1",) if paged else ())


@pytest.fixture(scope="module")
def libs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The two-bucket stub library built paged and plain; the paged one loaded (the library
    loaded before is loaded again afterwards)."""
    before = op_mod._lib
    out = {"paged": _build(tmp_path_factory.mktemp("paged"), True),
           "plain": _build(tmp_path_factory.mktemp("plain"), False)}
    ops.load(str(out["paged"]))
    yield out
    if before is not None:
        ops.load(str(before.path))


@pytest.fixture
def plain(libs: dict[str, Path]) -> Iterator[object]:
    """The library built without pages, loaded for the test."""
    yield ops.load(str(libs["plain"]))
    ops.load(str(libs["paged"]))


def empty(*shape: int, device: str = "meta", dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.empty(*shape, device=device, dtype=dtype)


def ints(*shape: int, dtype: torch.dtype = torch.int32, device: str = "meta") -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device=device)


def cache(pages: int = 64, page_size: int = 256, hkv: int = HKV, device: str = "meta",
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v as a paged cache [num_pages, page_size, Hkv, D]."""
    return (empty(pages, page_size, hkv, D, device=device),
            empty(pages, page_size, hkv, D, device=device))


def test_schema_takes_a_block_table(libs: dict[str, Path]) -> None:
    for name in ("attention", "_attention_py"):
        schema = getattr(torch.ops.fa_tune, name).default._schema
        assert schema.arguments[-1].name == "block_table"
        assert str(schema.arguments[-1].type) == "Optional[Tensor]"
        assert [a.name for a in schema.arguments][:13] == [
            "q", "k", "v", "causal", "softmax_scale", "cu_seqlens_q", "cu_seqlens_k",
            "max_seqlen_q", "max_seqlen_k", "seqused_k", "window", "softcap", "sinks"]
    lib = ops.library()
    assert lib.paged and lib.paged_at(0) and lib.paged_at(1) and lib.paged_at() is True


# (name, q, k/v, kwargs, out shape, lse shape): every paged form.
def _wide_table() -> torch.Tensor:
    return ints(3, 40)[:, :16]  # a view of a wider table: row stride 40, unit page stride


PAGED = [
    ("fixed q over pages", lambda: empty(3, 128, HQ, D), cache,
     {"seqused_k": ints(3), "block_table": ints(3, 16)}, (3, 128, HQ, D), (3, HQ, 128)),
    ("no seqused_k: max_seqlen_k keys each", lambda: empty(2, 64, HQ, D), cache,
     {"block_table": ints(2, 4)}, (2, 64, HQ, D), (2, HQ, 64)),
    ("packed q over pages", lambda: empty(700, HQ, D), cache,
     {"cu_seqlens_q": ints(4), "max_seqlen_q": 300, "seqused_k": ints(3),
      "block_table": ints(3, 16)}, (700, HQ, D), (HQ, 700)),
    ("max_seqlen_k below the table's", lambda: empty(3, 128, HQ, D), cache,
     {"seqused_k": ints(3), "block_table": ints(3, 64), "max_seqlen_k": 4096},
     (3, 128, HQ, D), (3, HQ, 128)),
    ("a strided view of a wider table", lambda: empty(3, 128, HQ, D), cache,
     {"seqused_k": ints(3), "block_table": _wide_table()}, (3, 128, HQ, D), (3, HQ, 128)),
    ("small pages", lambda: empty(1, 100, HQ, D), lambda: cache(1000, 8),
     {"seqused_k": ints(1), "block_table": ints(1, 512)}, (1, 100, HQ, D), (1, HQ, 100)),
]


def _fake(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")


@pytest.mark.parametrize("name, make_q, make_kv, kwargs, out_shape, lse_shape", PAGED,
                         ids=[f[0] for f in PAGED])
def test_every_paged_form_has_its_shapes(libs, name, make_q, make_kv, kwargs, out_shape,
                                         lse_shape) -> None:
    """The fake implementation (meta tensors, and FakeTensorMode as torch.compile traces)."""
    q, (k, v) = make_q(), make_kv()
    out, lse = ops.attention(q, k, v, **kwargs)
    assert out.shape == out_shape and out.dtype == BF16 and out.is_contiguous()
    assert lse.shape == lse_shape and lse.dtype == torch.float32
    with FakeTensorMode():
        conv = {k_: _fake(v_) if isinstance(v_, torch.Tensor) else v_ for k_, v_ in kwargs.items()}
        out, lse = ops.attention(_fake(q), _fake(k), _fake(v), **conv)
        assert isinstance(out, FakeTensor) and out.shape == out_shape
        assert out.device.type == "cuda" and lse.shape == lse_shape


def test_fa3_names(libs) -> None:
    """page_table is FA3's name for block_table, cache_seqlens flash_attn_with_kvcache's for
    seqused_k (an int: one length for every sequence, packed q's sequences counted by
    cu_seqlens_q)."""
    q, (k, v), table = empty(3, 128, HQ, D), cache(), ints(3, 16)
    out, lse = ops.attention(q, k, v, cache_seqlens=ints(3), page_table=table)
    assert out.shape == q.shape and lse.shape == (3, HQ, 128)
    assert ops.attention(q, k, v, cache_seqlens=1000, page_table=table)[0].shape == q.shape
    qp = empty(700, HQ, D)
    out, _ = ops.attention(qp, k, v, cu_seqlens_q=ints(4), max_seqlen_q=300,
                           cache_seqlens=2000, page_table=table)
    assert out.shape == qp.shape
    assert "give block_table or page_table" in one_error(
        lambda: ops.attention(q, k, v, block_table=table, page_table=table))


def test_compile_fullgraph_traces_a_paged_call(libs) -> None:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(q, k, v, used, table):
        out, lse = torch.ops.fa_tune.attention(q, k, v, True, None, None, None, None, None,
                                               used, 0, 0.0, None, table)
        return out * 2, lse

    args = (empty(3, 128, HQ, D), *cache(), ints(3), ints(3, 16))
    out, lse = torch.compile(f, fullgraph=True, backend=backend)(*args)
    assert out.shape == (3, 128, HQ, D) and lse.shape == (3, HQ, 128)
    assert "torch.ops.fa_tune.attention" in graphs[0].code
    out, _ = torch.compile(f, fullgraph=True, backend="aot_eager")(*args)
    assert out.shape == (3, 128, HQ, D)


def _q() -> torch.Tensor:
    return empty(3, 128, HQ, D)


@pytest.mark.parametrize("make, kwargs, needle", [
    (lambda: (_q(), *cache()), {"block_table": ints(3, 16), "cu_seqlens_k": ints(4),
                                "max_seqlen_k": 100},
     "cu_seqlens_k and block_table together: a paged cache's keys per sequence are seqused_k"),
    (lambda: (_q(), *cache()), {"block_table": ints(3, 16, dtype=torch.int64)},
     "block_table is torch.int64; the kernel takes torch.int32 (block_table.to(torch.int32))"),
    (lambda: (_q(), *cache()), {"block_table": ints(3, 16, device="cpu")},
     "block_table must be on q's device meta (the kernel reads it there); got cpu"),
    (lambda: (_q(), *cache()), {"block_table": ints(48)},
     "block_table must be 2-D [batch, max_pages]; got [48]"),
    (lambda: (_q(), *cache()), {"block_table": ints(4, 16)},
     "block_table must have one row per sequence: [3, max_pages]; got [4, 16]"),
    (lambda: (_q(), *cache()), {"block_table": ints(3, 0)},
     "block_table [3, 0] has no entries per sequence"),
    (lambda: (_q(), *cache()), {"block_table": ints(3, 32)[:, ::2]},
     "block_table with strides (32, 2) is not contiguous along its pages"),
    (lambda: (_q(), *cache()), {"block_table": ints(1, 16).expand(3, 16)},
     "block_table's rows overlap (row stride 0 < 16 entries); pass block_table.contiguous()"),
    (lambda: (_q(), *cache(page_size=12)), {"block_table": ints(3, 16)},
     "page size 12 (k.shape[1]) must be a power of two from 8 to 4096 rows"),
    (lambda: (_q(), *cache(page_size=4)), {"block_table": ints(3, 16)},
     "page size 4 (k.shape[1]) must be a power of two from 8 to 4096 rows"),
    (lambda: (_q(), *cache(8, 8192)), {"block_table": ints(3, 1)},
     "page size 8192 (k.shape[1]) must be a power of two"),
    (lambda: (_q(), cache()[0], cache(32)[1]), {"block_table": ints(3, 16)},
     "with block_table, k and v are a paged cache [num_pages, page_size, Hkv, head_dim], alike; "
     "got k [64, 256, 8, 128], v [32, 256, 8, 128]"),
    (lambda: (_q(), empty(5000, HKV, D), empty(5000, HKV, D)), {"block_table": ints(3, 16)},
     "with block_table, k and v are a paged cache"),
    (lambda: (_q(), *cache(0)), {"block_table": ints(3, 16)}, "k [0, 256, 8, 128] has no pages"),
    (lambda: (_q(), empty(64, 256, HKV, 64), empty(64, 256, HKV, 64)),
     {"block_table": ints(3, 16)}, "k and v must have q's head dim 128; got k [64, 256, 8, 64]"),
    (lambda: (_q(), *cache()), {"block_table": ints(3, 16), "max_seqlen_k": 5000},
     "max_seqlen_k 5000 exceeds the 4096 keys a block_table row holds (max_pages 16 x "
     "page_size 256)"),
    (lambda: (_q(), *cache()), {"block_table": ints(3, 16), "seqused_k": ints(4)},
     "seqused_k must have batch = 3 entries; got [4]"),
    (lambda: (empty(700, HQ, D), *cache()), {"block_table": ints(3, 16)},
     "q [700, 32, 128] is packed [total_q, Hq, head_dim]: pass cu_seqlens_q"),
    (lambda: (empty(700, HQ, D), *cache()), {"block_table": ints(3, 16), "cu_seqlens_q": ints(4)},
     "cu_seqlens_q needs max_seqlen_q"),
    (lambda: (empty(1, 20000, HQ, D), *cache()), {"block_table": ints(1, 100)},
     "no bucket of libfa_tune_fwd.so serves paged Hq=32 Hkv=8 max_seqlen_q=20000 "
     "max_seqlen_k=25600"),
    (lambda: (_q(), *cache()), {"block_table": ints(3, 2**24)},
     "block_table rows of 16777216 pages of 256 keys exceed the kernel's 32-bit lengths; pass "
     "max_seqlen_k"),
    (lambda: (_q(), *cache()), {"block_table": ints(3, 16), "window": 64},
     "window=64: libfa_tune_fwd.so is built without sliding windows"),
    (lambda: (empty(3, 128, HQ, D, device="cpu"), *cache(device="cpu")),
     {"block_table": ints(3, 16, device="cpu")}, "q, k and v must be CUDA tensors; got cpu"),
    # A paged library's device-scheduled kernel takes paged calls only.
    (lambda: (_q(), empty(3, 4096, HKV, D), empty(3, 4096, HKV, D)), {"seqused_k": ints(3)},
     "bucket short of libfa_tune_fwd.so is built for a paged KV cache: its device-scheduled "
     "kernel (cu_seqlens_q, cu_seqlens_k, seqused_k) reads k and v through block_table only"),
    (lambda: (empty(700, HQ, D), empty(900, HKV, D), empty(900, HKV, D)),
     {"cu_seqlens_q": ints(4), "cu_seqlens_k": ints(4), "max_seqlen_q": 300,
      "max_seqlen_k": 400}, "bucket short of libfa_tune_fwd.so is built for a paged KV cache"),
])
def test_paged_input_the_library_cannot_run_is_one_clear_error(libs, make, kwargs,
                                                               needle) -> None:
    q, k, v = make()
    msg = one_error(lambda: ops.attention(q, k, v, **kwargs))
    assert needle in msg, msg


def test_a_paged_librarys_fixed_length_calls_stay_plain(libs) -> None:
    out, lse = ops.attention(empty(2, 1024, HQ, D), empty(2, 1024, HKV, D),
                             empty(2, 1024, HKV, D))
    assert out.shape == (2, 1024, HQ, D) and lse.shape == (2, HQ, 1024)


def test_a_library_without_pages_refuses_a_block_table(plain) -> None:
    assert not plain.paged and plain.paged_at(0) is False
    msg = one_error(lambda: ops.attention(_q(), *cache(), block_table=ints(3, 16)))
    assert ("block_table given: libfa_tune_fwd.so is built without a paged KV cache (export one "
            "for a problem class with :pP)") in msg
    # and its unpaged device-scheduled calls go on as before
    out, _ = ops.attention(_q(), empty(3, 4096, HKV, D), empty(3, 4096, HKV, D),
                           seqused_k=ints(3))
    assert out.shape == (3, 128, HQ, D)


# ---- the argument struct, through the dispatcher into the stub buckets --------------------------
def _cpu_call(table: torch.Tensor, q: torch.Tensor, **kw):
    """A paged call's checks and struct on CPU tensors (the op's CUDA path builds the same
    struct, op.build_args; the CPU tensors give real addresses)."""
    k, v = cache(64, 256, device="cpu")
    lib = ops.library()
    call = ops.check_inputs(q, k, v, block_table=table, **kw)
    strides = tuple(checks.kernel_strides(t)[0] for t in (q, k, v))
    out = torch.empty(q.shape, dtype=BF16)
    lse = torch.empty(call.lse_shape(q), dtype=torch.float32)
    args = op_mod.build_args(lib, call, q, k, v, out, lse, strides,  # type: ignore[arg-type]
                             kw.get("softmax_scale"), kw.get("cu_seqlens_q"), None,
                             kw.get("seqused_k"), block_table=table)
    return lib, call, args, (q, k, v, out, lse)


def test_the_struct_of_a_paged_call(libs) -> None:
    table = torch.zeros(3, 40, dtype=torch.int32)[:, :16]  # a view: row stride 40
    used = torch.zeros(3, dtype=torch.int32)
    q = torch.empty(3, 128, HQ, D, dtype=BF16)
    lib, call, a, (q, k, v, out, lse) = _cpu_call(table, q, seqused_k=used, softmax_scale=0.1)
    assert call.pages == checks.Pages(256, 64, 16, 40) and call.device_metadata
    assert (a.abi_version, a.struct_bytes) == (5, ctypes.sizeof(abi.Args)) and abi.ABI_VERSION == 5
    assert (a.block_table, a.block_table_stride, a.max_pages, a.page_size, a.num_pages) == (
        table.data_ptr(), 40, 16, 256, 64)
    assert (a.q, a.k, a.v, a.o, a.lse) == tuple(t.data_ptr() for t in (q, k, v, out, lse))
    # k's batch stride is the page stride
    assert list(a.k_stride) == [256 * HKV * D, HKV * D, D] == list(a.v_stride)
    assert (a.batch, a.seqlen_q, a.seqlen_k, a.total_q, a.total_k) == (3, 128, 4096, 0, 0)
    assert a.seqused_k == used.data_ptr() and not a.cu_seqlens_q and not a.cu_seqlens_k
    assert abs(a.softmax_scale - 0.1) < 1e-7
    assert (a.heads_q, a.heads_kv, a.head_dim) == (HQ, HKV, D)
    # The dispatcher routes it as a device-scheduled call by its lengths (S_q 128: bucket
    # short) and the bucket receives the struct as built.
    words = (ctypes.c_int32 * 2)(0, 0)
    a.status = ctypes.addressof(words)
    assert lib.workspace_bytes(ctypes.byref(a)) == 1003  # bucket 0's (stub: 1000 (i+1) + B)
    assert lib.forward(ctypes.byref(a), None) == 0
    got = last_args(lib._lib)
    assert lib._lib.stub_last_bucket() == 0
    assert (got.block_table, got.block_table_stride, got.max_pages, got.page_size,
            got.num_pages) == (table.data_ptr(), 40, 16, 256, 64)


def test_the_struct_of_a_packed_paged_call_without_seqused_k(libs) -> None:
    """A block table alone makes a call device-scheduled (the dispatcher asks its bucket for a
    workspace); one sequence's row stride is never read: max_pages goes."""
    table = torch.zeros(1, 8, dtype=torch.int32)
    q = torch.empty(100, HQ, D, dtype=BF16)
    cu = torch.zeros(2, dtype=torch.int32)
    lib, call, a, _ = _cpu_call(table, q, cu_seqlens_q=cu, max_seqlen_q=100)
    assert call.packed_q and call.lse_shape(q) == (HQ, 100)
    assert (a.batch, a.total_q, a.seqlen_q, a.seqlen_k) == (1, 100, 100, 2048)
    assert (a.block_table_stride, a.max_pages, a.cu_seqlens_q, a.seqused_k) == (
        8, 8, cu.data_ptr(), None)
    assert lib.workspace_bytes(ctypes.byref(a)) == 1001  # bucket short's
    assert lib.forward(ctypes.byref(a), None) == 0 and lib._lib.stub_last_bucket() == 0


def test_a_bad_block_table_raises_once_in_one_sentence(libs,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's FA_TUNE_BAD_BLOCK_TABLE (the stub writes it for seqlen_q 555) reaches the
    status words; the op raises abi.BAD_METADATA[32]'s text once, naming the sequence."""
    table = torch.zeros(3, 16, dtype=torch.int32)
    lib, _, a, _ = _cpu_call(table, torch.empty(3, 555, HQ, D, dtype=BF16))
    words = (ctypes.c_int32 * 2)(0, 0)
    a.status = ctypes.addressof(words)
    assert lib.forward(ctypes.byref(a), None) == 0
    assert list(words) == [32, 1]
    monkeypatch.setitem(status._status, 7, (torch.zeros(2), words))
    with pytest.raises(ValueError) as e:
        status.raise_pending(7)
    assert str(e.value) == (
        "fa_tune::attention: an earlier call on cuda:7 had bad device metadata: a block table "
        "entry lies outside the KV cache's pages (first at sequence 1); its out and lse are "
        "NaN (the kernel read "
        "nothing out of bounds)")
    status.raise_pending(7)  # once


# ---- the C++ launch path ------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_native_source_compiles_against_this_torch(tmp_path: Path) -> None:
    """attention_op.cpp (its paged branch too) against this torch's headers and fa_tune.h: a
    syntax-only compile, so a CPU build of torch checks it as well (its c10/cuda headers lack
    only the generated macros file, stubbed here; linking needs a CUDA torch: the native test
    in test_fa_tune_ops.py and the GPU tests)."""
    from tuner.ship.fa_tune_ops import native

    if native._cuda_include() is None:
        pytest.skip("no CUDA headers here")
    (tmp_path / "c10" / "cuda" / "impl").mkdir(parents=True)
    (tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("#pragma once\n")
    cmd = [c for c in native.compile_command(tmp_path / "x.so")
           if c != "-shared" and not c.startswith(("-l", "-L", "-Wl"))]
    cmd = cmd[:cmd.index("-o")]
    cmd[1:1] = [f"-I{tmp_path}"]  # it holds only the file torch's CPU build lacks
    r = subprocess.run([*cmd, "-fsyntax-only", "-Wall"], capture_output=True, text=True,
                       timeout=300)
    errors = [ln for ln in r.stderr.splitlines() if "attention_op.cpp" in ln]
    assert r.returncode == 0 and not errors, r.stderr[-3000:]


# ---- the transformers backend over a paged library ----------------------------------------------
def test_hf_packed_sequences_on_a_paged_library_are_refused_in_one_line(libs) -> None:
    """transformers' packed batches carry cu_seqlens, no block table: a paged library's varlen
    kernel cannot take them, which the backend says (it has no fallback for packed batches);
    its prefill (fixed length) still runs the kernel."""
    from tuner.ship.fa_tune_ops import hf

    query, key = empty(1, HQ, 5000, D), empty(1, HKV, 5000, D)
    cu = ints(4)
    masks = hf._Masks(0, 0.0, None)
    assert hf._fallback_reason(query, key, None, True, 0.0, masks,
                               (cu, cu, 2000, 2000)) == "a paged library"
    assert hf._fallback_reason(empty(1, HQ, 1024, D), empty(1, HKV, 1024, D), None, True, 0.0,
                               masks, None) is None
