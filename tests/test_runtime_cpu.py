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
    km.forward(_bufs(shape), None, write_lse=True)
    assert last(4) == 0x5000 and last(8) == 0


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
    with pytest.raises(FaTuneError, match="does not export fa_tune_forward"):
        R.KernelModule(so)
    bad = tmp_path / "garbage.so"
    bad.write_text("not an ELF file")
    with pytest.raises(FaTuneError, match="cannot load"):
        R.KernelModule(bad)
