"""CPU tests of tuner/kernel/runtime.py: no-GPU errors are one-line GpuErrors, and the ctypes
binding of the kernel C ABI (against a host-only stand-in library built with the C compiler)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.errors import FaTuneError, GpuError
from tuner.kernel import runtime as R
from tuner.kernel.support import class_reason

DATA = Path(__file__).parent / "data"


def _gpu_present() -> bool:
    try:
        from tuner.doctor import has_sm90_gpu

        return has_sm90_gpu()
    except Exception:
        return False


def test_device_open_without_gpu_raises_one_line_gpu_error() -> None:
    if _gpu_present():
        pytest.skip("a GPU is present")
    with pytest.raises(GpuError) as ei:
        R.Device.open(0)
    msg = str(ei.value)
    assert "\n" not in msg and msg
    assert "driver" in msg or "GPU" in msg
    assert isinstance(ei.value, FaTuneError) and ei.value.exit_code == 2


def test_cuda_error_names() -> None:
    assert R.cuda_error_name(700) == "cudaErrorIllegalAddress"
    assert R.cuda_error_name(1) == "cudaErrorInvalidValue"
    assert R.cuda_error_name(987654) == "cudaError 987654"


def test_stream_handle() -> None:
    assert R.stream_handle(None) == 0
    assert R.stream_handle(0x1234) == 0x1234


def test_device_buffer_rejects_bad_sizes() -> None:
    dummy = SimpleNamespace(make_current=lambda: None)
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError):
            R.DeviceBuffer(dummy, bad)  # type: ignore[arg-type]


def test_elems() -> None:
    s = SimpleNamespace(B=4, H=32, S=4096)
    assert R.elems_bshd(s) == 4 * 32 * 4096 * 128
    assert R.elems_lse(s) == 4 * 32 * 4096


ROOT = Path(__file__).resolve().parents[1]
HEADER_DIR = ROOT / "cuda_src" / "fa_tune"


def _build_fake(out: Path, *defines: str) -> Path:
    """tests/data/fake_kernel_abi.c against the real fa_tune.h (one definition of the struct),
    with a stub cuda_runtime.h that only declares cudaStream_t (no CUDA here)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    stub = out.parent / "stub_include"
    stub.mkdir(exist_ok=True)
    (stub / "cuda_runtime.h").write_text("typedef struct CUstream_st* cudaStream_t;\n")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", *(f"-D{d}" for d in defines), f"-I{stub}",
                    f"-I{HEADER_DIR}", "-o", str(out), str(DATA / "fake_kernel_abi.c")],
                   check=True)
    return out


@pytest.fixture(scope="module", params=["true", "false"])
def fake_so(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fake") / f"fake_{request.param}.so"
    return _build_fake(out, f'FAKE_WRITE_LSE="{request.param}"')


def _module(so: Path) -> R.KernelModule:
    """A KernelModule whose status words are host memory (no GPU to map them for)."""
    return R.KernelModule(so, status_factory=R.HostStatus)


def _last(km: R.KernelModule) -> tuple[Any, int]:
    """The argument struct and stream of the stand-in's last call."""
    fn = km._lib.fake_last_args
    fn.restype = ctypes.POINTER(R.abi.Args)
    st = km._lib.fake_last_stream
    st.restype = ctypes.c_void_p
    return fn().contents, int(st() or 0)


def _ptr(x: int) -> SimpleNamespace:
    return SimpleNamespace(ptr=x)


def _bufs(shape: Any) -> SimpleNamespace:
    """Stand-in buffers at fixed addresses (a packed batch: cu_seqlens_q / _k too)."""
    b = SimpleNamespace(q=_ptr(0x1000), k=_ptr(0x2000), v=_ptr(0x3000), o=_ptr(0x4000),
                        lse=_ptr(0x5000), shape=shape, cu_q=None, cu_k=None)
    if getattr(shape, "seqlens", ()):
        b.cu_q, b.cu_k = _ptr(0x6000), _ptr(0x7000)
    return b


def test_kernel_module_binds_abi_5(fake_so: Path) -> None:
    km = _module(fake_so)
    writes = fake_so.stem.endswith("true")
    assert km.config["block_m"] == 128
    assert km.writes_lse is writes
    assert km.smem_bytes() == 123456
    assert km.config_json().startswith("{")
    assert km.causal is True and km.head_dim == 128 and km.has_varlen is True
    shape = SimpleNamespace(B=2, H=3, S=256)
    assert km.prepare(shape, None) == pytest.approx(3.5)
    a, _ = _last(km)
    assert (a.abi_version, a.struct_bytes) == (5, ctypes.sizeof(R.abi.Args))
    assert (a.batch, a.heads_q, a.heads_kv, a.seqlen_q, a.seqlen_k) == (2, 3, 3, 256, 256)
    km.forward(_bufs(shape), 0xABC)  # type: ignore[arg-type]
    a, stream = _last(km)
    assert [a.q, a.k, a.v, a.o] == [0x1000, 0x2000, 0x3000, 0x4000] and stream == 0xABC
    assert (a.lse or 0) == (0x5000 if writes else 0)  # NULL when the variant does not write it
    # Dense BSHD strides in elements: batch S*H*D, sequence H*D, head D.
    assert list(a.q_stride) == list(a.k_stride) == list(a.v_stride) == [256 * 3 * 128, 384, 128]
    assert (a.batch, a.heads_q, a.heads_kv, a.head_dim, a.causal) == (2, 3, 3, 128, 1)
    assert (a.seqlen_q, a.seqlen_k, a.total_q, a.total_k) == (256, 256, 0, 0)
    assert not (a.cu_seqlens_q or a.cu_seqlens_k or a.seqused_k or a.status or a.workspace)
    assert a.softmax_scale == 0.0  # 0: 1/sqrt(D)
    assert (a.window, a.softcap, a.sinks) == (0, 0.0, None)  # no masks asked for
    km.forward(_bufs(shape), None, write_lse=True, softmax_scale=0.125)  # type: ignore[arg-type]
    a, stream = _last(km)
    assert a.lse == 0x5000 and stream == 0 and a.softmax_scale == 0.125
    assert km.workspace_bytes(_bufs(shape)) == 0  # type: ignore[arg-type]


def test_kernel_module_passes_the_models_masks(tmp_path: Path) -> None:
    """A library whose class has windows and sinks: the call carries the problem's window (in
    keys), its cap and the sinks buffer; a problem needing a mask the library lacks is refused
    in one sentence before any call."""
    from tuner.problem import Problem

    so = _build_fake(tmp_path / "masks.so", 'FAKE_WRITE_LSE="true"',
                     'FAKE_MASKS=",\\"window\\":true,\\"sinks\\":true"')
    km = _module(so)
    pc = km.problem_class
    assert (pc.window, pc.softcap, pc.sinks, pc.varlen) == (True, False, True, True)
    p = Problem.parse("1x8/2x512:w128:sinks")
    assert km.unsupported(p) is None
    bufs = _bufs(p)
    bufs.sinks = _ptr(0x8000)
    km.forward(bufs, None)  # type: ignore[arg-type]
    a, _ = _last(km)
    assert (a.window, a.softcap, a.sinks) == (128, 0.0, 0x8000)
    km.prepare(Problem.parse("1x8/2x512:w64"), None)  # prepare sees the window too (the
    a, _ = _last(km)  # static scheduler's task lists count it)
    assert a.window == 64
    km.forward(_bufs(Problem.parse("1x8/2x512")), None)  # type: ignore[arg-type]
    a, _ = _last(km)
    assert (a.window, a.sinks) == (0, None)  # the window class runs a problem without one
    why = km.unsupported(Problem.parse("1x8/2x512:cap50"))
    assert why is not None and "without softcapping" in why and "\n" not in why
    with pytest.raises(R.KernelError, match="without softcapping"):
        km.forward(_bufs(Problem.parse("1x8/2x512:cap50")), None)  # type: ignore[arg-type]
    plain = _module(_build_fake(tmp_path / "plain.so", 'FAKE_WRITE_LSE="true"'))
    why = plain.unsupported(Problem.parse("1x8/2x512:w128:sinks"))
    assert why is not None and "without window and sinks" in why


def test_kernel_module_queries_over_more_keys(fake_so: Path) -> None:
    """S_q < S_k: Q and O strides over S_q rows, K and V over S_k rows, GQA heads."""
    from tuner.problem import Problem

    km = _module(fake_so)
    p = Problem.parse("2x32/8x2048:k8192")
    assert km.prepare(p, None) == pytest.approx(0.5 + 32)
    a, _ = _last(km)
    assert (a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv) == (2048, 8192, 32, 8)
    km.forward(_bufs(p), None)  # type: ignore[arg-type]
    a, _ = _last(km)
    assert list(a.q_stride) == [2048 * 32 * 128, 32 * 128, 128]
    assert list(a.k_stride) == list(a.v_stride) == [8192 * 8 * 128, 8 * 128, 128]
    assert (a.batch, a.seqlen_q, a.seqlen_k) == (2, 2048, 8192)


@pytest.mark.parametrize(("text", "q_stride", "kv_stride", "offsets"), [
    # q, k, v views of one fused [2, 1024, 8 + 2 + 2, 128] projection: q heads 0..7, k 8-9, v 10-11
    ("2x8/2x1024:qkv", [1024 * 12 * 128, 12 * 128, 128], [1024 * 12 * 128, 12 * 128, 128],
     {"q": ("qkv", 0), "k": ("qkv", 8 * 128), "v": ("qkv", 10 * 128)}),
    # k, v over [1, 2, 1024, 128] memory each (a KV cache); q dense
    ("1x8/2x384:k1024:bhsd", [384 * 8 * 128, 8 * 128, 128], [2 * 1024 * 128, 128, 1024 * 128],
     {"q": ("q", 0), "k": ("k_cache", 0), "v": ("v_cache", 0)}),
])
def test_kernel_module_passes_the_layouts_views(fake_so: Path, text: str, q_stride: list,
                                               kv_stride: list, offsets: dict) -> None:
    """The call reads q, k, v where the layout puts them: the layout buffer's address plus the
    view's offset (BF16 elements), with its strides; o stays the dense buffer."""
    from tuner.problem import Problem

    km = _module(fake_so)
    p = Problem.parse(text)
    bufs = _bufs(p)
    bufs.layout_bufs = {"qkv": _ptr(0x10000), "k_cache": _ptr(0x20000), "v_cache": _ptr(0x30000)}
    km.forward(bufs, None)  # type: ignore[arg-type]
    a, _ = _last(km)
    for name, (holder, off) in offsets.items():
        base = bufs.layout_bufs.get(holder) or getattr(bufs, holder)
        assert getattr(a, name) == base.ptr + 2 * off, name
    assert list(a.q_stride) == q_stride
    assert list(a.k_stride) == list(a.v_stride) == kv_stride
    assert a.o == 0x4000 and (a.seqlen_q, a.seqlen_k) == (p.S_q, p.S_k)
    assert km.workspace_bytes(bufs) == 0  # type: ignore[arg-type]
    # prepare() builds the schedule of the shape: the layout does not change it.
    km.prepare(p, None)
    a, _ = _last(km)
    assert (a.batch, a.heads_q, a.heads_kv, a.seqlen_q, a.seqlen_k) == (
        p.B, p.Hq, p.Hkv, p.S_q, p.S_k)


def test_kernel_module_varlen_call(fake_so: Path) -> None:
    from tuner.problem import Problem

    km = _module(fake_so)
    p = Problem.parse("32/8x[2048:8192,512:4096*2,0:100]")
    km.forward(_bufs(p), 0x99)  # type: ignore[arg-type]
    a, stream = _last(km)
    assert (a.cu_seqlens_q, a.cu_seqlens_k, stream) == (0x6000, 0x7000, 0x99)
    assert (a.batch, a.total_q, a.total_k) == (4, 3072, 16484)
    assert (a.seqlen_q, a.seqlen_k) == (2048, 8192)  # max_seqlen_q / max_seqlen_k
    assert list(a.q_stride)[1:] == [32 * 128, 128] and list(a.k_stride)[1:] == [8 * 128, 128]
    assert not a.workspace and a.workspace_bytes == 0  # the library's own
    assert km.status is not None and a.status == km.status.ptr
    assert km.prepare(p, None) == 0.0  # the schedule is built on the device
    assert km.workspace_bytes(_bufs(p)) == 4 * 1000 + 32 * 100 + 2048  # type: ignore[arg-type]
    km.forward(_bufs(p), None, workspace=0x8000, workspace_bytes=9999)  # type: ignore[arg-type]
    a, _ = _last(km)
    assert (a.workspace, a.workspace_bytes) == (0x8000, 9999)
    km.check_status()  # nothing rejected


@pytest.mark.parametrize("text", ["4x32/8x2048:k8192:p64", "32/8x[2048:8192,0:100,1:17]:p16"])
def test_kernel_module_paged_call(tmp_path: Path, text: str) -> None:
    """A paged problem (issue 37): k and v are the pages ([num_pages, page_size, Hkv, D], the
    page stride as batch stride), the block table and its shape, each sequence's key count as
    seqused_k, no cu_seqlens_k (a packed batch keeps its cu_seqlens_q); device-scheduled."""
    from tuner.problem import Problem

    so = _build_fake(tmp_path / "paged.so", 'FAKE_WRITE_LSE="true"',
                     'FAKE_MASKS=",\\"paged\\":true"')
    km = _module(so)
    assert km.problem_class.paged and km.problem_class.varlen
    p = Problem.parse(text)
    assert km.unsupported(p) is None
    bufs = _bufs(p)
    bufs.layout_bufs = {"k_pages": _ptr(0xA000), "v_pages": _ptr(0xB000)}
    bufs.block_table, bufs.seqused_k = _ptr(0xC000), _ptr(0xD000)
    km.forward(bufs, None)  # type: ignore[arg-type]
    a, _ = _last(km)
    pages = p.pages
    assert (a.k, a.v, a.block_table, a.seqused_k) == (0xA000, 0xB000, 0xC000, 0xD000)
    assert list(a.k_stride) == [p.page_size * 8 * 128, 8 * 128, 128]
    assert (a.page_size, a.num_pages, a.max_pages, a.block_table_stride) == (
        p.page_size, pages.num_pages, pages.max_pages, pages.max_pages)
    assert a.cu_seqlens_k is None and (a.cu_seqlens_q is not None) == p.is_varlen
    assert a.seqlen_k == 8192 and km.status is not None and a.status == km.status.ptr
    assert km.prepare(p, None) == 0.0  # the schedule is built on the device
    plain = _module(_build_fake(tmp_path / "plain.so", 'FAKE_WRITE_LSE="true"'))
    why = plain.unsupported(p)
    assert why is not None and "without paged" in why and "\n" not in why


def test_kernel_module_check_status_reports_rejected_metadata(fake_so: Path) -> None:
    from tuner.problem import Problem

    km = _module(fake_so)
    km.check_status()  # no varlen launch yet: nothing to check
    p = Problem.varlen([5, 8], 4, seqlens_k=[5, 9])  # total_q 13: the stand-in rejects it
    km.forward(_bufs(p), None)  # type: ignore[arg-type]
    with pytest.raises(R.KernelError) as ei:
        km.check_status()
    msg = str(ei.value)
    assert "\n" not in msg and "rejected the varlen metadata" in msg
    assert "cu_seqlens_q does not run from 0" in msg and "exceeds max_seqlen_q" in msg
    assert "(first at sequence 2)" in msg
    km.check_status()  # read and cleared
    km.close()
    assert km.status is None


def test_kernel_module_errors_are_one_line(fake_so: Path) -> None:
    km = _module(fake_so)
    args = km.args_for(_bufs(SimpleNamespace(B=1, H=1, S=128)))  # type: ignore[arg-type]
    args.batch = 0  # what a Problem would refuse: the library says why
    with pytest.raises(R.KernelError) as ei:
        km.forward_args(args, None)
    msg = str(ei.value)
    assert msg.startswith("fa_tune_forward(0x1x128) failed with cudaErrorInvalidValue (1): "
                          "batch must be positive [")
    assert "\n" not in msg and ei.value.code == 1
    with pytest.raises(R.KernelError, match=r"fa_tune_prepare\(1x1x100:k300\).*multiple of 128"):
        km.prepare(SimpleNamespace(B=1, H=1, S=100, Sk=300, causal=True), None)


def test_kernel_module_refuses_other_abis_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(FaTuneError, match="not found"):
        R.KernelModule(tmp_path / "nope.so")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")

    def lib(name: str, text: str) -> Path:
        src, so = tmp_path / f"{name}.c", tmp_path / f"{name}.so"  # a new path per library
        src.write_text(text)
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
        return so

    for name, text, needle in (
            ("empty", "int nothing(void) { return 0; }\n", "predates the fa-tune C ABI"),
            ("abi2", "int fa_tune_abi_version(void) { return 2; }\n",
             f"speaks fa-tune C ABI 2, this binding speaks {R.abi.ABI_VERSION}: rebuild or "
             "re-export"),
            ("abi9", "int fa_tune_abi_version(void) { return 9; }\n", "update fa_tune_ops"),
            ("current", f"int fa_tune_abi_version(void) {{ return {R.abi.ABI_VERSION}; }}\n",
             "does not export fa_tune_forward(): not a fa-tune build")):
        with pytest.raises(FaTuneError) as ei:
            R.KernelModule(lib(name, text))
        assert needle in str(ei.value) and "\n" not in str(ei.value), (name, str(ei.value))
    bad = tmp_path / "garbage.so"
    bad.write_text("not an ELF file")
    with pytest.raises(FaTuneError, match="cannot load"):
        R.KernelModule(bad)


# ---- the problem family ---------------------------------------------------------------------
def test_problem_dims_and_elems_for_the_family() -> None:
    from tuner.problem import Problem

    assert R.problem_dims(SimpleNamespace(B=2, H=3, S=64)) == (2, 3, 3, 64, 64, 128, True)
    p = Problem(2, 32, 1024, Hkv=8, D=64, causal=False)
    assert R.problem_dims(p) == (2, 32, 8, 1024, 1024, 64, False)
    assert R.elems_bshd(p) == 2 * 1024 * 32 * 64  # Q and O: Hq heads
    assert R.elems_kv(p) == 2 * 1024 * 8 * 64  # K and V: Hkv heads
    assert R.elems_lse(p) == 2 * 32 * 1024
    assert R.as_problem(SimpleNamespace(B=2, H=3, S=64)) == Problem(2, 3, 64)
    assert R.as_problem(p) is p
    assert R.same_problem(SimpleNamespace(B=2, H=32, S=1024, Hkv=8, D=64, causal=False), p)
    assert not R.same_problem(Problem(2, 32, 1024, Hkv=8, D=64), p)  # the mask matters


class _AllocDev:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def alloc(self, nbytes: int) -> SimpleNamespace:
        self.sizes.append(nbytes)
        return SimpleNamespace(ptr=len(self.sizes), nbytes=nbytes, free=lambda: None)


def test_attn_buffers_of_a_layout_add_its_buffers() -> None:
    from tuner.problem import Problem

    dev = _AllocDev()
    bufs = R.AttnBuffers(dev, Problem.parse("2x8/2x100:d64:qkv"))  # type: ignore[arg-type]
    n_fused = 2 * 100 * (8 + 2 * 2) * 64
    # q, k, v, o, lse as for any problem (the generators' and the reference's), then the fused
    assert dev.sizes == [2 * bufs.n, 2 * bufs.n_kv, 2 * bufs.n_kv, 2 * bufs.n, 4 * bufs.n_lse,
                         2 * n_fused]
    assert list(bufs.layout_bufs) == ["qkv"]
    dev = _AllocDev()
    bufs = R.AttnBuffers(dev, Problem.parse("1x8/2x100:k300:bhsd"))  # type: ignore[arg-type]
    assert dev.sizes[5:] == [2 * 2 * 300 * 128] * 2 and list(bufs.layout_bufs) == [
        "k_cache", "v_cache"]
    assert R.AttnBuffers(_AllocDev(), Problem(1, 2, 64)).layout_bufs == {}  # type: ignore[arg-type]


def test_attn_buffers_sizes_for_gqa_and_head_dims() -> None:
    from tuner.problem import Problem

    p = Problem(2, 8, 256, Hkv=2, D=256)
    dev = _AllocDev()
    bufs = R.AttnBuffers(dev, p)  # type: ignore[arg-type]
    assert bufs.shape is p and bufs.problem is p
    assert (bufs.n, bufs.n_kv, bufs.n_lse) == (2 * 256 * 8 * 256, 2 * 256 * 2 * 256, 2 * 8 * 256)
    # q, k, v, o BF16; lse FP32
    assert dev.sizes == [2 * bufs.n, 2 * bufs.n_kv, 2 * bufs.n_kv, 2 * bufs.n, 4 * bufs.n_lse]
    assert bufs.q.nbytes == bufs.o.nbytes and bufs.k.nbytes == bufs.v.nbytes == bufs.q.nbytes // 4
    mha = R.AttnBuffers(_AllocDev(), SimpleNamespace(B=1, H=2, S=64))  # type: ignore[arg-type]
    assert mha.n == mha.n_kv == 1 * 64 * 2 * 128 and str(mha.shape) == "1x2x64"


def test_kernel_unsupported_rule() -> None:
    from tuner.problem import Problem

    assert class_reason(Problem(4, 32, 4096)) is None
    assert class_reason(SimpleNamespace(B=1, H=1, S=128)) is None
    assert class_reason(Problem(1, 32, 4096, Hkv=8)) is None  # GQA: a run-time argument
    assert class_reason(Problem(1, 32, 4096, Hkv=1)) is None  # MQA
    assert class_reason(Problem(1, 32, 4096, causal=False), causal=False) is None
    for p, kw, needle in ((Problem(1, 32, 4096, D=64), {}, "D=64"),
                          (Problem(1, 32, 4096, causal=False), {}, "non-causal"),
                          (Problem(1, 32, 4096), {"causal": False}, "got causal")):
        why = class_reason(p, **kw)
        assert why is not None and "this kernel library runs D 128" in why and needle in why


@pytest.mark.parametrize("kw", [dict(D=64), dict(D=256), dict(causal=False)])
def test_kernel_module_refuses_problems_it_cannot_run(fake_so: Path, kw: dict) -> None:
    from tuner.problem import Problem

    km = _module(fake_so)
    km.forward(_bufs(SimpleNamespace(B=1, H=1, S=128)), None)  # type: ignore[arg-type]
    p = Problem(3, 4, 256, **kw)
    with pytest.raises(R.KernelError, match=r"runs D 128, causal problems") as ei:
        km.forward(_bufs(p), None)  # type: ignore[arg-type]
    assert "\n" not in str(ei.value)
    assert _last(km)[0].batch == 1  # refused before launching: the last call is the first one
    with pytest.raises(R.KernelError, match="runs D 128"):
        km.prepare(p, None)


def test_kernel_module_passes_gqa_through(fake_so: Path) -> None:
    from tuner.problem import Problem

    km = _module(fake_so)
    km.forward(_bufs(Problem(1, 32, 256, Hkv=8)), None)  # type: ignore[arg-type]
    a, _ = _last(km)
    assert (a.batch, a.heads_q, a.heads_kv, a.seqlen_q) == (1, 32, 8, 256)


def test_kernel_module_without_the_varlen_kernel(tmp_path: Path) -> None:
    from tuner.problem import Problem

    km = _module(_build_fake(tmp_path / "fake_novarlen.so", 'FAKE_WRITE_LSE="true"',
                             "FAKE_VARLEN=0"))
    assert km.varlen is False and km.has_varlen is False
    assert km.problem_class.varlen is False
    km.forward(_bufs(SimpleNamespace(B=1, H=1, S=128)), None)  # type: ignore[arg-type]
    p = Problem.varlen([100, 50], 4)
    assert "no varlen kernel" in (km.unsupported(p) or "")
    with pytest.raises(R.KernelError, match="no varlen kernel"):
        km.forward(_bufs(p), None)  # type: ignore[arg-type]
    with pytest.raises(R.KernelError, match=r"cudaErrorNotSupported \(801\): built without "
                                            "the varlen kernel"):
        km.forward_args(km.args_for(_bufs(p)), None)  # type: ignore[arg-type]


def test_runtime_loads_the_abi_mirror_without_torch() -> None:
    """tuner.kernel.runtime binds through tuner/ship/fa_tune_ops/abi.py without running its
    package's __init__ (torch, the op): a tuner without torch still loads kernel libraries."""
    code = ("import sys; import tuner.kernel.runtime as R; "
            "assert R.abi.ABI_VERSION == 5 and R.abi.Args.__name__ == 'Args'; "
            "assert 'torch' not in sys.modules and 'tuner.ship.fa_tune_ops.op' not in sys.modules; "
            "import importlib; m = importlib.import_module('tuner.ship.fa_tune_ops.abi'); "
            "assert m is R.abi")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
