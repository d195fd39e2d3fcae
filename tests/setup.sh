#!/bin/sh
# Installs what the tests need: a virtual environment with Patroller and pytest, and, for the
# identity tests, a Docker Engine and busybox (the tests start their own private dockerd and
# import a busybox image: no registry, no system Docker service), and for the monitoring
# tests a Prometheus server and promtool (the tests start their own Prometheus: no service), and
# for the web page's tests a headless browser: Debian's chromium and chromium-driver (Selenium,
# from the test extra, drives /usr/bin/chromedriver, whose version is the browser's: nothing is
# downloaded), and for the systemd unit's test systemd-analyze (Debian's systemd), and for the
# Slurm tests Slurm's slurmctld, slurmd and client commands and munge (the tests start their own
# one-node cluster in a temporary directory: no service, nothing under /etc/slurm), and for the
# runtime tests Podman with runc (the tests' containers run on runc: crun refuses cgroup v1) and
# uidmap (rootless Podman's newuidmap), and containerd with ctr (both from docker.io's
# dependencies; the tests start their own containerd and Podman services, a rootful one and a
# throwaway user's rootless one, with no registry).
set -eu
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test]'
if command -v dockerd >/dev/null 2>&1 && command -v busybox >/dev/null 2>&1 \
        && command -v wrk >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 \
        && command -v promtool >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 \
        && command -v chromedriver >/dev/null 2>&1 \
        && command -v systemd-analyze >/dev/null 2>&1 && command -v slurmctld >/dev/null 2>&1 \
        && command -v slurmd >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 \
        && command -v munged >/dev/null 2>&1 && command -v podman >/dev/null 2>&1 \
        && command -v newuidmap >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 \
        && command -v containerd >/dev/null 2>&1 \
        && command -v ctr >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    # No service may start while installing (the prometheus, munge, slurmctld and slurmd
    # packages would start their daemons): a policy-rc.d that refuses every start, unless the
    # system already has one of its own.
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
    fresh=""
    command -v munged >/dev/null 2>&1 || fresh="$fresh munge"
    command -v slurmctld >/dev/null 2>&1 || fresh="$fresh slurmctld"
    command -v slurmd >/dev/null 2>&1 || fresh="$fresh slurmd"
    . tests/apt-wait.sh
    wait_for_apt
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    wait_for_apt
    # wrk is the benchmark's load generator (python -m bench), not the tests'.
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends \
        docker.io busybox-static wrk prometheus chromium chromium-driver \
        slurmctld slurmd slurm-client munge podman runc uidmap containerd zsh fish \
        $systemd >/dev/null
    # Should a service have started anyway (an init system that ignores policy-rc.d), stop it:
    # the tests start their own Prometheus on a port of their choosing, and their own munged,
    # slurmctld and slurmd; those three only where this run installed them (a host that is
    # already a Slurm node keeps its daemons).
    for service in prometheus $fresh; do
        if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
            systemctl disable --now "$service" >/dev/null 2>&1 || true
        elif [ -x "/etc/init.d/$service" ]; then
            "/etc/init.d/$service" stop >/dev/null 2>&1 || true
        fi
    done
else
    echo "tests/setup.sh: dockerd, busybox, prometheus, chromium, slurm, munge, podman or" \
         "containerd is missing; install docker.io, busybox-static, prometheus, chromium," \
         "chromium-driver, slurmctld, slurmd, slurm-client, munge, podman, runc, uidmap and" \
         "containerd (as root) or the Docker, Prometheus, web page, Slurm and runtime tests" \
         "will be skipped" >&2
fi
