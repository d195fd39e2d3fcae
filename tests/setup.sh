#!/bin/sh
# Installs what the tests need: a virtual environment with Patroller and pytest, and, for the
# identity tests, a Docker Engine and busybox (the tests start their own private dockerd and
# import a busybox image: no registry, no system Docker service), and for the monitoring
# tests a Prometheus server and promtool (the tests start their own Prometheus: no service), and
# for the web page's tests a headless browser: Debian's chromium and chromium-driver (Selenium,
# from the test extra, drives /usr/bin/chromedriver, whose version is the browser's: nothing is
# downloaded), and for the systemd unit's test systemd-analyze (Debian's systemd).
set -eu
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
if command -v dockerd >/dev/null 2>&1 && command -v busybox >/dev/null 2>&1 \
        && command -v wrk >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 \
        && command -v promtool >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 \
        && command -v chromedriver >/dev/null 2>&1 \
        && command -v systemd-analyze >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # No service may start while installing (prometheus's package would start its daemon):
    # a policy-rc.d that refuses every start, unless the system already has one of its own.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        trap 'rm -f "$policy"' EXIT
        printf '#!/bin/sh\n# tests/setup.sh: no service starts while it installs\nexit 101\n' \
            >"$policy"
        chmod 755 "$policy"
    fi
    # systemd-analyze checks the unit in contrib/systemd; systemd is only installed where it is
    # missing (never upgraded under a running system).
    systemd=""
    command -v systemd-analyze >/dev/null 2>&1 || systemd=systemd
    . tests/apt-wait.sh
    wait_for_apt
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    wait_for_apt
    # wrk is the benchmark's load generator (python -m bench), not the tests'.
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends \
        docker.io busybox-static wrk prometheus chromium chromium-driver $systemd >/dev/null
    # Should a service have started anyway (an init system that ignores policy-rc.d), stop it:
    # the tests start their own Prometheus on a port of their choosing.
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    elif [ -x /etc/init.d/prometheus ]; then
        /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    fi
else
    echo "tests/setup.sh: dockerd, busybox, prometheus or chromium is missing; install" \
         "docker.io, busybox-static, prometheus, chromium and chromium-driver (as root) or the" \
         "Docker, Prometheus and web page tests will be skipped" >&2
fi
