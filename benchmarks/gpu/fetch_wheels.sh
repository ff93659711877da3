#!/usr/bin/env bash
# Download, on a machine that reaches the package registry, the wheels that the
# GPU machine lacks (it has torch, transformers, PyYAML, rich, matplotlib,
# tensorboard, sortedcontainers, safetensors, pytest and pytest-timeout, but not
# pydantic or pytest-asyncio, and it reaches no registry). They land in .whl/
# (ignored by git) for run_on_device.sh to install. The versions are the dev
# install's. Usage: benchmarks/gpu/fetch_wheels.sh [python-version, default 3.12]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
PYVER=${1:-3.12}
DEST=${WHEELS:-.whl}
mkdir -p "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing-extensions==4.16.0 pytest-asyncio==1.5.0
ls "$DEST"
