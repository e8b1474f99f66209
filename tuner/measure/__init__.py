"""The one measurement path: inputs, the correctness gate, the timing protocol, GPU state.

Every command that puts a number on a kernel (run, the search's worker, compare, export
timing, profile's launcher, the lab scripts) goes through this package:

* ``oracle``: input sets generated on the GPU, poisoning, the FP32 reference and the gate;
* ``timing``: the protocol (warm-up, rounds, settle, temperature wait), the one timing loop,
  and NVML GPU-state snapshots;
* ``bench``: a session on one device that gates and times any launchable (fa-tune's kernel
  through its C ABI, or a peer such as FlashAttention-3) on the same buffers and inputs.
"""
