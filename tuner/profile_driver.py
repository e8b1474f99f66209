"""Launch one tuned kernel once, for Nsight Compute: ``python -m tuner.profile_driver SO PROBLEM``.

PROBLEM is the text form of a tuner.problem.Problem (``4x32x8192``; ``B H S`` as three
arguments, the form before problems, still works).

The measurement path's own pieces (tuner.measure): the kernel through its C ABI, the gate's
seed inputs in the bench's buffers, ``fa_tune_prepare`` and ONE ``fa_tune_forward``,
synchronised. ``fa-tune profile`` runs this under ``ncu --launch-count 1
--kernel-name regex:attention_fwd_kernel``.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from tuner.config import KernelConfig, check_problem
    from tuner.errors import FaTuneError
    from tuner.measure.bench import Bench
    from tuner.measure.launch import KernelLaunch
    from tuner.problem import Problem

    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 4):
        sys.stderr.write("usage: python -m tuner.profile_driver KERNEL_SO "
                         "BxHq[/Hkv]xS[:dD][:full]\n")
        return 2
    try:
        shape = Problem.parse(args[1] if len(args) == 2 else "x".join(args[1:]))
        check_problem(KernelConfig(), shape)
        bench = Bench(0)
        kernel = KernelLaunch(args[0])
        bufs = bench.load_inputs(shape)
        kernel.prepare(shape, bench.stream)
        kernel.forward(bufs, bench.stream)
        bench.stream.synchronize()
        bench.close()
    except FaTuneError as e:
        sys.stderr.write(f"profile_driver: error: {e}\n")
        return 2
    print(f"launched {args[0]} on {shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
