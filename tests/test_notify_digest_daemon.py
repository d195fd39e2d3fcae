"""The weekly digest from a real daemon on the simulator: its usage store holds two days of a
lab's hours (written into the store's file through its tables, as its writer writes them); the
digest is made due by moving the notifier's wall clock past its time (its timer looks every
0.05 s here), and real receivers get it through Apprise: the admin's table at an SMTP server
and at a JSON webhook, alice's own week by e-mail at the host's default for users, bob's at
his own webhook, carol's nowhere (she muted digests), dave's not at all (half a minute of GPU
in the week). Each is told once: the same week read again is not sent. Without a usage store
(or one on a read-only filesystem), with one that cannot be read, or with one failing to write,
there is no digest, said in the log, and the daemon serves on. And a notifier of the test's own
senders shows who gets what by --notify-events."""

import logging
import os
import socket
import time
from dataclasses import replace
from datetime import datetime, timezone

import pytest
from helpers import ScenarioFile, async_test, gpu_running, running, until
from receivers import Hooks, Smtp
from test_usage_store import fill, tmpfs
from usage_history import HOUR, gpu_hour, write

from patroller.config import Config
from patroller.notify.digest import WEEK, next_due, since_for
from patroller.notify.notifier import Notifier
from patroller.notify.weekly import Digests
from patroller.state.audit import AuditLog
from patroller.state.usage.store import UsageStore

HOST = socket.gethostname()
UTC = timezone.utc
POINTER = "`patroller report --since 7d` shows the week by user, and `--by day` by day."


def soon(now):
    """--notify-digest's value for the minute after next: due within two minutes of `now`."""
    moment = datetime.fromtimestamp(now + 120, UTC)
    return moment.weekday(), moment.hour, moment.minute, "UTC"


def history(now):
    """The 48 hours before the hour of `now`: each hour alice computes on GPU 0 for 45 of its
    60 readings; bob reserves GPU 1 and runs nothing on it, and computes on GPU 2, where
    carol's process trespasses; GPU 3 is free. And half a minute of dave's on GPU 4."""
    last = int(now // HOUR * HOUR)
    intervals = [
        (
            start + HOUR,
            [
                gpu_hour(0, "claimed", "alice", True, [("alice", True)], busy=45),
                gpu_hour(1, "reserved", "bob", True),
                gpu_hour(2, "claimed", "bob", True, [("bob", True), ("carol", False)], busy=60),
                gpu_hour(3),
            ],
        )
        for start in range(last - 48 * HOUR, last, HOUR)
    ]
    intervals.append(
        (last - HOUR, [replace(gpu_hour(4, users=[("dave", True)], busy=60), seconds=30.0)])
    )
    return intervals


def store_with_history(state, now):
    os.makedirs(state, mode=0o700)
    path = os.path.join(state, "usage.sqlite3")
    write(path, history(now))
    os.chmod(path, 0o600)
    return path


def clock_at(moment):
    """A wall clock that reads `moment` now, and goes on from there."""
    start = time.time()
    return lambda: moment + (time.time() - start)


def words(smtp, hooks):
    """(title, body) of each notice, by recipient: the e-mail's `to` (its lines end as mail's
    do, CRLF), or the webhook's name."""
    found = {}
    for text in smtp.texts():
        found.setdefault(text["to"], []).append(
            (text["subject"], text["text"].replace("\r\n", "\n"))
        )
    for name, hook in hooks.items():
        found[name] = [(body["title"], body["message"]) for body in hook.bodies]
    return found


@async_test
async def test_each_users_week_and_the_labs_table_reach_them_once(tmp_path):
    now = time.time()
    when = soon(now)
    state = str(tmp_path / "state")
    store_with_history(state, now)
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    with Smtp() as smtp, Hooks() as admins, Hooks() as bobs:
        async with gpu_running(
            scenario,
            state_dir=state,
            hide_users=True,
            usage_interval=3600,
            notify=(smtp.url(), admins.url()),
            notify_user_default=smtp.url(to="{user}@lab.example"),
            notify_digest=when,
            notify_digest_recheck=0.05,
        ) as h:
            notifier = h.services.notifier
            digests = notifier.digests
            due = digests.due
            assert due == next_due(now, when, UTC) and now < due <= now + 120
            assert (await h.ok("/metrics.json"))["notifications"]["digest_next"] == due
            assert await notifier.people.add("bob", bobs.url()) == 1
            notifier.people.mute("carol", "digest", True)
            assert not admins.bodies and not smtp.messages  # not due yet
            notifier.clock = clock_at(due + 1)  # the timer's next look finds it due
            await until(
                lambda: (
                    len(admins.bodies) == 1 and len(bobs.bodies) == 1 and len(smtp.messages) == 2
                ),
                timeout=30,
            )
            assert digests.due == due + WEEK and digests.weeks == 1
            await until(
                lambda: (
                    len([e for e in h.services.audit.recent if e.get("kind") == "digest"]) == 4
                ),
                timeout=30,
            )
            recipients = sorted(
                e["recipient"] for e in h.services.audit.recent if e.get("kind") == "digest"
            )
            # the same week read and told again: every notice is a repeat, none is queued
            before = notifier.metrics()
            assert await digests.send(due) == 4  # the lab's table, alice's, bob's, carol's
            after = notifier.metrics()
            await h.ok("/status")
    assert recipients == ["admin", "admin", "alice", "bob"]
    assert after["repeats"] == before["repeats"] + 4
    assert after["by_kind"]["digest"] == before["by_kind"]["digest"]
    assert before["by_kind"]["digest"]["queued"] == 4
    span = time.strftime("from %Y-%m-%d %H:%M", time.gmtime(since_for(due))) + time.strftime(
        " to %Y-%m-%d %H:%M UTC", time.gmtime(due)
    )
    table = (
        f"{HOST}: the week on the GPUs, 3 user(s), 144.00 GPU-hours",
        f"GPU-hours by user on {HOST} {span}, the most first:\n"
        "bob: 72.00 (computing 24.00, held idle 0.00, reserved unused 48.00)\n"
        "alice: 48.00 (computing 36.00, held idle 12.00, reserved unused 0.00)\n"
        "carol: 24.00 (computing 0.00, held idle 0.00, reserved unused 0.00, trespass "
        "24.00)\n"
        "all users: 144.00 (computing 60.00, held idle 12.00, reserved unused 48.00, "
        "trespass 24.00)\n"
        f"The host's GPUs: 192.01 GPU-hours, of which 48.00 free and 0.00 lost. {POINTER}",
    )
    told = words(smtp, {"admin's webhook": admins, "bob's webhook": bobs})
    assert told["admin@lab.example"] == [table]
    assert told["admin's webhook"] == [table]
    release = (
        "Hours held idle or reserved unused are hours others could have computed in: "
        f"release a GPU you are not using (`patroller release`). {POINTER}"
    )
    assert told["alice@lab.example"] == [
        (
            f"{HOST}: your week on the GPUs, 48.00 GPU-hours",
            f"alice's GPU-hours on {HOST} {span}:\n"
            "computing: 36.00\n"
            "held idle (a process of yours on the GPU, computing nothing): 12.00\n"
            "reserved unused (held for you, no process of yours on it): 0.00\n"
            f"in all: 48.00\n{release}",
        )
    ]
    assert told["bob's webhook"] == [
        (
            f"{HOST}: your week on the GPUs, 72.00 GPU-hours",
            f"bob's GPU-hours on {HOST} {span}:\n"
            "computing: 24.00\n"
            "held idle (a process of yours on the GPU, computing nothing): 0.00\n"
            "reserved unused (held for you, no process of yours on it): 48.00\n"
            f"in all: 72.00\n{release}",
        )
    ]
    assert set(told) == {
        "admin@lab.example",
        "admin's webhook",
        "alice@lab.example",
        "bob's webhook",
    }  # carol muted it; dave had half a minute


@async_test
async def test_without_a_store_there_is_no_digest_and_it_is_said_once(tmp_path, caplog):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}])
    with Hooks() as admins, caplog.at_level(logging.INFO):
        async with gpu_running(
            scenario,
            state_dir=str(tmp_path / "state"),
            usage="none",
            notify=(admins.url(),),
            notify_digest=(0, 9, 0, "UTC"),
            notify_digest_recheck=0.05,
        ) as h:
            notifier = h.services.notifier
            assert notifier.digests is not None and notifier.digests.due is None
            assert (await h.ok("/metrics.json"))["notifications"]["digest_next"] is None
            notifier.clock = clock_at(time.time() + 8 * 86400)  # past any due time
            assert await notifier.digests.send(time.time()) == 0
            await h.ok("/status")
            assert "digest" not in notifier.metrics()["by_kind"]
    said = [r.getMessage() for r in caplog.records if "no weekly digest" in r.getMessage()]
    assert said == [
        "notifications: no weekly digest (--notify-digest): there is no usage store "
        "to read (--usage none, no state directory, or a read-only one)",
        "notifications: no weekly digest this time: the usage store is off",
    ]


@async_test
async def test_a_store_that_cannot_be_read_gives_no_digest_and_the_daemon_serves_on(
    tmp_path, caplog
):
    now = time.time()
    state = str(tmp_path / "state")
    path = store_with_history(state, now)
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}])
    with Hooks() as admins, caplog.at_level(logging.INFO):
        async with gpu_running(
            scenario,
            state_dir=state,
            usage_interval=3600,
            notify=(admins.url(),),
            notify_digest=soon(now),
            notify_digest_recheck=0.05,
        ) as h:
            await until(lambda: h.services.usage.state == "writable")
            with open(path + ".new", "wb") as f:  # the writer keeps the file it opened
                f.write(b"not a database at all " * 100)
            os.replace(path + ".new", path)
            notifier = h.services.notifier
            due = notifier.digests.due
            notifier.clock = clock_at(due + 1)
            await until(lambda: notifier.digests.due == due + WEEK, timeout=30)
            await until(lambda: "could not be read" in caplog.text, timeout=30)
            await h.ok("/status")
            assert "digest" not in notifier.metrics()["by_kind"]
    assert admins.bodies == []


@pytest.mark.errors_expected  # the failing writes are logged as an error
@async_test
async def test_a_store_failing_to_write_gives_no_digest(tmp_path, caplog):
    with (
        tmpfs(tmp_path / "state", "1m") as state,
        Hooks() as admins,
        caplog.at_level(logging.INFO),
    ):
        async with running(
            state_dir=str(state),
            usage_interval=0.1,
            usage_retry=0.1,
            usage_reserve=0,
            notify=(admins.url(),),
            notify_digest=(0, 9, 0, "UTC"),
        ) as h:
            store = h.services.usage
            await until(lambda: store.intervals >= 2)
            fill(state)
            await until(lambda: store.state == "failing", timeout=30)
            assert await h.services.notifier.digests.send(time.time()) == 0
            assert "digest" not in h.services.notifier.metrics()["by_kind"]
            await h.ok("/status")
            os.unlink(os.path.join(state, "filler"))
    assert "no weekly digest this time: the usage store is failing" in caplog.text
    assert admins.bodies == []


@async_test
async def test_the_admin_gets_the_table_only_with_the_flag_and_the_kind(tmp_path):
    """A notifier of the test's own senders over a real usage store: `digest` among
    --notify-events (as by default) turns nothing on without --notify-digest, and the admin
    who leaves it out of --notify-events gets none while the users get theirs."""
    now = time.time()
    state = str(tmp_path / "state")
    store_with_history(state, now)
    store = UsageStore(state, Config())
    store.open()
    try:
        await until(lambda: store.state == "writable")
        for events, digest_at, admin in (
            (Config.notify_events, None, 0),
            (("trespass",), soon(now), 0),
            (Config.notify_events, soon(now), 1),
        ):
            told = []
            audit = AuditLog(None, 100, 60)
            config = replace(
                Config(),
                notify=("json://admin/x",),
                notify_events=events,
                notify_digest=digest_at,
                notify_user_default="json://users/{user}",
            )
            notifier = Notifier(
                config,
                "gpu1",
                audit,
                senders=[lambda title, body: told.append(title) or True],
                plugin_of=lambda url: lambda title, body: True,
            )
            notifier.usage = store
            notifier.start()
            try:
                if digest_at is None:
                    assert "digest" in config.notify_events and notifier.digests is None
                    continue
                assert await notifier.digests.send(notifier.digests.due) == 4
                # the admin's table (or not), and each user's at the default for users
                await until(lambda: len(audit.recent) == admin + 3)
                assert sorted(e["recipient"] for e in audit.recent) == ["admin"] * admin + [
                    "alice",
                    "bob",
                    "carol",
                ]
                assert all(e["kind"] == "digest" and e["result"] == "sent" for e in audit.recent)
                assert told == ["gpu1: the week on the GPUs, 3 user(s), 144.00 GPU-hours"] * admin
            finally:
                notifier.stop(5)
    finally:
        store.close(5)


@async_test
async def test_a_store_on_a_read_only_filesystem_gives_no_digest_said_once(tmp_path, caplog):
    with tmpfs(tmp_path / "ro", options=",ro") as where, caplog.at_level(logging.INFO):
        async with running(
            state_dir=str(tmp_path / "state"),
            usage_dir=str(where),
            notify=("json://127.0.0.1:9/never",),
            notify_digest=(0, 9, 0, "UTC"),
        ) as h:
            digests = h.services.notifier.digests
            await until(lambda: digests.due is None)
            assert h.services.usage.state == "read_only"
            assert (await h.ok("/metrics.json"))["notifications"]["digest_next"] is None
    said = [r.getMessage() for r in caplog.records if "no weekly digest" in r.getMessage()]
    assert said == [
        "notifications: no weekly digest (--notify-digest): there is no usage store "
        "to read (--usage none, no state directory, or a read-only one)"
    ]


@pytest.mark.errors_expected  # the bug planted here is logged as an error
@async_test
async def test_a_bug_of_the_digests_own_is_logged_and_the_timer_goes_on(tmp_path, caplog):
    now = time.time()
    state = str(tmp_path / "state")
    store_with_history(state, now)
    store = UsageStore(state, Config())
    store.open()
    told = []

    def tell(notice):
        told.append(notice.title)
        raise RuntimeError("a planted bug")

    when = soon(now)
    ahead = [0.0]  # how far the digest's clock is moved
    digests = Digests(
        replace(Config(), notify_digest=when, notify_digest_recheck=0.05),
        "gpu1",
        store,
        lambda: time.time() + ahead[0],
        tell,
    )
    try:
        await until(lambda: store.state == "writable")
        digests.start()
        due = digests.due
        ahead[0] = due + 1 - time.time()
        await until(lambda: "the weekly digest failed" in caplog.text, timeout=30)
        assert told == ["gpu1: the week on the GPUs, 3 user(s), 144.00 GPU-hours"]
        assert digests.due == due + WEEK  # the next week's is armed
        assert "RuntimeError: a planted bug" in caplog.text
    finally:
        digests.stop()
        store.close(5)
