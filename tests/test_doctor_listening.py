"""The doctor's checks of where the daemon would listen and whom it would tell, in the test
process, over real things: a port another HTTP server holds, sockets and folders at the --socket
path (under a folder of the test's own in /tmp, whose modes the test sets: tmp_path lies under
a folder others may not pass), Apprise loading real destinations, login records that cannot be
read or whose read never returns. Each check's words compared whole, where the words are the
check's answer."""

import asyncio
import http.server
import os
import shutil
import socket
import sys
import tempfile
import threading
from dataclasses import replace

import pytest
from helpers import engines_in

from patroller.config import Config
from patroller.doctor.examine import examine
from patroller.doctor.listening import check_port, check_socket, probe_port, probe_socket
from patroller.doctor.notifications import check_notifications, probe_notifications
from patroller.doctor.results import Result
from patroller.notify.delivery import EXTRA


@pytest.fixture
def open_folder():
    """A folder in /tmp that every user may pass through (mode 755)."""
    folder = tempfile.mkdtemp(prefix="doctor-")
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder)


def test_a_port_another_server_holds_is_named_by_what_answers():
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version, sys_version = "nginx/1.24", ""

        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        facts = probe_port(port, "127.0.0.1", 5)
    finally:
        server.shutdown()
        server.server_close()
    assert check_port(facts) == Result(
        "address and port",
        "failed",
        f"port {port} on 127.0.0.1 is taken: `nginx/1.24` answers there",
        "stop it, or choose another --port or --address",
    )


def test_the_socket_path_none_a_missing_folder_and_a_new_socket(open_folder):
    assert check_socket(probe_socket(None, 1)) == Result(
        "unix socket",
        "ok",
        "none (--socket): callers are identified over TCP, from this host only",
    )
    missing = f"{open_folder}/run/patroller.sock"
    assert check_socket(probe_socket(missing, 1)) == Result(
        "unix socket",
        "failed",
        f"{open_folder}/run does not exist: {missing} cannot be made",
        "make the folder (under systemd: RuntimeDirectory=patroller), or choose another --socket",
    )
    made = f"{open_folder}/patroller.sock"
    assert check_socket(probe_socket(made, 1)) == Result(
        "unix socket", "ok", f"{made}: made at start (mode 666)"
    )


def test_a_live_socket_in_a_folder_others_may_not_pass_is_degraded(open_folder):
    closed = os.path.join(open_folder, "closed")
    os.mkdir(closed, 0o750)
    os.chmod(closed, 0o750)
    path = os.path.join(closed, "patroller.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    os.chmod(path, 0o666)
    listener.listen()
    try:
        facts = probe_socket(path, 1)
    finally:
        listener.close()
    assert check_socket(facts) == Result(
        "unix socket",
        "degraded",
        f"{path}: a server answers there (mode 666); but {closed} (mode 750) lets no other user "
        "through",
        f"chmod o+x {closed} (under systemd: RuntimeDirectoryMode=0755)",
    )


# -- notifications --------------------------------------------------------------------------


def test_two_destinations_are_named_without_their_secrets():
    config = Config(
        notify=("json://localhost:8088/path", "mailto://user:secret@example.com"),
        notify_events=("trespass", "lost"),
    )
    result = check_notifications(probe_notifications(config), config)
    assert (result.check, result.status) == ("notifications", "ok"), result
    said = result.detail
    assert said.startswith("2 destination(s), told of trespass, lost: json://localhost:8088/"), (
        said
    )
    assert "; mailto://user:****@example.com/" in said and "secret" not in said, said


def test_without_apprise_and_without_login_records_both_are_said(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "apprise", None)  # what Python says of a package not there
    utmp = tmp_path / "utmp"
    config = Config(notify=("json://localhost/",), notify_terminal=True, notify_utmp=str(utmp))
    assert check_notifications(probe_notifications(config), config) == Result(
        "notifications",
        "degraded",
        "off: 1 --notify destination(s) given, but Apprise is not installed: nobody is told of "
        f"anything; terminals: on, but {utmp} cannot be read ({os.strerror(2)}): no user's "
        "terminal is found",
        f"{EXTRA}; logins are recorded in {utmp} where users log in on this host (sshd, login); "
        "without it no terminal is found",
    )


def test_login_records_whose_read_never_returns_are_named_at_the_bound(tmp_path):
    """The login records a FIFO nobody writes: the notifications' probe is still out."""
    utmp = tmp_path / "utmp"
    os.mkfifo(utmp, 0o600)
    config = replace(
        Config(
            test=True,
            port=0,
            address="127.0.0.1",
            notify_terminal=True,
            notify_utmp=str(utmp),
            **engines_in(str(tmp_path)),
        ),
        doctor_deadline=1.0,
    )
    try:
        found = {r.check: r for r in asyncio.run(examine(config, unit_dirs=[str(tmp_path)]))}
    finally:
        os.close(os.open(utmp, os.O_WRONLY | os.O_NONBLOCK))  # the read ends
    assert found["notifications"] == Result(
        "notifications",
        "degraded",
        "no answer within the doctor's 1s: waited for Apprise, to load its services, and the "
        f"login records {utmp}",
        "find what is slow there: the daemon would wait on it too",
    )
