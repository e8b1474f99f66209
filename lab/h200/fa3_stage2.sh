#!/usr/bin/env bash
# FA3 install, call 2 of 2 (GPU host, no network). Run from the repo root with carry [".fa3/part2"],
# on the same warm machine as lab/h200/fa3_stage1.sh. Joins the split nvidia-cutlass-dsl-libs-cu13
# wheel, checks its SHA-256, installs every wheel with --no-deps into .device/fa3site of the
# repository copy (git-ignored; the host already has torch, cuda-bindings, einops, protobuf,
# typing-extensions) and checks the import. Afterwards, in the same or a later call on this
# machine (lab/h200/gpu_session.sh env -- sets it for you):
#   export PYTHONPATH=$PWD/.device/fa3site:$PWD/.device/fa3site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
# (--target skips .pth files, so the dsl_packages path the package's .pth would add is set by hand.)
# If this call also carries .whl (fa-tune's own wheels), those go to .device/site as well.
set -euo pipefail
REPO=$(pwd)
SRC=.fa3/part2
DEV=${FA_TUNE_DEVICE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.device}
STAGE=${FA3_STAGE:-$DEV/fa3_stage}
SITE=${FA3_SITE:-$DEV/fa3site}
mkdir -p "$SITE" && SITE=$(cd "$SITE" && pwd)  # absolute: the install runs from $STAGE
[ -d "$SRC" ] || { echo "fa3_stage2: $SRC missing: carry it ([\".fa3/part2\"])" >&2; exit 2; }
# A rerun on the same machine finds the halves already joined; that is fine.
compgen -G "$STAGE/*.partaa" >/dev/null || compgen -G "$STAGE/nvidia_cutlass_dsl_libs_cu13-*.whl" >/dev/null || {
  echo "fa3_stage2: no first half in $STAGE: run lab/h200/fa3_stage1.sh on this same machine first" >&2; exit 2; }
cp -f "$SRC"/* "$STAGE"/
cd "$STAGE"
for first in *.whl.partaa; do
  [ -e "$first" ] || continue
  whl=${first%.partaa}
  cat "$whl".partaa "$whl".partab > "$whl"
  rm -f "$whl".partaa "$whl".partab
done
sha256sum -c cu13.sha256
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --root-user-action=ignore --target "$SITE" ./*.whl
export PYTHONPATH="$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}"
echo "fa3_stage2: installed into $SITE ($(du -sh "$SITE" | cut -f1))"
cd "$REPO"
# Optional: fa-tune's own wheels (optuna, sqlalchemy, nvidia-cutlass, ...) when this call also
# carries .whl (part2 + .whl is ~60 MiB: fits the 64 MiB limit while the tree stays small).
WHL_SITE=${WHL_SITE:-$DEV/site}
# Not again when call 1 installed them: a reinstall under a background compile removes the
# CUTLASS headers it is reading (2026-12-01 s7).
if compgen -G ".whl/*.whl" >/dev/null && [ ! -d "$WHL_SITE/optuna" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --root-user-action=ignore --target "$WHL_SITE" .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:$WHL_SITE"
  python3 -c "import optuna, sqlalchemy; print('fa3_stage2: .whl ok: optuna', optuna.__version__)"
  echo "export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$WHL_SITE:\$PYTHONPATH"
else
  echo "export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:\$PYTHONPATH"
fi
python3 - <<'PY'
import importlib.metadata as md
import cutlass  # noqa: F401  (loads the cu13 MLIR bindings; needs the driver)
from flash_attn.cute.interface import flash_attn_func  # noqa: F401
print("fa3_stage2: import ok:", ", ".join(
    f"{n} {md.version(n)}" for n in ("flash-attn-4", "nvidia-cutlass-dsl", "quack-kernels",
                                      "apache-tvm-ffi", "torch-c-dlpack-ext", "torch")))
PY
if [ "${FA3_SMOKE:-1}" = 1 ]; then
python3 - <<'PY'
# One tiny causal call: proves the JIT (CuTe DSL -> cubin) path works on this host.
import time, torch
from flash_attn.cute.interface import flash_attn_func
q, k, v = (torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
t = time.perf_counter()
out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
torch.cuda.synchronize()
ref = torch.nn.functional.scaled_dot_product_attention(
    q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float(), is_causal=True
).transpose(1, 2)
err = (out.float() - ref).abs().max().item()
print(f"fa3_stage2: smoke ok: first call {time.perf_counter() - t:.1f} s (JIT), max|err| {err:.4f},"
      f" lse {tuple(lse.shape)}")
PY
fi
