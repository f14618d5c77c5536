#!/usr/bin/env bash
# The prepared GPU check (ijepa.benchmark.gpu_check): every GPU figure in one command of at most
# 8 minutes on one H100 or H200, written as it goes into OUT_DIR (results.jsonl, check.log,
# summary.md); docs/benchmarks.md says how to read them.
#   scripts/gpu_check.sh OUT_DIR              on a GPU machine, from a clone (no install needed)
#   scripts/gpu_check.sh --dry-run OUT_DIR    the same code paths on the CPU at toy sizes
# Further options go to `python -m ijepa.benchmark.gpu_check` (--parts, --budget-s, --work-dir).
# Where scripts/gpu_wheels.sh left a wheelhouse (IJEPA_GPU_DIR, default .gpu), its wheels are
# installed first, offline, into a folder put first on PYTHONPATH, and its Fashion-MNIST folder
# is the learning curve's data.
set -uo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
dir="${IJEPA_GPU_DIR:-.gpu}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this clone's ijepa, installed or not
if compgen -G "$dir/wheels/*.whl" >/dev/null; then
  site="${TMPDIR:-/tmp}/ijepa-gpu-site"
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    "$dir"/wheels/*.whl || { echo "gpu_check: installing $dir/wheels failed" >&2; exit 1; }
  export PYTHONPATH="$site:$PYTHONPATH" IJEPA_WHEELHOUSE_SITE="$site"
fi
data=()
if [ -d "$dir/fashion/train" ]; then
  data=(--fashion "$dir/fashion")
fi
exec "$python" -m ijepa.benchmark.gpu_check "${data[@]}" "$@"
