#!/usr/bin/env bash
# The GPU suite's Python packages for a bare GPU machine whose image has torch (CUDA), transformers, safetensors,
# tokenizers, numpy, pyarrow and pandas but not the pinned torchtune stack (DESIGN.md §4) nor this project.
#
#   bash benchmarks/gpu_setup.sh download   # where pip reaches a registry: wheels into .whl/ (about 50 MB)
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
# The transformers engine (bench_engines' engines_job, the GPU reference job per engine): transformers 5 with TRL,
# PEFT and accelerate, and everything they import beyond torch / numpy / pyarrow / pandas / safetensors, at the
# versions `make setup` tests here (installed first on the path, they stand in front of the image's own).
ENGINE_PACKAGES=(
  transformers==5.25.0 trl==1.16.0 peft==0.18.1 accelerate==1.16.0 huggingface-hub==2.4.0 tokenizers==0.23.3
  hf-xet==1.8.0 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0 anyio==4.16.0 idna==3.20 typer==0.29.2 click==8.5.1
  shellingham==1.5.4 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0 annotated-doc==0.0.7
  filelock==4.3.2 fsspec==2026.9.0 packaging==26.4 pyyaml==6.0.4 regex==2026.11.19 tqdm==4.70.1 psutil==7.2.2
  jinja2==3.1.6 markupsafe==3.0.4 kernels==0.19.1 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 typing-extensions==4.16.0 tomlkit==0.15.3 truststore==0.10.5 xxhash==4.1.0
)
case "${1:-}" in
  download)
    mkdir -p "$WHEELS"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" "${PACKAGES[@]}" "${ENGINE_PACKAGES[@]}"
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
