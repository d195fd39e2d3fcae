"""The outbox: notices pending and episodes told survive a restart, a kill -9 included; a notice
cut short while being sent is not sent again, and nothing is sent twice.

The journal on its own (written by its thread, read back by a fresh one, as a restart does),
then a real daemon on the simulator killed with SIGKILL while a webhook holds its first notice
and two more wait behind it, and started again."""

import json
import os
import signal
import stat
import subprocess
import time
import urllib.request
from dataclasses import asdict, replace

import pytest
from helpers import (
    NOBODY,
    FakeClock,
    ScenarioFile,
    ServerProcess,
    async_test,
    host_user,
    lease_manager,
    until,
)
from receivers import Hooks, wait_for

from patroller.config import Config
from patroller.notify import Notifier
from patroller.notify.journal import line
from patroller.notify.messages import Notice
from patroller.notify.outbox import FILE, Outbox, episode_line, tag_of
from patroller.state.audit import AuditLog


def notice(n, kind="trespass"):
    return Notice(
        kind,
        (kind, f"GPU-{n}", "bob", "alice"),
        "bob",
        ((f"GPU-{n}", n),),
        f"title {n}",
        f"body {n}\nwith a second line ✓",
        concerns=("bob", "alice"),
    )


def written(outbox):
    """Wait for the writer to have written everything handed to it."""
    assert outbox.flush(10)


def reopened(directory, config=None):
    config = config or Config()
    fresh = Outbox(directory, config)
    restored = fresh.open(time.time())
    fresh.stop(5)
    return restored


def test_what_is_pending_and_told_comes_back_and_what_is_done_does_not(tmp_path):
    outbox = Outbox(str(tmp_path), Config())
    assert outbox.open(time.time()).pending == []
    sent, waiting, cut, retried = (
        outbox.queued(notice(n), "admin", tag_of("json://x"), 1) for n in range(4)
    )
    outbox.trying(sent)
    outbox.done(sent, "sent")
    outbox.trying(cut)  # the daemon dies during this try
    outbox.trying(retried)
    outbox.failed_try(retried)  # failed, waiting for its next try
    outbox.told(("trespass", "GPU-1", "bob", "alice"), time.time() - 60)
    outbox.told(("lost", "GPU-2"), time.time())
    outbox.ended(("lost", "GPU-2"))
    written(outbox)
    restored = reopened(str(tmp_path))  # no stop: as after a kill -9
    assert [p.ident for p in restored.pending] == [waiting, retried]
    assert restored.pending[0].notice == notice(1)  # every field, tuples and all
    assert (
        restored.pending[0].recipient,
        restored.pending[0].tag,
        restored.pending[0].number,
    ) == ("admin", tag_of("json://x"), 1)
    assert [p.ident for p in restored.interrupted] == [cut]
    assert list(restored.episodes) == [("trespass", "GPU-1", "bob", "alice")]
    assert restored.unreadable == 0
    # the journal was written anew at that start: only what is pending, nothing cut short
    again = reopened(str(tmp_path))
    assert [p.ident for p in again.pending] == [waiting, retried] and again.interrupted == []
    assert list(again.episodes) == [("trespass", "GPU-1", "bob", "alice")]
    outbox.stop(5)


def test_a_user_called_admin_is_not_the_admin_and_an_older_journal_still_reads(tmp_path):
    outbox = Outbox(str(tmp_path), Config())
    outbox.open(time.time())
    hers = outbox.queued(notice(1), "admin", "t", 1)  # the account "admin", a user
    theirs = outbox.queued(notice(2), "admin", "t", 1, admin=True)  # the admin (--notify)
    written(outbox)
    outbox.stop(5)
    with open(tmp_path / FILE, "a", encoding="utf-8") as f:  # as a version before wrote it
        line = {"q": "old-1", "to": "admin", "tag": "t", "n": 1, "notice": asdict(notice(3))}
        f.write(json.dumps(line) + "\n")
    restored = reopened(str(tmp_path))
    assert {p.ident: p.admin for p in restored.pending} == {
        hers: False,
        theirs: True,
        "old-1": True,
    }
    # and so it stays once the journal is written anew
    assert {p.ident: p.admin for p in reopened(str(tmp_path)).pending} == {
        hers: False,
        theirs: True,
        "old-1": True,
    }


def test_the_journal_is_private_and_holds_no_url(tmp_path):
    url = "json://patroller:s3cr3t@127.0.0.1:9/hook"
    outbox = Outbox(str(tmp_path), Config())
    outbox.open(time.time())
    outbox.queued(notice(1), "alice", tag_of(url), 2)
    written(outbox)
    outbox.stop(5)
    path = tmp_path / FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = path.read_text()
    assert "s3cr3t" not in text and "127.0.0.1" not in text and tag_of(url) in text


def test_a_torn_last_line_and_foreign_lines_are_skipped(tmp_path):
    outbox = Outbox(str(tmp_path), Config())
    outbox.open(time.time())
    kept = outbox.queued(notice(1), "admin", "t", 1)
    written(outbox)
    outbox.stop(5)
    with open(tmp_path / FILE, "a", encoding="utf-8") as f:
        f.write('["not", "ours"]\n{"zz": 1}\n{"q": "x-9", "to": "admin", "ta')  # cut by a kill
    restored = reopened(str(tmp_path))
    assert [p.ident for p in restored.pending] == [kept] and restored.unreadable == 3


def test_episodes_older_than_the_repeat_are_forgotten_and_their_number_is_bounded(tmp_path):
    config = Config(notify_repeat=3600, notify_episodes=3)
    outbox = Outbox(str(tmp_path), config)
    outbox.open(time.time())
    outbox.told(("idle", "old"), time.time() - 7200)
    for n in range(5):
        outbox.told(("idle", str(n)), time.time())
    written(outbox)
    outbox.stop(5)
    assert list(reopened(str(tmp_path), config).episodes) == [
        ("idle", "2"),
        ("idle", "3"),
        ("idle", "4"),
    ]


def test_an_episode_ended_then_told_again_at_once_is_kept_in_that_order(tmp_path):
    config = Config(notify_repeat=3600)
    outbox = Outbox(str(tmp_path), config)
    outbox.open(time.time())
    now = time.time()
    # within one gathering of the writer: the order of the episodes' lines is what says
    outbox.told(("lost", "GPU-1"), now - 10)
    outbox.ended(("lost", "GPU-1"))
    outbox.told(("lost", "GPU-1"), now)  # back, then lost again: told, so remembered
    outbox.told(("lost", "GPU-2"), now)
    outbox.ended(("lost", "GPU-2"))  # ended last: forgotten
    outbox.stop(5)
    records = [json.loads(line) for line in (tmp_path / FILE).read_text().splitlines()]
    assert [r for r in records if "e" in r or "x" in r] == [
        {"e": ["lost", "GPU-1"], "at": round(now - 10, 3)},
        {"x": ["lost", "GPU-1"]},
        {"e": ["lost", "GPU-1"], "at": round(now, 3)},
        {"e": ["lost", "GPU-2"], "at": round(now, 3)},
        {"x": ["lost", "GPU-2"]},
    ]
    assert reopened(str(tmp_path), config).episodes == {("lost", "GPU-1"): round(now, 3)}


def test_a_storm_of_episodes_cues_the_writer_once_until_it_takes_them(tmp_path):
    config = Config()
    outbox = Outbox(str(tmp_path), config)  # its writer not started yet: nothing is taken
    now = time.time()
    for n in range(1000):
        outbox.told(("trespass", f"GPU-{n}", f"user{n}", "alice"), now)
    outbox.ended(("trespass", "GPU-0", "user0", "alice"))
    assert outbox._lines.qsize() == 1  # one cue for the thousand and one
    outbox.open(now)  # the writer takes them all at its cue
    written(outbox)
    outbox.told(("idle", "GPU-7", "carol"), now)  # after the cue was taken: cued again
    outbox.stop(5)
    episodes = reopened(str(tmp_path), config).episodes
    assert len(episodes) == 1000, len(episodes)
    assert ("trespass", "GPU-0", "user0", "alice") not in episodes
    assert ("trespass", "GPU-999", "user999", "alice") in episodes
    assert ("idle", "GPU-7", "carol") in episodes


@pytest.mark.parametrize(
    "key",
    [
        ("trespass", "GPU-1", "bob", "alice"),
        ('a"b\\c', "\x00\x1f\u2028\x7f", "é漢字", "\udcff"),  # quotes, controls, a lone surrogate
        (),
        ("granted", 3),  # a part that is not a string
    ],
)
@pytest.mark.parametrize("at", [None, 1765000000.123, 0.1, 1e20, 1e-7, 5.0, 3, float("nan")])
def test_an_episodes_line_is_what_the_journals_encoder_writes(key, at):
    kind = "x" if at is None else "e"
    record = {kind: list(key)} if at is None else {kind: list(key), "at": at}
    assert episode_line(kind, key, at) == line(record)


def test_a_rewritten_journal_keeps_the_newest_episodes_told(tmp_path):
    config = Config(notify_repeat=3600, notify_episodes=3, notify_outbox_lines=4)
    outbox = Outbox(str(tmp_path), config)
    outbox.open(time.time())
    for n in range(40):
        outbox.told(("idle", str(n)), time.time())
        written(outbox)  # a batch each: the journal is rewritten as it grows
    outbox.stop(5)
    assert outbox.rewrites >= 3
    records = [json.loads(line) for line in (tmp_path / FILE).read_text().splitlines()]
    told = [int(r["e"][1]) for r in records if "e" in r]
    # what a rewrite kept and what came after it: the newest episodes, none forgotten before
    assert told == list(range(40 - len(told), 40)), told


def test_a_rewrite_writes_each_episodes_line_as_it_was_written_and_forgets_the_old(
    tmp_path, monkeypatch
):
    """A storm's rewrite holds 10,000 episodes: their lines are written again as they were
    made when each was told, none made anew (55 ms of the interpreter, taken from the loop,
    when they were), and those told before --notify-repeat are left out."""
    import patroller.notify.outbox as module

    config = Config(notify_repeat=3600)
    outbox = Outbox(str(tmp_path), config)
    outbox.open(time.time())
    now = time.time()
    outbox.told(("idle", "old"), now - 7200.0004)
    for n in range(20):
        outbox.told(("trespass", f"GPU-{n % 3}", f"user{n}", "alice"), now + n / 7)
    outbox.ended(("trespass", "GPU-1", "user4", "alice"))
    outbox.told(("trespass", "GPU-2", "user2", "alice"), now + 30.0006)  # told again: last
    written(outbox)
    made = []
    monkeypatch.setattr(
        module, "episode_line", lambda *args: made.append(args) or episode_line(*args)
    )
    outbox._rewrite()  # the writer waits for a line: the test's thread rewrites
    outbox.stop(5)
    assert made == []
    expected = [
        (("trespass", f"GPU-{n % 3}", f"user{n}", "alice"), round(now + n / 7, 3))
        for n in range(20)
        if n not in (2, 4)
    ] + [(("trespass", "GPU-2", "user2", "alice"), round(now + 30.0006, 3))]
    lines = (tmp_path / FILE).read_text().splitlines(keepends=True)
    assert lines[1:] == [line({"e": list(key), "at": at}) for key, at in expected]
    assert list(reopened(str(tmp_path), config).episodes.items()) == expected


def test_a_journal_holding_much_grows_to_four_times_what_it_holds_and_no_more(tmp_path):
    config = Config(notify_outbox_lines=40)
    outbox = Outbox(str(tmp_path), config)
    outbox.open(time.time())
    kept = [outbox.queued(notice(n), "admin", "t", 1) for n in range(30)]
    written(outbox)
    longest = 0
    for n in range(300):
        outbox.done(outbox.queued(notice(100 + n), "admin", "t", 1), "sent")
        written(outbox)
        longest = max(longest, len((tmp_path / FILE).read_text().splitlines()))
    outbox.stop(5)
    # a rewrite holds the version's line and the 30 pending; the journal is written anew
    # once more than four times that were written, the rewrite's own lines counted
    assert outbox.rewrites >= 3 and longest <= 4 * 31 + 2, (outbox.rewrites, longest)
    assert [p.ident for p in reopened(str(tmp_path), config).pending] == kept


def test_the_journal_is_rewritten_when_it_grows(tmp_path):
    config = Config(notify_outbox_lines=50)
    outbox = Outbox(str(tmp_path), config)
    outbox.open(time.time())
    for n in range(200):
        ident = outbox.queued(notice(n), "admin", "t", 1)
        outbox.done(ident, "sent")
        if n % 50 == 0:
            written(outbox)  # in several batches
    last = outbox.queued(notice(7), "admin", "t", 1)
    written(outbox)
    lines = (tmp_path / FILE).read_text().splitlines()
    assert outbox.rewrites >= 4 and len(lines) <= 52, (outbox.rewrites, len(lines))
    outbox.stop(5)
    assert [p.ident for p in reopened(str(tmp_path), config).pending] == [last]


def test_a_journal_that_cannot_be_written_is_counted_and_what_is_held_goes_on(tmp_path):
    os.chmod(tmp_path, 0o700)
    outbox = Outbox(str(tmp_path), Config())
    outbox.open(time.time())
    (tmp_path / FILE).unlink()
    os.mkdir(tmp_path / FILE)  # the rename and every append now fail
    outbox.queued(notice(1), "admin", "t", 1)
    outbox._fd = None  # the next batch rewrites, and fails
    written(outbox)
    wait_for(lambda: outbox.failures >= 1)
    outbox.stop(5)


def test_without_a_state_directory_nothing_is_kept():
    outbox = Outbox(None, Config())
    assert outbox.open(time.time()).pending == [] and not outbox.on
    assert outbox.queued(notice(1), "admin", "t", 1) == ""
    outbox.trying("")  # returns at once
    outbox.stop(1)


def ok(server, path):
    with urllib.request.urlopen(server.url + path, timeout=20) as response:
        return json.loads(response.read())


def metrics(server):
    return ok(server, "/metrics.json")["notifications"]


def on_disk(path) -> tuple[int, int, int]:
    """The journal's episodes told, notices queued and tries begun."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return tuple(sum(1 for line in lines if key in line) for key in ("e", "q", "s"))


@pytest.mark.timeout(180)
def test_kill_9_mid_queue_then_restart_loses_nothing_and_sends_nothing_twice(tmp_path):
    devices = [
        {
            "uuid": f"GPU-{n}000000-5a1e-4e57-8000-00000000000{n}",
            "pci": f"00000000:{n + 1:02X}:00.0",
        }
        for n in range(3)
    ]
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=devices)
    state = str(tmp_path / "state")
    strangers = [subprocess.Popen(["sleep", "300"], user=NOBODY) for _ in range(3)]
    with Hooks() as hooks:
        args = (
            "--nvidia-smi",
            scenario.command,
            "--state-dir",
            state,
            "--inventory-every",
            "0.5",
            "--notify",
            hooks.url(),
            "--notify-events",
            "trespass",
            "--notify-escalate",
            "0",
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
        )
        hooks.gate.clear()  # the first notice is taken and never answered
        server = ServerProcess(*args).start()
        try:
            ok(server, "/request?gpu=3&hold=1h")
            scenario.write(
                processes=[
                    {"pid": p.pid, "gpu": n, "name": "python"} for n, p in enumerate(strangers)
                ]
            )
            wait_for(
                lambda: len(hooks.bodies) == 1 and metrics(server)["pending"] == 2, timeout=60
            )
            # killed once the journal holds them: lines of a storm are gathered for
            # notify_outbox_gather before they are written, and a kill before that loses them
            wait_for(lambda: on_disk(tmp_path / "state" / FILE) == (3, 3, 1), timeout=60)
        finally:
            server.stop(signal.SIGKILL)
        hooks.gate.set()
        first = hooks.bodies[0]["title"]
        server = ServerProcess(*args).start()
        try:
            # the two that waited are sent; the trespasses, seen again, are not told again
            wait_for(lambda: len(hooks.bodies) == 3, timeout=60)
            wait_for(lambda: metrics(server)["repeats"] >= 3, timeout=60)
            assert metrics(server)["pending"] == 0
        finally:
            assert server.stop() == 0
            for p in strangers:
                p.kill()
    titles = sorted(b["title"] for b in hooks.bodies)
    assert titles == sorted(
        f"{h}: trespass on GPU {n} by nobody" for n in range(3) for h in [titles[0].split(":")[0]]
    ), titles
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    results = sorted(r["result"] for r in records if r["event"] == "notify")
    assert results == ["interrupted", "sent", "sent"], results
    assert all(r["admin"] is True for r in records if r["event"] == "notify")
    [cut] = [r for r in records if r["event"] == "notify" and r["result"] == "interrupted"]
    assert first.endswith(f"GPU {cut['devices'][0]['number']} by nobody"), (first, cut)
    assert "127.0.0.1" not in (tmp_path / "state" / FILE).read_text()


@pytest.mark.parametrize("user", ["bob", "admin"])  # an account may be called admin
@async_test
async def test_a_users_pending_notice_goes_to_her_destination_after_a_restart_if_she_has_it(
    tmp_path, user
):
    """A notice pending for a user's destination is sent there after a restart; one for a
    destination she has removed since, or a kind she muted, is not, and its audit line says
    `gone`. Her last result at her destination is kept for `patroller notify list`."""
    kept, removed = "json://127.0.0.1:9/kept", "json://127.0.0.1:9/removed"
    before = Outbox(str(tmp_path), Config())
    before.open(time.time())
    for n, url in ((1, kept), (2, removed), (3, kept)):
        before.queued(notice(n, "granted" if n == 3 else "trespass"), user, tag_of(url), 1)
    written(before)  # and the daemon dies
    got = []
    audit = AuditLog(None, 100, 60)
    notifier = Notifier(
        Config(),
        "gpu1",
        audit,
        str(tmp_path),
        senders=[],
        plugin_of=lambda url: lambda t, b: got.append((url, t)) or True,
    )
    notifier.people.users.add(user, kept)
    notifier.people.users.mute(user, "granted", True)
    notifier.start()
    try:
        await until(lambda: len([e for e in audit.recent if e["event"] == "notify"]) == 3)
        assert got == [(kept, "title 1")]
        assert sorted((e["result"], e["kind"], e["recipient"]) for e in audit.recent) == [
            ("gone", "granted", user),
            ("gone", "trespass", user),
            ("sent", "trespass", user),
        ]
        await until(lambda: (user, kept) in notifier.people.last)
        assert notifier.people.last[(user, kept)][0] == "sent"
        assert not [e for e in audit.recent if "admin" in e]  # hers, not the admin's
        assert notifier.outbox.flush(10)
    finally:
        notifier.stop(5)
        before.stop(1)
    assert reopened(str(tmp_path)).pending == []


@async_test
async def test_a_trespass_told_before_a_restart_still_reaches_the_admin_when_it_has_lasted(
    tmp_path,
):
    """The users were told before the restart; the trespass, seen again after it, is not told
    to them again, and reaches the admin --notify-escalate after it was first told."""
    at = 1796287933.0
    clock = FakeClock(at)
    leases = lease_manager(clock)
    alice, carol = host_user("alice", 1000), host_user("carol", 1001)
    [held] = leases.request(alice, {"gpu": 1})
    before = Outbox(str(tmp_path), Config())
    before.open(at)
    before.told(("trespass", held.uuid, "carol", "alice"), at - 500)
    written(before)
    told = []
    config = replace(
        Config(), notify=("json://admin/x",), notify_escalate=600, notify_retry_first=0.01
    )
    notifier = Notifier(
        config,
        "gpu1",
        None,
        str(tmp_path),
        leases=leases,
        clock=clock,
        senders=[lambda title, body: told.append(title) or True],
    )
    leases.on_event(notifier.on_event)
    notifier.start()
    try:
        leases.process_started(held.uuid, 4242, carol)
        assert notifier.repeats == 1  # not told again
        clock.advance(99)
        notifier.check()
        assert notifier.metrics()["pending"] == 0 and told == []
        clock.advance(2)
        notifier.check()
        await until(lambda: told)
        assert told == [f"gpu1: trespass on GPU {held.number} by carol, for 10m"]
    finally:
        notifier.stop(5)
        before.stop(1)
