"""Launch one kernel, or two, once each, for Nsight Compute.

``python -m tuner.analysis.profile_driver KERNEL_SO PROBLEM [--vs KERNEL_SO2 | --vs fa3]``

PROBLEM is the text form of a tuner.problem.Problem (``4x32x8192``; ``B H S`` as three
arguments, the form before problems, still works). ``--vs`` adds a second kernel on the same
problem and inputs: another fa-tune library, or FlashAttention-3 (tuner/measure/peers/fa3.py,
through the measurement path's PeerLaunch).

The measurement path's own pieces (tuner.measure): the gate's seed inputs in the bench's
buffers, each kernel's one-time setup (``fa_tune_prepare``; FA3's JIT compile and first call)
first, then ONE launch of each kernel in order, each synchronised, inside a
cuProfilerStart/Stop range. ``fa-tune profile`` runs this under ``ncu --profile-from-start off
--launch-count N --kernel-name regex:...``: the setup launches stay outside the report, and
ncu's result IDs 0, 1 follow the launch order (two launches of ``attention_fwd_kernel`` are
told apart by it).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

USAGE = ("usage: python -m tuner.analysis.profile_driver KERNEL_SO "
         "BxHq[/Hkv]xS[:kSK][:dD][:full][:qkv|:bhsd] [--vs KERNEL_SO2 | --vs fa3]\n")


def parse_args(args: list[str]) -> tuple[str, str, str | None] | None:
    """(kernel .so, problem text, --vs target or None); None when the usage is wrong."""
    vs = None
    if "--vs" in args:
        i = args.index("--vs")
        if i + 1 >= len(args):
            return None
        vs, args = args[i + 1], args[:i] + args[i + 2:]
    if len(args) == 2:
        return args[0], args[1], vs
    if len(args) == 4:
        return args[0], "x".join(args[1:]), vs
    return None


def make_launches(so: str, vs: str | None) -> list[Any]:
    """The launchables in launch (= ncu ID) order: the kernel, then the one it is compared with."""
    from tuner.errors import FaTuneError
    from tuner.measure.launch import KernelLaunch, PeerLaunch

    launches: list[Any] = [KernelLaunch(so, label="kernel")]
    if vs == "fa3":
        from tuner.measure.peers import make_peer

        peer = make_peer("fa3")
        ok, why = peer.available()
        if not ok:
            raise FaTuneError(f"FlashAttention-3 cannot run here: {why}")
        launches.append(PeerLaunch(peer))
    elif vs is not None:
        launches.append(KernelLaunch(vs, label="vs"))
    return launches


@contextmanager
def profiled_range() -> Iterator[None]:
    """cuProfilerStart .. cuProfilerStop: what ncu --profile-from-start off profiles."""
    from cuda.bindings import driver as drv

    from tuner.errors import GpuError

    if drv.cuProfilerStart()[0] != drv.CUresult.CUDA_SUCCESS:
        raise GpuError("cuProfilerStart failed")
    try:
        yield
    finally:
        drv.cuProfilerStop()


def main(argv: list[str] | None = None) -> int:
    from tuner.errors import FaTuneError
    from tuner.kernel.support import check_runnable
    from tuner.measure.launch import launch_supports
    from tuner.problem import Problem

    parsed = parse_args(sys.argv[1:] if argv is None else list(argv))
    if parsed is None:
        sys.stderr.write(USAGE)
        return 2
    so, text, vs = parsed
    bench = None
    try:
        shape = Problem.parse(text)
        check_runnable([shape])  # before opening a GPU
        from tuner.measure.bench import Bench

        bench = Bench(0)
        launches = make_launches(so, vs)
        for launch in launches:
            why = launch_supports(launch, shape)
            if why:
                raise FaTuneError(f"{launch.label} cannot run {shape}: {why}")
        bufs = bench.load_inputs(shape)
        for launch in launches:  # one-time work outside the profiled range
            launch.prepare(shape, bench.stream)
            if hasattr(launch, "bind"):
                launch.bind(bufs, bench.stream)  # a peer's JIT compile and first call
        bench.stream.synchronize()
        with profiled_range():
            for launch in launches:
                launch.forward(bufs, bench.stream)
                bench.stream.synchronize()  # one at a time, in this order
    except FaTuneError as e:
        sys.stderr.write(f"profile_driver: error: {e}\n")
        return 2
    except Exception as e:  # a peer's failure (torch, JIT): one line for fa-tune to print
        msg = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        sys.stderr.write(f"profile_driver: error: {msg}\n")
        return 2
    finally:
        if bench is not None:
            bench.close()
    print(f"launched {', '.join(launch.label for launch in launches)} on {shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
