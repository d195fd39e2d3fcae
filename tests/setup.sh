#!/bin/sh
# Installs what the tests need: a virtual environment with Patroller and pytest, and, for the
# identity tests, a Docker Engine and busybox (the tests start their own private dockerd and
# import a busybox image: no registry, no system Docker service).
set -eu
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
if command -v dockerd >/dev/null 2>&1 && command -v busybox >/dev/null 2>&1 \
        && command -v wrk >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    # wrk is the benchmark's load generator (python -m bench), not the tests'.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker.io busybox-static wrk >/dev/null
else
    echo "tests/setup.sh: dockerd and busybox are missing; install docker.io and busybox-static" \
         "(as root) or the Docker tests will be skipped" >&2
fi
