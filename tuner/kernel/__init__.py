"""The kernel toolchain: what a kernel is and how it becomes a loaded library.

* ``config``: ``KernelConfig`` (every knob), presets, the static validity check;
* ``support``: can this config (default: the preset) run this problem (one answer for all);
* ``build``: template rendering, the content-addressed cache, nvcc, the SASS check;
* ``runtime``: the cuda-python host runtime (device, memory, streams, ``AttnBuffers``);
* ``gpus``: the GPUs the driver sees (doctor, ``search --gpus all``);
* ``kernel_module`` / ``oracle_module``: the ctypes bindings of the kernel's and the oracle's
  C ABIs.

Nothing here measures, searches or ships; the layers above import this one, never the reverse.
"""
