set -u
mkdir -p .device/site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target .device/site .whl/*.whl
python3 -m pip install -q --no-index --find-links .hfwhl transformers > $OUT/hf_install.log 2>&1; tail -2 $OUT/hf_install.log
E="bash lab/h200/gpu_session.sh env --"
timeout 170 $E python3 -m pytest -q -s -m gpu tests/gpu/test_workload_ops_gpu.py -p no:cacheprovider > $OUT/ops_gpu.log 2>&1; echo "pytest rc $?"
grep -E "passed|failed|FAILED|overhead|us|µs" $OUT/ops_gpu.log | tail -15
timeout 100 $E python3 -m tuner.cli export --workload llama3-8b --default preset:multicast --out /tmp/l8b --jobs 16 > $OUT/export.log 2>&1; echo "export rc $?"; tail -3 $OUT/export.log
timeout 90 $E python3 scripts/llama_prefill.py --export /tmp/l8b --json $OUT/llama_prefill.json > $OUT/llama.log 2>&1; echo "llama rc $?"; tail -12 $OUT/llama.log
