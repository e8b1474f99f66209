"""The GPUs the CUDA driver sees (through cuda-python), without opening a context: what the
doctor reports and what ``search --gpus all`` spreads over. Never raises."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuInfo:
    index: int
    name: str
    cc: tuple[int, int]
    sm_count: int


@dataclass
class GpuProbe:
    driver_version: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    error: str | None = None

    @property
    def sm90(self) -> list[GpuInfo]:
        return [g for g in self.gpus if g.cc == (9, 0)]


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200] or type(e).__name__


def probe_gpus() -> GpuProbe:
    """GPUs seen by the CUDA driver API through cuda-python; never raises."""
    probe = GpuProbe()
    try:
        from cuda.bindings import driver
    except Exception as e:  # cuda-python missing or broken
        probe.error = f"cuda-python not importable: {one_line(e)}"
        return probe
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            probe.error = f"cuInit failed: {err.name}"
            return probe
        err, ver = driver.cuDriverGetVersion()
        probe.driver_version = f"{ver // 1000}.{(ver % 1000) // 10}"
        err, n = driver.cuDeviceGetCount()
        attr = driver.CUdevice_attribute
        for i in range(n if err == driver.CUresult.CUDA_SUCCESS else 0):
            _, dev = driver.cuDeviceGet(i)
            _, raw = driver.cuDeviceGetName(256, dev)
            _, major = driver.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev
            )
            _, minor = driver.cuDeviceGetAttribute(
                attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev
            )
            _, sms = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
            name = raw.split(b"\0", 1)[0].decode(errors="replace")
            probe.gpus.append(GpuInfo(i, name, (int(major), int(minor)), int(sms)))
    except Exception as e:  # no libcuda.so, or a driver too old for these bindings
        if "NotFound" in type(e).__name__:
            probe.error = "libcuda.so not found (no NVIDIA driver installed)"
        else:
            probe.error = one_line(e)
    return probe


def has_sm90_gpu() -> bool:
    try:
        return bool(probe_gpus().sm90)
    except Exception:
        return False
