"""Shipping: what leaves fa-tune for an inference stack.

* ``export``: the standalone package (source, C ABI, build.sh, prebuilt library, results);
* ``workload``: workload files and their plan (problems per length bucket);
* ``dispatch``: the dispatch table and the generated dispatcher;
* ``fa_tune_ops``: the PyTorch op and transformers backend an export copies verbatim.
"""
