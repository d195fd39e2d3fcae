# Sourced by tests/setup.sh: wait_for_apt waits while another apt-get or dpkg (unattended
# upgrades at boot, a second setup at once) holds the package locks, saying so once, for at most
# APT_WAIT seconds (default 600), instead of failing with apt-get's exit status 100.
APT_LOCKS="${APT_LOCKS:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock}"

apt_locks_free() {
    python3 - $APT_LOCKS <<'PY'
import fcntl, os, sys
for path in sys.argv[1:]:
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        continue
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # apt's own kind of lock (fcntl)
    except OSError:
        sys.exit(1)
    finally:
        os.close(fd)
PY
}

wait_for_apt() {
    waited=0
    limit="${APT_WAIT:-600}"
    while ! apt_locks_free; do
        if [ "$waited" -eq 0 ]; then
            echo "tests/setup.sh: another apt-get or dpkg holds the package lock; waiting for" \
                 "it (at most $limit s)" >&2
        fi
        if [ "$waited" -ge "$limit" ]; then
            echo "tests/setup.sh: the package lock is still held after $limit s; giving up" >&2
            return 100
        fi
        sleep 1
        waited=$((waited + 1))
    done
    if [ "$waited" -gt 0 ]; then
        echo "tests/setup.sh: the package lock is free after $waited s; going on" >&2
    fi
}
