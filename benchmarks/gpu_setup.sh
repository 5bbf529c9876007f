#!/usr/bin/env bash
# The GPU suite's Python packages for a bare GPU machine whose image has torch (CUDA), transformers, safetensors,
# tokenizers, numpy, pyarrow and pandas but not the pinned torchtune stack (DESIGN.md §4) nor this project.
#
#   bash benchmarks/gpu_setup.sh download   # where pip reaches a registry: wheels into .whl/ (about 10 MB)
#   bash benchmarks/gpu_setup.sh install    # on the GPU machine, from .whl/ alone: into /tmp/site
#   cd /tmp && PYTHONPATH=/tmp/site:<repo> python3 -m benchmarks.bench_gpu_suite --smoke --output <folder>
#     (run outside the repo: its kfp_finetune/ folder would hide the installed package's components)
#
# Wheels are fetched for the GPU machine's Python (GPU_PYTHON, default 3.12) without their dependencies: only what
# the image lacks travels, and the image's torch is never replaced. blobfile and kagglehub are imported by
# torchtune's CLI and tokenizer modules; lxml and pycryptodomex are blobfile's, kagglesdk is kagglehub's
# (protobuf, its one dependency beyond requests, is in the image).
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.whl
SITE=${GPU_SITE:-/tmp/site}
PACKAGES=(
  torchtune==0.6.1 torchao==0.15.0 torchdata==0.11.0 omegaconf==2.4.0
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 blobfile==3.3.0 kagglehub==1.0.3 kagglesdk==0.1.38 pycryptodomex==3.24.2
  lxml==6.1.3
)
case "${1:-}" in
  download)
    mkdir -p "$WHEELS"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" "${PACKAGES[@]}"
    rm -f "$WHEELS"/kfp_finetune-*.whl
    python3 -m pip wheel --quiet --no-deps -w "$WHEELS" .
    ls "$WHEELS"
    ;;
  install)
    python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/*.whl
    echo "installed into $SITE: cd /tmp && PYTHONPATH=$SITE:$PWD python3 -m benchmarks.bench_gpu_suite ..."
    ;;
  *)
    echo "usage: bash benchmarks/gpu_setup.sh download|install" >&2
    exit 2
    ;;
esac
