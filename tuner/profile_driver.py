"""Launch one tuned kernel once, for Nsight Compute: ``python -m tuner.profile_driver SO B H S``.

Loads the ``.so`` through its C ABI, fills the gate's seed inputs (the oracle's generator), runs
``fa_tune_prepare`` and ONE ``fa_tune_forward``, synchronises. ``fa-tune profile`` runs this
under ``ncu --launch-count 1 --kernel-name regex:attention_fwd_kernel``.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from tuner import runtime
    from tuner.config import Shape
    from tuner.errors import FaTuneError
    from tuner.measure import oracle

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        sys.stderr.write("usage: python -m tuner.profile_driver KERNEL_SO B H S\n")
        return 2
    try:
        shape = Shape(int(args[1]), int(args[2]), int(args[3]))
        dev = runtime.Device.open(0)
        kernel = runtime.KernelModule(args[0])
        orc = oracle.get_oracle()
        with runtime.AttnBuffers(dev, shape) as bufs:
            st = dev.stream()
            oracle.fill_inputs(orc, bufs, "seed", oracle.DEFAULT_SEED, st)
            kernel.prepare(shape, st)
            kernel.forward(bufs, st)
            st.synchronize()
            st.destroy()
    except FaTuneError as e:
        sys.stderr.write(f"profile_driver: error: {e}\n")
        return 2
    print(f"launched {args[0]} on {shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
