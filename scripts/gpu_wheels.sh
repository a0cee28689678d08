#!/usr/bin/env bash
# The wheels scripts/gpu_benchmark.sh needs on a CUDA machine whose Python already holds torch, numpy, scipy,
# safetensors, pyyaml, tqdm, pillow and matplotlib but cannot reach PyPI: downloaded here into .whl/ (the
# versions CI tests, for CPython 3.12 on x86-64 Linux; pure-Python wheels, about 3 MB), carried there.
#   bash scripts/gpu_wheels.sh [python-version]
set -euo pipefail
cd "$(dirname "$0")/.."
python_version=${1:-3.12}
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .whl \
  hydra-core==1.3.8 omegaconf==2.3.1 spandrel==0.4.2 webdataset==1.0.2 braceexpand==0.1.7 lpips==0.1.4
# omegaconf's parser runtime is published as a source archive only: built here into a pure-Python wheel
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
du -sh .whl
