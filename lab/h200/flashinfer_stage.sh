#!/usr/bin/env bash
# FlashInfer install on the GPU host (no network), one call: run from the repo root with carry
# [".fi"] (~18 MB beside the ~22 MB repo: under the 64 MiB a call carries). Installs
# flashinfer-python with --no-deps into .device/fisite of the repository copy (git-ignored: the
# host keeps it between calls), and of its pure dependencies only those the host (with FA3's
# .device/fa3site, when there) cannot import yet, so no copy of ours shadows one of the host's.
# The `ninja` executable FlashInfer's JIT runs lands in .device/fisite/bin. Afterwards
# (lab/h200/gpu_session.sh env -- sets them for you):
#   export PYTHONPATH=$PWD/.device/fisite:$PYTHONPATH PATH=$PWD/.device/fisite/bin:$PATH
#   export FLASHINFER_WORKSPACE_BASE=$PWD/.device   (its JIT cache: .device/.cache/flashinfer)
# FI_SMOKE=1 also builds the D 128 BF16 batch prefill module (nvcc, minutes) and checks one
# paged call against SDPA; the build stays in the JIT cache for the session's later calls.
set -euo pipefail
SRC=.fi
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.device}
SITE=${FI_SITE:-$DEV/fisite}
FA3=$DEV/fa3site
[ -d "$SRC" ] || { echo "flashinfer_stage: $SRC missing: carry it ([\".fi\"])" >&2; exit 2; }
(cd "$SRC" && sha256sum -c --quiet SHA256SUMS)
mkdir -p "$SITE" && SITE=$(cd "$SITE" && pwd)
export PYTHONPATH="$FA3:$FA3/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"

# wheel file prefix -> the module it provides: installed only when the host lacks the module
declare -A MOD=([apache_tvm_ffi]=tvm_ffi [requests]=requests [urllib3]=urllib3 [idna]=idna
                [certifi]=certifi [packaging]=packaging [tqdm]=tqdm [nvidia_ml_py]=pynvml)
wheels=("$SRC"/flashinfer_python-*.whl)
for prefix in "${!MOD[@]}"; do
  if ! python3 -c "import ${MOD[$prefix]}" 2>/dev/null; then
    wheels+=("$SRC/$prefix"-*.whl)
  fi
done
command -v ninja >/dev/null || wheels+=("$SRC"/ninja-*.whl)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --root-user-action=ignore --target "$SITE" "${wheels[@]}"
echo "flashinfer_stage: installed $(printf '%s\n' "${wheels[@]}" | xargs -n1 basename | \
  sed 's/-py3.*//; s/-cp3.*//' | tr '\n' ' ')into $SITE ($(du -sh "$SITE" | cut -f1))"
export PYTHONPATH="$SITE:$PYTHONPATH" PATH="$SITE/bin:$PATH" FLASHINFER_WORKSPACE_BASE="$DEV"
echo "export PYTHONPATH=$SITE:\$PYTHONPATH PATH=$SITE/bin:\$PATH FLASHINFER_WORKSPACE_BASE=$DEV"
python3 - <<'PY'
import importlib.metadata as md
import shutil

import flashinfer  # noqa: F401

print("flashinfer_stage: import ok: flashinfer-python", md.version("flashinfer-python"),
      "| apache-tvm-ffi", md.version("apache-tvm-ffi"), "| ninja", shutil.which("ninja"))
PY
if [ "${FI_SMOKE:-0}" = 1 ]; then
python3 - <<'PY'
# One paged causal call (D 128, pages of 16, two sequences sharing nothing) against SDPA: proves
# the JIT build (nvcc + ninja) and the paged path on this host.
import time

import torch

import flashinfer

torch.manual_seed(0)
ps, hq, hkv, d, lens = 16, 8, 2, 128, (100, 37)
npages = sum(-(-n // ps) for n in lens)
k = torch.randn(npages, ps, hkv, d, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
q = torch.randn(sum(lens), hq, d, device="cuda", dtype=torch.bfloat16)
indptr = [0, -(-lens[0] // ps), npages]
last = [n - (-(-n // ps) - 1) * ps for n in lens]
i32 = dict(dtype=torch.int32)
w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
    torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")
t = time.perf_counter()
w.plan(torch.tensor([0, lens[0], sum(lens)], **i32), torch.tensor(indptr, **i32),
       torch.arange(npages, **i32), torch.tensor(last, **i32), hq, hkv, d, ps, causal=True,
       q_data_type=torch.bfloat16)
out, lse = w.run(q, (k, v), return_lse=True)
torch.cuda.synchronize()
err = 0.0
for b, n in enumerate(lens):
    kb = k[indptr[b]:indptr[b + 1]].reshape(-1, hkv, d)[:n].repeat_interleave(hq // hkv, 1)
    vb = v[indptr[b]:indptr[b + 1]].reshape(-1, hkv, d)[:n].repeat_interleave(hq // hkv, 1)
    qb = q[sum(lens[:b]):sum(lens[:b + 1])]
    ref = torch.nn.functional.scaled_dot_product_attention(
        qb.transpose(0, 1).float(), kb.transpose(0, 1).float(), vb.transpose(0, 1).float(),
        is_causal=True).transpose(0, 1)
    err = max(err, (out[sum(lens[:b]):sum(lens[:b + 1])].float() - ref).abs().max().item())
print(f"flashinfer_stage: smoke ok: backend {w._backend}, plan + first run "
      f"{time.perf_counter() - t:.0f} s (JIT), max|err| {err:.4f}, lse {tuple(lse.shape)}")
PY
fi
