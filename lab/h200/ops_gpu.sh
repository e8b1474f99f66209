# Issue 15 on the H200 (carry [".whl", ".hfwhl"]): the op tests (fixed and varlen), a llama3-8b
# workload export (default preset: every bucket has the varlen kernel) and the Llama prefill,
# fixed 8192 tokens and a packed batch of the same size.
set -u
mkdir -p .device/site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .device/site .whl/*.whl
python3 -m pip install -q --no-index --find-links .hfwhl transformers > $OUT/hf_install.log 2>&1; tail -2 $OUT/hf_install.log
E="bash lab/h200/gpu_session.sh env --"
timeout 200 $E python3 -m pytest -q -s -m gpu tests/gpu/test_workload_ops_gpu.py tests/gpu/test_varlen_op_gpu.py -p no:cacheprovider > $OUT/ops_gpu.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|overhead|us|µs" $OUT/ops_gpu.log | tail -15
timeout 100 $E python3 -m tuner.cli export --workload llama3-8b --default preset:default --out /tmp/l8b --jobs 16 > $OUT/export.log 2>&1; echo "export rc $?"; tail -3 $OUT/export.log
timeout 150 $E python3 scripts/llama_prefill.py --export /tmp/l8b --packed '4096,2048,1024*2' --json $OUT/llama_prefill.json > $OUT/llama.log 2>&1; echo "llama rc $?"; tail -20 $OUT/llama.log
