#!/bin/sh
# Wheels of Patroller's packages for the GPU check (scripts/gpu-check.sh), made here, where a
# package registry can be reached, for a GPU host that has none: x86-64 Linux, Python 3.12 by
# default (PY=3.11 sh scripts/wheelhouse.sh for another). Binary wheels only, into ./wheelhouse
# (ignored by git); carry the checkout with it to the GPU host.
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-3.12}
python3 -m pip download --only-binary=:all: --python-version "$PY" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --implementation cp \
    -d wheelhouse -r requirements.txt grpcio  # grpcio: containerd and the kubelet, optional
