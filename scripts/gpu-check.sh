#!/bin/sh
# The real-GPU check, ready to run on a host with an NVIDIA GPU, as root, with no network:
#   sh scripts/gpu-check.sh [--out DIR] [python -m bench.gpucheck options]
# It needs Python 3.10 or later and Patroller's packages. Where ./wheelhouse holds the wheels
# (made beforehand, on a machine with a package registry, by scripts/wheelhouse.sh), it makes
# a virtual environment from them alone (pip --no-index); else it uses the Python that has
# them already ($PYTHON, default python3). Everything it writes goes to $OUT, --out or
# ./gpucheck-<time>: the captures, the doctor's answer, the daemon's log, result.json.
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ -d wheelhouse ]; then
    if [ ! -x .gpucheck-venv/bin/python ]; then
        "$PYTHON" -m venv .gpucheck-venv
        .gpucheck-venv/bin/pip install --quiet --no-index --find-links wheelhouse \
            -r requirements.txt
        if ls wheelhouse/grpcio-* >/dev/null 2>&1; then  # optional: containerd, the kubelet
            .gpucheck-venv/bin/pip install --quiet --no-index --find-links wheelhouse grpcio
        fi
    fi
    PYTHON=.gpucheck-venv/bin/python
fi
exec "$PYTHON" -m bench.gpucheck "$@"
