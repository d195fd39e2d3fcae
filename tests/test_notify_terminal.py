"""Notices on the users' own terminals (--notify-terminal): the login records read in glibc's
own format (checked against `who` and `utmpdump`), the text made plain and bounded, and real
pseudo-terminals written as `write` writes them: a trespass by a real second user's process
(useradd) reaches her terminal, escape sequences from its crafted name removed; a terminal
that refuses messages, one of another uid, one reached through `..` get nothing; a terminal
nobody reads holds up no other; a user who muted `terminal` gets nothing, and all of it
without Apprise. The rate, the kinds and the mutes on a notifier of its own."""

import asyncio
import functools
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
from dataclasses import replace

import pytest
from helpers import FakeClock, ScenarioFile, async_test, gpu_running, until
from test_notify_users import as_user

from patroller.config import Config, load
from patroller.core.leases import Event
from patroller.notify.messages import Notice
from patroller.notify.notifier import Notifier
from patroller.notify.terminal import message, plain, terminals_of, usable_line
from patroller.notify.utmp import USER_PROCESS, logins
from patroller.state.audit import AuditLog

HOST = socket.gethostname()
GPU0 = (("GPU-0", 0),)
DEAD_PROCESS = 8


def login(user, line, pid=1, kind=USER_PROCESS):
    """One glibc `struct utmp` (x86-64, aarch64: 384 bytes), field by field at its offset."""
    record = bytearray(384)
    struct.pack_into("<h", record, 0, kind)  # ut_type, then 2 bytes of padding
    struct.pack_into("<i", record, 4, pid)  # ut_pid
    record[8 : 8 + 32] = line.encode().ljust(32, b"\0")[:32]  # ut_line
    record[40:44] = line.encode()[-4:].ljust(4, b"\0")  # ut_id
    record[44 : 44 + 32] = user.encode().ljust(32, b"\0")[:32]  # ut_user
    record[76 : 76 + 9] = b"lab.local"  # ut_host[256]; then exit, session, tv, addr, reserved
    struct.pack_into("<i", record, 340, 1796287933)  # ut_tv.tv_sec
    return bytes(record)


# -- the login records ---------------------------------------------------------------------


def test_the_login_records_read_as_who_reads_them(tmp_path):
    path = tmp_path / "utmp"
    path.write_bytes(
        login("alice", "pts/7", 123)
        + login("bob", "tty1", 5)
        + login("carol", "pts/9", 6, DEAD_PROCESS)  # a login that ended
        + login("x" * 32, "pts/10", 7)
        + login("dave", "pts/11")[:200]
    )  # cut
    said = subprocess.run(["who", str(path)], capture_output=True, text=True, check=True)
    who = [tuple(line.split()[:2]) for line in said.stdout.splitlines()]
    found = [(lg.user, lg.line) for lg in logins(path.read_bytes())]
    assert found == who == [("alice", "pts/7"), ("bob", "tty1"), ("x" * 32, "pts/10")]
    assert [lg.pid for lg in logins(path.read_bytes())] == [123, 5, 7]


@pytest.mark.skipif(shutil.which("utmpdump") is None, reason="utmpdump (util-linux) missing")
def test_the_login_records_utmpdump_writes_are_read(tmp_path):
    text = (
        "[7] [04242] [ts/3] [erin    ] [pts/3       ] [lab.local           ] "
        "[10.0.0.7       ] [2026-12-06T08:40:00,000000+00:00]\n"
        "[2] [00000] [~~  ] [reboot  ] [~           ] [6.8.0               ] "
        "[0.0.0.0        ] [2026-12-06T08:00:00,000000+00:00]\n"
    )
    made = subprocess.run(
        ["utmpdump", "-r"], input=text.encode(), capture_output=True, check=True
    ).stdout
    assert len(made) == 2 * 384
    [found] = logins(made)
    assert (found.user, found.line, found.pid) == ("erin", "pts/3", 4242)


@pytest.mark.parametrize(
    "line, usable",
    [
        ("pts/3", True),
        ("tty1", True),
        ("", False),
        ("../etc/passwd", False),
        ("pts/../../tmp/x", False),
        ("/tmp/x", False),
        ("pts/3\n", False),
        ("pts/ 3", False),
        ("..", False),
        ("pts/..", False),
        ("pts/..3", True),
    ],
)
def test_a_records_line_must_stay_under_dev(line, usable):
    assert usable_line(line) is usable


# -- the text -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, shown",
    [
        ("plain words", "plain words"),
        ("red\x1b[31;1mALERT\x1b[0m", "redALERT"),
        ("title\x1b]0;owned\x07 and\x1b]2;again\x1b\\ on", "title and on"),
        ("clear\x1b[2J\x1b[H screen", "clear screen"),
        ("c1 \x9b31m csi", "c1  csi"),
        ("bell\x07 back\x08space\r over", "bell backspace over"),
        ("a\tb\nc", "a b\nc"),
        ("bidi \u202eevil", "bidi evil"),
        ("dcs \x1bPq#0;2;0;0;0\x1b\\ end", "dcs  end"),
        ("lone escape at the end \x1b", "lone escape at the end "),
    ],
)
def test_escape_sequences_and_control_characters_are_removed(given, shown):
    assert plain(given) == shown


def test_a_message_is_a_header_then_the_notice_wrapped_and_bounded():
    config = replace(
        Config(), notify_terminal_width=40, notify_terminal_lines=9, notify_terminal_bytes=2048
    )
    notice = Notice(
        "trespass",
        ("k",),
        "carol",
        GPU0,
        "gpu1: trespass on GPU 0 by carol",
        "carol runs process 4242 (\x1b[2Jpython) on GPU 0 of gpu1, which is held "
        "by alice. The run is to move to a free GPU.",
    )
    data = message(notice, "gpu1", 1796287933.0, config)
    text = data.decode()
    assert (
        text.startswith("\r\n") and text.endswith("\r\n") and "\n" not in text.replace("\r\n", "")
    )
    lines = text.split("\r\n")[1:-1]
    assert lines[0] == "Message from patroller@gpu1 at 08:52 UTC ..."
    assert lines[1] == "" and lines[2] == "gpu1: trespass on GPU 0 by carol"
    assert lines[3] == "carol runs process 4242 (python) on GPU"
    assert all(len(line) <= 40 for line in lines[1:-1]) and len(lines) == 7, lines
    assert lines[-1] == "(patroller notify mute terminal: no more of these)"
    assert all(c.isprintable() for c in "".join(lines))
    long = replace(notice, body="word " * 500)
    cut = message(long, "gpu1", 0, config).decode().split("\r\n")[1:-1]
    assert len(cut) == 9 and cut[-2] == "..."
    small = message(
        long, "gpu1", 0, replace(config, notify_terminal_lines=100, notify_terminal_bytes=300)
    )
    assert len(small) <= 300 and small.endswith(b"...\r\n")
    for most in range(100, 400):  # wherever it is cut, no CR alone (it would overwrite a line)
        data = message(
            long, "gpu1", 0, replace(config, notify_terminal_lines=100, notify_terminal_bytes=most)
        )
        assert len(data) <= most and not re.search(rb"\r(?!\n)", data), most


# -- a notifier of its own, on this user's real terminal -----------------------------------


class Pty:
    """A pseudo-terminal: its master read by the test, its slave at `path`."""

    def __init__(self, uid=0, gid=0, mode=0o620):
        self.master, self.slave = os.openpty()
        os.set_blocking(self.master, False)
        self.path = os.ttyname(self.slave)
        os.chown(self.path, uid, gid)
        os.chmod(self.path, mode)
        self.seen = b""

    @property
    def line(self):
        return self.path[len("/dev/") :]

    def read(self):
        """Everything written so far, as it came out (the slave's ONLCR: CR CR LF)."""
        while True:
            try:
                got = os.read(self.master, 65536)
            except (BlockingIOError, OSError):
                break
            if not got:
                break
            self.seen += got
        return self.seen

    def text(self):
        return self.read().decode("utf-8", "replace").replace("\r", "")

    def fill(self):
        """Write on it until it takes no more: nobody reads the master."""
        fd = os.open(self.path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            while True:
                os.write(fd, b"x" * 4096)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)

    def close(self):
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def pty():
    made = Pty()
    yield made
    made.close()


@async_test
async def test_the_kinds_written_the_mutes_and_the_terminals_own_rate(tmp_path, pty):
    """Only a trespass and an ending hold, to the users concerned; `terminal` muted, or the
    kind muted, writes nothing; at most notify_terminal_rate a window, the rest held back,
    counted, and summed up in the next; each outcome in the audit record, as `terminal`."""
    utmp = tmp_path / "utmp"
    utmp.write_bytes(login("root", pty.line))
    audit = AuditLog(None, 100, 60)
    config = replace(
        Config(),
        notify_terminal=True,
        notify_utmp=str(utmp),
        notify_terminal_rate=2,
        notify_terminal_rate_window=60.0,
    )
    clock = FakeClock()
    notifier = Notifier(config, "gpu1", audit, senders=[], monotonic=clock)
    notifier.start()

    def trespass(n):  # by a process nobody could be found for: root alone is concerned
        return Event("trespass", None, ((f"GPU-{n}", n),), {"pid": n, "holder": "root"})

    expiring = Event(
        "expiring", "root", GPU0, {"ends": 1796287933.0, "left": 600.0, "until": 5000.0}
    )
    try:
        notifier.on_event(Event("grant", "root", GPU0, {"waited": 5.0}))  # not on terminals
        notifier.on_event(Event("lost", "root", GPU0))
        notifier.on_event(trespass(0))
        await until(lambda: "trespass on GPU 0 by an unknown user" in pty.text())
        notifier.on_event(expiring)
        await until(lambda: "the hold of GPU 0 by root ends at" in pty.text())
        assert "granted" not in pty.text() and "is lost" not in pty.text()
        notifier.on_event(trespass(1))  # the third in the window: held back
        assert notifier.metrics()["held"] == 1
        clock.advance(60)  # the window passes
        notifier.on_event(trespass(2))
        await until(lambda: "trespass on GPU 2 by an unknown user" in pty.text())
        assert "GPU 1 by an unknown user" not in pty.text()
        assert (
            "Held back before this one, to send no more than 2 notices in 1m: 1 "
            "trespass." in pty.text().replace("\n", " ")
        )
        notifier.people.mute("root", "terminal", True)
        notifier.on_event(trespass(3))
        notifier.people.mute("root", "terminal", False)
        notifier.people.mute("root", "trespass", True)
        notifier.on_event(trespass(4))
        notifier.on_event(replace(expiring, details={**expiring.details, "until": 6000.0}))
        await until(lambda: pty.text().count("the hold of GPU 0 by root ends at") == 2)
        assert "GPU 3 by" not in pty.text() and "GPU 4 by" not in pty.text()
        await until(lambda: len([e for e in audit.recent if e["event"] == "notify"]) == 4)
        metrics = notifier.metrics()
    finally:
        notifier.stop(5)
    told = [
        (e["kind"], e["recipient"], e["destination"], e["result"])
        for e in audit.recent
        if e["event"] == "notify"
    ]
    assert (
        told
        == [("trespass", "root", "terminal", "sent"), ("expiring", "root", "terminal", "sent")] * 2
    )
    assert "/dev/" not in json.dumps(list(audit.recent))
    assert metrics["by_kind"]["trespass"]["sent"] == 2 and metrics["held"] == 1
    assert metrics["terminal"] == "on"


def test_terminals_are_found_as_write_finds_them(tmp_path):
    """Hers, a character device, group-writable; each once; none for a name that is not a
    local account; never a plain file or a symbolic link, even one to her terminal."""
    mine, closed, twice = Pty(), Pty(mode=0o600), Pty()
    try:
        data = b"".join(
            [
                login("root", closed.line),
                login("root", mine.line),
                login("root", mine.line),
                login("nosuchuser-x", twice.line),
                login("root", "pts/999999"),
            ]
        )
        assert terminals_of("root", data, 8) == (0, [mine.path])
        assert terminals_of("nosuchuser-x", data, 8) == (-1, [])
        os.chmod(closed.path, 0o620)
        assert terminals_of("root", data, 1) == (0, [closed.path])
        # In a /dev of the test's own: a plain file and a link, each as a terminal would be.
        (tmp_path / "file").write_text("")
        os.chmod(tmp_path / "file", 0o620)
        os.symlink(mine.path, tmp_path / "link")
        data = login("root", "file") + login("root", "link")
        assert terminals_of("root", data, 8, dev=str(tmp_path)) == (0, [])
    finally:
        for made in (mine, closed, twice):
            made.close()


def test_the_flag_and_its_variable():
    assert load([]).notify_terminal is False
    assert load(["--notify-terminal"]).notify_terminal is True
    assert load([], {"PATROLLER_NOTIFY_TERMINAL": "yes"}).notify_terminal is True
    with pytest.raises(Exception, match="PATROLLER_NOTIFY_TERMINAL"):
        load([], {"PATROLLER_NOTIFY_TERMINAL": "maybe"})


# -- the daemon, real second users, their real terminals ------------------------------------

# nvidia-smi's lines with C0 controls (ESC, BEL) are refused as damaged (observe/nvsmi): a name
# reaches a notice with the 8-bit CSI and a right-to-left override, which a terminal obeys too
CRAFTED = "ev\u009b2Jil\u202eop"


def devices(count):
    return [
        {
            "uuid": f"GPU-{n}000000-5a1e-4e57-8000-00000000000{n}",
            "pci": f"00000000:{n + 1:02X}:00.0",
        }
        for n in range(count)
    ]


@async_test
async def test_a_trespass_is_written_on_the_users_own_terminals_alone(
    tmp_path, users, reachable, monkeypatch
):
    monkeypatch.setitem(sys.modules, "apprise", None)  # Apprise is not installed
    alice, bob = users
    yours = Pty(alice.uid, alice.gid)  # hers, accepting messages: the only one she reads on
    refused = Pty(alice.uid, alice.gid, 0o600)  # hers, `mesg n`
    his = Pty(bob.uid, bob.gid)  # bob's, though a record says it is hers
    outside = Pty(alice.uid, alice.gid)  # hers, reached only through `..`
    full = Pty(bob.uid, bob.gid)  # bob's, nobody reading it
    second = Pty(bob.uid, bob.gid)  # bob's other terminal
    full.fill()
    ptys = (yours, refused, his, outside, full, second)
    link = f"/tmp/pt{os.getpid()}l"  # short: a record's line has 32 bytes
    os.symlink("/dev/pts", link)
    utmp = tmp_path / "utmp"
    utmp.write_bytes(
        b"".join(
            [
                login(alice.name, refused.line),
                login(alice.name, his.line),
                login(alice.name, os.path.relpath(f"{link}/{outside.line.split('/')[1]}", "/dev")),
                login(alice.name, yours.line),
                login(bob.name, full.line),
                login(bob.name, second.line),
            ]
        )
    )
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=devices(4))
    sleepers = []

    def run_as(user, gpu, name="python"):
        sleeper = subprocess.Popen(
            ["sleep", "120"], user=user.uid, group=user.gid, extra_groups=[]
        )
        sleepers.append(sleeper)
        scenario.write(
            processes=scenario.scenario.get("processes", [])
            + [{"pid": sleeper.pid, "gpu": gpu, "name": name}]
        )
        return sleeper.pid

    async def cli(user, *words):
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(as_user, user, reachable, *words)
        )

    try:
        async with gpu_running(
            scenario,
            notify_terminal=True,
            notify_utmp=str(utmp),
            notify_terminal_rate=10,
            socket=f"{reachable}/api.sock",
            state_dir=str(tmp_path / "state"),
        ) as h:
            assert h.services.notifier.metrics()["state"] == "no_apprise"
            await h.ok("/request?gpu=4&hold=1h")  # root holds every GPU
            # Alice's process, its name crafted, on GPU 0: on her terminal alone.
            pid = run_as(alice, 0, CRAFTED)
            await until(lambda: "trespass on GPU 0" in yours.text(), timeout=30)
            # Bob's on GPU 1: his terminal nobody reads holds up nothing.
            run_as(bob, 1)
            await until(lambda: f"trespass on GPU 1 by {bob.name}" in second.text(), 30)
            # Bob mutes it: his next trespass is not written; hers, after it, is.
            assert (await cli(bob, "notify", "mute", "terminal"))[1].startswith("terminal muted")
            muted = run_as(bob, 2)
            await until(
                lambda: any(
                    e["event"] == "trespass" and e.get("pid") == muted
                    for e in h.services.audit.recent
                ),
                timeout=30,
            )
            run_as(alice, 3)
            await until(lambda: "trespass on GPU 3" in yours.text(), timeout=30)
            hers = (await cli(alice, "notify", "list"))[1]
            his_list = (await cli(bob, "notify", "list"))[1]
            await until(lambda: len(terminal_notes(h)) == 7)
            notes = terminal_notes(h)
    finally:
        os.unlink(link)
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    try:
        raw = yours.read()
        assert not {b"\x1b", b"\x07", "\u009b".encode(), "\u202e".encode()} & {
            raw[i : i + n] for n in (1, 2, 3) for i in range(len(raw))
        }
        text = yours.text()
        assert text.startswith(f"\nMessage from patroller@{HOST} at ")
        assert f"{HOST}: trespass on GPU 0 by {alice.name}\n" in text
        shown = re.search(
            rf"{alice.name} runs process {pid} \((.*?)\) on GPU 0", text.replace("\n", " ")
        ).group(1)
        assert shown.startswith("ev") and "2Jil" in shown and shown.endswith("op"), shown
        assert "which is held by root." in text.replace("\n", " ")
        for nothing in (refused, his, outside):
            assert nothing.read() == b"", nothing.path
        assert second.text().count("Message from patroller@") == 1
        assert "GPU 2" not in second.text()
    finally:
        for made in ptys:
            made.close()
    assert "terminal: on (last: sent)" in hers
    assert "terminal: off (muted: patroller notify unmute terminal)" in his_list
    assert sorted((e["recipient"], e["kind"], e["result"]) for e in notes) == sorted(
        [
            (alice.name, "trespass", "sent"),
            (bob.name, "trespass", "sent"),
            (alice.name, "trespass", "sent"),
        ]
        + [("root", "trespass", "no_terminal")] * 4
    )
    assert "/dev/" not in json.dumps(notes)


def terminal_notes(h):
    return [
        e
        for e in h.services.audit.recent
        if e["event"] == "notify" and e["destination"] == "terminal"
    ]


def test_the_doctor_says_terminals_are_written_on_and_whether_logins_can_be_read(tmp_path):
    from patroller.doctor.notifications import check_notifications, probe_notifications

    utmp = tmp_path / "utmp"
    utmp.write_bytes(login("root", "pts/0"))
    config = replace(Config(), notify_terminal=True, notify_utmp=str(utmp))
    found = check_notifications(probe_notifications(config), config)
    assert found.status == "ok" and "terminals: on (trespasses and ending holds" in found.detail
    missing = replace(config, notify_utmp=str(tmp_path / "none"))
    found = check_notifications(probe_notifications(missing), missing)
    assert found.status == "degraded" and "terminals: on, but " in found.detail
    assert f"{tmp_path}/none cannot be read (No such file or directory)" in found.detail
    off = check_notifications(probe_notifications(Config()), Config())
    assert "terminal" not in off.detail
