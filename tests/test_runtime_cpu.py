"""CPU tests of tuner/runtime.py: no-GPU errors are one-line GpuErrors, and the ctypes binding
of the kernel C ABI (against a host-only stand-in library built with the C compiler)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner import runtime as R
from tuner.errors import FaTuneError, GpuError

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


@pytest.fixture(scope="module", params=["true", "false"])
def fake_so(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("fake") / f"fake_{request.param}.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", f"-DFAKE_WRITE_LSE=\"{request.param}\"", "-o", str(out),
         str(DATA / "fake_kernel_abi.c")],
        check=True,
    )
    return out


def _bufs(shape: SimpleNamespace) -> SimpleNamespace:
    mk = SimpleNamespace
    return mk(q=mk(ptr=0x1000), k=mk(ptr=0x2000), v=mk(ptr=0x3000), o=mk(ptr=0x4000),
              lse=mk(ptr=0x5000), shape=shape)


def test_kernel_module_binds_the_abi(fake_so: Path) -> None:
    km = R.KernelModule(fake_so)
    writes = fake_so.stem.endswith("true")
    assert km.config["block_m"] == 128
    assert km.writes_lse is writes
    assert km.smem_bytes() == 123456
    assert km.config_json().startswith("{")
    shape = SimpleNamespace(B=2, H=3, S=256)
    assert km.prepare(shape, None) == pytest.approx(3.5)
    km.forward(_bufs(shape), 0xABC)
    last = km._lib.fake_last
    last.restype = ctypes.c_longlong
    last.argtypes = [ctypes.c_int]
    got = [last(i) for i in range(9)]
    assert got[:4] == [0x1000, 0x2000, 0x3000, 0x4000]
    assert got[4] == (0x5000 if writes else 0)  # LSE is NULL when the variant does not write it
    assert got[5:8] == [2, 3, 256]
    assert got[8] == 0xABC
    assert last(9) == 3 and last(10) == 0  # Hkv = Hq (MHA); scale 0 = 1/sqrt(D)
    km.forward(_bufs(shape), None, write_lse=True, softmax_scale=0.125)
    assert last(4) == 0x5000 and last(8) == 0 and last(10) == 125
    assert km.causal is True and km.head_dim == 128


def test_kernel_module_errors_are_one_line(fake_so: Path) -> None:
    km = R.KernelModule(fake_so)
    with pytest.raises(R.KernelError) as ei:
        km.forward(_bufs(SimpleNamespace(B=0, H=1, S=128)), None)
    msg = str(ei.value)
    assert "cudaErrorInvalidValue" in msg and "B must be positive" in msg and "\n" not in msg
    assert ei.value.code == 1
    with pytest.raises(R.KernelError, match="multiple of 128"):
        km.prepare(SimpleNamespace(B=1, H=1, S=100), None)


def test_kernel_module_missing_file_or_symbol(tmp_path: Path) -> None:
    with pytest.raises(FaTuneError, match="not found"):
        R.KernelModule(tmp_path / "nope.so")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    src = tmp_path / "empty.c"
    src.write_text("int nothing(void) { return 0; }\n")
    so = tmp_path / "empty.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(FaTuneError, match="predates the kernel C ABI 2"):
        R.KernelModule(so)
    src.write_text("int fa_tune_abi_version(void) { return 2; }\n")
    so2 = tmp_path / "abi_only.so"  # a new path: dlopen hands back a loaded library by path
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so2), str(src)], check=True)
    with pytest.raises(FaTuneError, match="does not export fa_tune_forward"):
        R.KernelModule(so2)
    bad = tmp_path / "garbage.so"
    bad.write_text("not an ELF file")
    with pytest.raises(FaTuneError, match="cannot load"):
        R.KernelModule(bad)


# ---- the problem family ---------------------------------------------------------------------
def test_problem_dims_and_elems_for_the_family() -> None:
    from tuner.problem import Problem

    assert R.problem_dims(SimpleNamespace(B=2, H=3, S=64)) == (2, 3, 3, 64, 128, True)
    p = Problem(2, 32, 1024, Hkv=8, D=64, causal=False)
    assert R.problem_dims(p) == (2, 32, 8, 1024, 64, False)
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

    assert R.kernel_unsupported(Problem(4, 32, 4096)) is None
    assert R.kernel_unsupported(SimpleNamespace(B=1, H=1, S=128)) is None
    assert R.kernel_unsupported(Problem(1, 32, 4096, Hkv=8)) is None  # GQA: a run-time argument
    assert R.kernel_unsupported(Problem(1, 32, 4096, Hkv=1)) is None  # MQA
    assert R.kernel_unsupported(Problem(1, 32, 4096, causal=False), causal=False) is None
    for p, kw, needle in ((Problem(1, 32, 4096, D=64), {}, "D=64"),
                          (Problem(1, 32, 4096, causal=False), {}, "non-causal"),
                          (Problem(1, 32, 4096), {"causal": False}, "got causal")):
        why = R.kernel_unsupported(p, **kw)
        assert why is not None and "this kernel library runs D 128" in why and needle in why


@pytest.mark.parametrize("kw", [dict(D=64), dict(D=256), dict(causal=False)])
def test_kernel_module_refuses_problems_it_cannot_run(fake_so: Path, kw: dict) -> None:
    from tuner.problem import Problem

    km = R.KernelModule(fake_so)
    last = km._lib.fake_last
    last.restype = ctypes.c_longlong
    last.argtypes = [ctypes.c_int]
    km.forward(_bufs(SimpleNamespace(B=1, H=1, S=128)), None)  # a launch it can run
    p = Problem(3, 4, 256, **kw)
    with pytest.raises(R.KernelError, match=r"runs D 128, causal problems") as ei:
        km.forward(_bufs(p), None)  # type: ignore[arg-type]
    assert "\n" not in str(ei.value)
    assert last(5) == 1  # refused before launching: the stand-in still holds the last call
    with pytest.raises(R.KernelError, match="runs D 128"):
        km.prepare(p, None)


def test_kernel_module_passes_gqa_through(fake_so: Path) -> None:
    from tuner.problem import Problem

    km = R.KernelModule(fake_so)
    last = km._lib.fake_last
    last.restype = ctypes.c_longlong
    last.argtypes = [ctypes.c_int]
    km.forward(_bufs(Problem(1, 32, 256, Hkv=8)), None)  # type: ignore[arg-type]
    assert [last(5), last(6), last(9), last(7)] == [1, 32, 8, 256]


# ---- varlen entry points ----------------------------------------------------------------------
def _fake_variant(tmp_path: Path, varlen: int) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    out = tmp_path / f"fake_varlen{varlen}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", '-DFAKE_WRITE_LSE="true"',
                    f"-DFAKE_VARLEN={varlen}", "-o", str(out), str(DATA / "fake_kernel_abi.c")],
                   check=True)
    return out


def test_kernel_module_binds_varlen(fake_so: Path) -> None:
    km = R.KernelModule(fake_so)
    assert km.varlen is True and km.has_varlen is True
    assert km.varlen_workspace_bytes(3, 32, 5000, 4096) == 3 * 1000 + 32 * 100 + 4096
    assert km.varlen_workspace_bytes(0, 32, 5000, 4096) == 0  # invalid arguments: 0
    km.forward_varlen(0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 3, 5000, 4096, 32, 8,
                      0xABC, softmax_scale=0.125, workspace=0x7000, workspace_bytes=11296)
    last = km._lib.fake_varlen
    last.restype = ctypes.c_longlong
    last.argtypes = [ctypes.c_int]
    got = [last(i) for i in range(15)]
    assert got[:8] == [0x1000, 0x2000, 0x3000, 0x4000, 0x5000, 0x6000, 0x7000, 0xABC]
    assert got[8:] == [3, 5000, 4096, 32, 8, 125, 11296]
    # No LSE, the library's own workspace (NULL, 0 bytes), the legacy stream.
    km.forward_varlen(0x1000, 0x2000, 0x3000, 0x4000, None, 0x6000, 1, 10, 10, 4, 4, None,
                      workspace_bytes=99)
    assert [last(4), last(6), last(7), last(14), last(13)] == [0, 0, 0, 0, 0]
    with pytest.raises(R.KernelError) as ei:
        km.forward_varlen(1, 2, 3, 4, 5, 6, 0, 10, 10, 4, 4, None)
    msg = str(ei.value)
    assert msg.startswith("fa_tune_forward_varlen(num_seqs=0, total_tokens=10, max_seqlen=10, "
                          "Hq=4, Hkv=4) failed with cudaErrorInvalidValue (1): num_seqs must be "
                          "positive") and "\n" not in msg and ei.value.code == 1


def test_kernel_module_without_varlen(tmp_path: Path) -> None:
    old = R.KernelModule(_fake_variant(tmp_path, 0))  # a library from before varlen
    assert old.varlen is False and old.has_varlen is False
    old.forward(_bufs(SimpleNamespace(B=1, H=1, S=128)), None)  # fixed length still runs
    for call in (lambda: old.varlen_workspace_bytes(1, 1, 1, 1),
                 lambda: old.forward_varlen(1, 2, 3, 4, 5, 6, 1, 10, 10, 4, 4, None)):
        with pytest.raises(R.KernelError, match="predates the varlen entry points") as ei:
            call()
        assert ei.value.code == 801 and "\n" not in str(ei.value)
    mc = R.KernelModule(_fake_variant(tmp_path, 2))  # the functions, not the kernel
    assert mc.varlen is False and mc.has_varlen is False
    with pytest.raises(R.KernelError, match=r"cudaErrorNotSupported \(801\): built without "
                                            "the varlen kernel"):
        mc.forward_varlen(1, 2, 3, 4, 5, 6, 1, 10, 10, 4, 4, None)
