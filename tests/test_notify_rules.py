"""Notifications' pure parts: each notice's words from the lease rules' events, episodes told
once and again after the repeat, each destination's rate with what it held back, the flags'
values (a URL never repeated in an error), and the destinations' queues and tries with senders
of the test's own (Apprise's own senders meet real receivers in test_notify_daemon.py)."""

import asyncio
import logging
import os
import stat
import threading
import time
from dataclasses import replace

import pytest
from helpers import FakeClock, async_test, host_user, lease_manager, until

from patroller.config import Config, ConfigError, load
from patroller.core.leases import Event
from patroller.notify.delivery import Delivery, Outcome
from patroller.notify.destinations import DestinationError, UserDestinations
from patroller.notify.episodes import Episodes, Rates
from patroller.notify.messages import Notice, notices_of, tolds_of
from patroller.notify.notifier import Notifier
from patroller.notify.watch import due, escalations, still_trespassing
from patroller.state.audit import AuditLog

AT = 1796287933.0  # 2026-12-03 08:52:13 UTC
GPU0 = (("GPU-0", 0),)


def one(event):
    [notice] = notices_of(event, "gpu1", AT)
    return notice


def test_a_trespass_on_a_held_gpu_names_both_and_what_to_do():
    notice = one(Event("trespass", "carol", GPU0, {"pid": 4242, "holder": "alice"}))
    assert notice.kind == "trespass" and notice.user == "carol" and notice.devices == GPU0
    assert notice.title == "gpu1: trespass on GPU 0 by carol"
    assert notice.body == (
        "carol runs process 4242 on GPU 0 of gpu1 (since 2026-12-03 08:52 UTC), which is held "
        "by alice. The run is to move to a free GPU (`patroller status` shows which), reserved "
        "first (`patroller run`)."
    )
    assert notice.key == ("trespass", "GPU-0", "carol", "alice")
    free = one(Event("trespass", "carol", GPU0, {"pid": 4242}))
    assert "which is held by nobody." in free.body and free.key[-1] == ""


def test_a_trespass_on_a_jobs_or_pods_gpu_and_beyond_a_limit():
    job = one(
        Event(
            "trespass",
            "carol",
            GPU0,
            {"pid": 1, "holder": "alice", "jobs": ["4242", "4243"], "job": None},
        )
    )
    assert "which is allocated to Slurm job 4242, 4243 of alice." in job.body
    assert job.concerns == ("carol", "alice")
    assert job.key == ("trespass", "GPU-0", "carol", "alice")
    pod = one(Event("trespass", "carol", GPU0, {"pid": 1, "pods": ["team-a/train-0"]}))
    assert "which is allocated to pod team-a/train-0." in pod.body
    over = one(
        Event(
            "trespass",
            "carol",
            (("GPU-3", 3),),
            {"pid": 5151, "why": "over_limit", "limit": 2, "held": [0, 1]},
        )
    )
    assert over.body == (
        "carol runs process 5151 on GPU 3 of gpu1 (since 2026-12-03 08:52 UTC), beyond the "
        "limit of 2 GPU(s) (holding GPU 0, 1). One run is to end, or a GPU to be released: "
        "`patroller status` shows which."
    )
    assert over.key == ("trespass", "GPU-3", "carol", "over_limit")
    assert over.concerns == ("carol",)  # told to her alone: nobody holds it
    account = one(
        Event(
            "trespass",
            "carol",
            GPU0,
            {"pid": 1, "why": "over_limit", "limit": 4, "held": [], "account": "bob"},
        )
    )
    assert "beyond the limit of 4 GPU(s) of the account bob. One run" in account.body


def test_control_characters_chosen_by_users_never_reach_a_notice():
    label = "mallory\x1b]0;owned\x07\n\rroot"
    notice = one(Event("trespass", label, GPU0, {"pid": 1, "holder": "al\x1b[2Jice"}))
    for text in (notice.title, notice.body):
        assert text.isprintable(), text
    assert "mallory\\x1b]0;owned\\x07\\n\\rroot" in notice.title
    assert "held by al\\x1b[2Jice." in notice.body
    long = one(Event("trespass", "x" * 500, GPU0, {"pid": 1}))
    assert "x" * 80 + "..." in long.title and "x" * 81 not in long.title


def test_a_grant_tells_only_when_it_was_waited_for():
    assert notices_of(Event("grant", "alice", GPU0, {"hold": "lease"}), "gpu1", AT) == []
    assert (
        notices_of(Event("grant", "alice", GPU0, {"hold": "lease", "waited": 0.0}), "gpu1", AT)
        == []
    )
    notice = one(
        Event(
            "grant",
            "alice",
            (("GPU-1", 1), ("GPU-2", 2)),
            {"hold": "duration", "seconds": 7200, "waited": 725.2},
        )
    )
    assert notice.title == "gpu1: GPUs 1, 2 granted to alice after 12m05s"
    assert notice.body == (
        "alice waited 12m05s and now holds GPUs 1, 2 of gpu1 (since "
        "2026-12-03 08:52 UTC). The hold lasts 2h."
    )
    held = one(Event("grant", "alice", GPU0, {"hold": "process", "pid": 77, "waited": 3}))
    assert held.body.endswith("It is held while process 77 runs.")
    later = notices_of(Event("grant", "alice", GPU0, {"waited": 3}), "gpu1", AT + 1)[0]
    assert later.key != held.key  # each grant is an episode of its own: keyed by its time


def test_a_gpu_lost_and_back_is_one_episode_the_second_notice_ends():
    lost = one(Event("lost", "alice", GPU0))
    assert lost.title == "gpu1: GPU 0 is lost" and lost.key == ("lost", "GPU-0")
    assert lost.body.startswith("GPU 0 of gpu1, held by alice, is gone from nvidia-smi's list")
    back = one(Event("back", None, GPU0))
    assert back.kind == "lost" and back.ends == ("lost", "GPU-0")
    assert (
        back.body == "GPU 0 of gpu1 is reported again since 2026-12-03 08:52 UTC, and is "
        "granted as before."
    )
    for quiet in ("release", "expire", "ended", "allocated", "grant"):
        assert notices_of(Event(quiet, "alice", GPU0), "gpu1", AT) == []
    assert notices_of(Event("trespass", "carol", (), {"pid": 1}), "gpu1", AT) == []


def test_an_episode_is_told_once_again_after_the_repeat_and_when_it_ended():
    clock = FakeClock()
    episodes = Episodes(repeat=3600, most=3, clock=clock)
    key = ("trespass", "GPU-0", "carol", "alice")
    assert episodes.admit(key) and not episodes.admit(key)
    clock.advance(3599)
    assert not episodes.admit(key)
    clock.advance(1)
    assert episodes.admit(key) and not episodes.admit(key)
    assert episodes.end(key) and not episodes.end(key)
    assert episodes.admit(key)
    for n in range(3):  # the room is bounded: the oldest told is forgotten
        assert episodes.admit(("lost", f"GPU-{n}"))
    assert episodes.admit(key)


def test_an_episodes_look_says_whether_to_tell_and_since_when_it_was_told():
    clock = FakeClock()
    episodes = Episodes(repeat=3600, most=3, clock=clock)
    key = ("trespass", "GPU-0", "carol", "alice")
    assert episodes.look(key) == (True, None)  # never told: told now
    clock.advance(10)
    assert episodes.look(key) == (False, 10)
    clock.advance(3590)
    assert episodes.look(key) == (True, 3600)  # the repeat is over: told again, now
    clock.advance(5)
    assert episodes.look(key, repeat=5) == (True, 5)
    assert episodes.age(key) == 0


@pytest.mark.parametrize(
    ("user", "holder", "concerns"),
    [
        ("carol", "alice", ("carol", "alice")),
        ("alice", "alice", ("alice",)),
        ("carol", None, ("carol",)),
        ("carol", "", ("carol",)),
        (None, "alice", ("alice",)),
        (None, None, ()),
    ],
)
def test_a_trespass_concerns_the_trespasser_then_the_holder_each_once(user, holder, concerns):
    details = {"pid": 4242} if holder is None else {"pid": 4242, "holder": holder}
    [told] = tolds_of(Event("trespass", user, GPU0, details), "gpu1", AT)
    assert told.concerns == concerns


def test_each_user_is_looked_at_only_where_some_user_may_be_told():
    """A storm's thousand users a second are not asked of one by one when no user has a
    destination, there is no default, and nothing is written on terminals."""
    people = Notifier(Config(), "gpu1", None).people
    assert not people.may_tell("trespass", routed=True)
    people.users.add("alice", "ntfys://n/alice")
    assert people.may_tell("trespass", routed=True)
    assert not people.may_tell("trespass", routed=False)  # no Apprise: no user's destination
    people.users.remove("alice", 1)
    assert not people.may_tell("trespass", routed=True)
    people.terminal = True
    assert people.may_tell("trespass", routed=False) and not people.may_tell("lost", False)
    default = replace(Config(), notify_user_default="mailtos://smtp.lab?to={user}@lab.example")
    assert Notifier(default, "gpu1", None).people.may_tell("idle", routed=True)


def test_the_episode_looked_at_last_is_the_last_forgotten():
    clock = FakeClock()
    episodes = Episodes(repeat=3600, most=2, clock=clock)
    first, second = ("lost", "GPU-0"), ("lost", "GPU-1")
    assert episodes.admit(first) and episodes.admit(second)
    clock.advance(10)
    assert episodes.age(first) == 10  # looked at: now the most recent of the two
    assert episodes.admit(("lost", "GPU-2"))  # the room is full: the least recent goes
    assert not episodes.admit(first)
    assert episodes.admit(second)


def test_a_destinations_rate_holds_back_and_says_so_in_the_next():
    clock = FakeClock()
    rates = Rates(limit=2, window=600, clock=clock)
    notice = Notice("lost", ("lost", "GPU-0"), None, GPU0, "t", "body")
    made = []

    def words() -> Notice:
        made.append(1)
        return notice

    def never() -> Notice:
        raise AssertionError("the words of a notice held back are never made")

    assert rates.admit(1, "lost", words) == notice and rates.admit(1, "lost", words) == notice
    assert rates.admit(1, "lost", never) is None
    assert rates.admit(1, "trespass", never) is None
    assert rates.admit(2, "lost", words) == notice  # another destination has its own
    assert len(made) == 3
    clock.advance(600)
    summed = rates.admit(1, "lost", words)
    assert (
        summed.body == "body\n\nHeld back before this one, to send no more than 2 notices "
        "in 10m: 1 lost, 1 trespass. `patroller status` and the audit "
        "record have them all."
    )
    assert rates.admit(1, "lost", words) == notice  # told once


def test_the_flags_never_repeat_a_url():
    config = load(
        [
            "--test",
            "--notify",
            "json://a/b",
            "--notify",
            "mailto://u:pw@h?to=x",
            "--notify-events",
            "Trespass, lost,trespass",
            "--notify-repeat",
            "2h",
        ],
        environ={},
    )
    assert config.notify == ("json://a/b", "mailto://u:pw@h?to=x")
    assert config.notify_events == ("trespass", "lost") and config.notify_repeat == 7200
    assert load(["--test"], environ={"PATROLLER_NOTIFY": "json://a/b  ntfy://n/t"}).notify == (
        "json://a/b",
        "ntfy://n/t",
    )
    assert load(["--test"], environ={}).notify_events == (
        "trespass",
        "unreserved",
        "idle",
        "expiring",
        "granted",
        "lost",
        "unhealthy",
        "daemon",
        "digest",
    )
    with pytest.raises(ConfigError) as caught:
        load(["--test", "--notify", "json://a/b", "--notify", "hunter2-password"], environ={})
    assert str(caught.value).startswith("--notify: URL 2 is not a URL of the form scheme://")
    assert "hunter2" not in str(caught.value)
    with pytest.raises(ConfigError, match="PATROLLER_NOTIFY: URL 1") as caught:
        load(["--test"], environ={"PATROLLER_NOTIFY": "://pw@x"})
    assert "pw@x" not in str(caught.value)
    with pytest.raises(ConfigError, match="must name kinds among trespass, unreserved, idle"):
        load(["--test", "--notify-events", "trespass,everything"], environ={})


def delivered(senders, **settings):
    """A Delivery over `senders`; the outcomes it tells, as they come."""
    config = replace(Config(), notify_retry_first=0.01, **settings)
    outcomes = []
    done = threading.Condition()

    def told(outcome: Outcome) -> None:
        with done:
            outcomes.append(outcome)
            done.notify_all()

    delivery = Delivery(senders, [f"d{n}" for n in range(len(senders))], config, told)
    return delivery, outcomes, done


def test_each_destination_is_tried_again_and_one_that_hangs_keeps_no_other_waiting():
    hang = threading.Event()
    calls = {"flaky": 0}

    def flaky(title, body):
        calls["flaky"] += 1
        if calls["flaky"] == 1:
            raise OSError("refused")  # a plugin's exception is a failed try
        return True

    delivery, outcomes, done = delivered(
        [lambda t, b: hang.wait(30), flaky, lambda t, b: False], notify_tries=3
    )
    delivery.start()
    notice = Notice("lost", ("lost", "GPU-0"), None, GPU0, "t", "b")
    for destination in delivery.destinations:  # as the notifier puts, one by one
        destination.put(notice)
    with done:
        assert done.wait_for(lambda: len(outcomes) == 2, timeout=10), outcomes
    assert sorted((o.destination, o.result, o.tries) for o in outcomes) == [
        (2, "sent", 2),
        (3, "failed", 3),
    ]
    counts = delivery.counts.snapshot()["lost"]
    assert counts == {"queued": 3, "sent": 1, "failed": 1, "retried": 3, "dropped": 0}
    assert delivery.destinations[0].pending() == 0  # the hung one holds its notice, alone
    hang.set()
    with done:
        assert done.wait_for(lambda: len(outcomes) == 3, timeout=10)
    assert delivery.stop(5) == 0


def test_a_full_queue_drops_and_counts_and_the_stop_is_bounded():
    hang, sending = threading.Event(), threading.Event()

    def hung(title, body):
        sending.set()
        return hang.wait(30)

    delivery, outcomes, _ = delivered([hung], notify_queue=2)
    delivery.start()
    notices = [Notice("trespass", ("t", str(n)), None, GPU0, "t", "b") for n in range(5)]
    delivery.destinations[0].put(notices[0])
    assert sending.wait(10)  # the thread took the first, and hangs on it
    for notice in notices[1:]:  # two wait in the queue, two find it full
        delivery.destinations[0].put(notice)
    assert [(o.notice, o.result) for o in outcomes] == [
        (notices[3], "dropped"),
        (notices[4], "dropped"),
    ]
    assert delivery.counts.snapshot()["trespass"]["dropped"] == 2
    assert delivery.destinations[0].pending() == 2
    started = time.monotonic()
    assert delivery.stop(0.2) == 1  # the hung thread is left to end with the daemon
    assert time.monotonic() - started < 5
    hang.set()


@async_test
async def test_the_notifier_tells_the_kinds_asked_for_once_each_and_records_each_outcome():
    sent = []
    audit = AuditLog(None, 100, 60)
    config = replace(
        Config(),
        notify=("json://one/x", "json://two/x"),
        notify_events=("trespass", "lost"),
        notify_retry_first=0.01,
        notify_escalate=0,
    )
    notifier = Notifier(
        config,
        "gpu1",
        audit,
        clock=lambda: AT,
        senders=[
            lambda t, b: sent.append((1, t)) or True,
            lambda t, b: sent.append((2, t)) or False,
        ],
    )
    notifier.start()
    try:
        trespass = Event("trespass", "carol", GPU0, {"pid": 1, "holder": "alice"})
        notifier.on_event(trespass)
        notifier.on_event(replace(trespass, details={"pid": 2, "holder": "alice"}))
        notifier.on_event(Event("grant", "alice", GPU0, {"waited": 5.0}))  # not asked for
        notifier.on_event(Event("back", None, GPU0))  # ends no episode anyone was told of
        await until(lambda: len([e for e in audit.recent if e["event"] == "notify"]) == 2)
        assert sorted(sent) == [
            (1, "gpu1: trespass on GPU 0 by carol"),
            (2, "gpu1: trespass on GPU 0 by carol"),
        ] + [(2, "gpu1: trespass on GPU 0 by carol")] * (config.notify_tries - 1)
        records = sorted(
            (e["destination"], e["result"], e["kind"], e["recipient"], e["user"])
            for e in audit.recent
            if e["event"] == "notify"
        )
        assert records == [
            (1, "sent", "trespass", "admin", "carol"),
            (2, "failed", "trespass", "admin", "carol"),
        ]
        metrics = notifier.metrics()
        assert metrics["repeats"] == 1 and metrics["state"] == "on"
        assert metrics["by_kind"] == {
            "trespass": {
                "queued": 2,
                "sent": 1,
                "failed": 1,
                "retried": config.notify_tries - 1,
                "dropped": 0,
            }
        }
    finally:
        notifier.stop(5)


def test_a_users_destinations_are_kept_private_bounded_and_a_bad_file_set_aside(tmp_path, caplog):
    before = os.umask(0)  # whatever the umask: the file is 0600
    try:
        users = UserDestinations(str(tmp_path), most=2, longest=40)
        users.open()
        assert users.add("alice", "json://a/1") == 1 and users.add("alice", "json://a/2") == 2
        with pytest.raises(DestinationError, match="you have 2 destinations, the most"):
            users.add("alice", "json://a/3")
        with pytest.raises(DestinationError, match="you have it already, as number 2"):
            users.add("alice", "json://a/2")
        with pytest.raises(DestinationError, match="longer than 40 characters"):
            users.add("bob", "json://" + "x" * 40)
        assert users.mute("bob", "granted", True) == ("granted",)
        assert stat.S_IMODE(os.stat(tmp_path / "notify.json").st_mode) == 0o600
    finally:
        os.umask(before)
    again = UserDestinations(str(tmp_path), most=2, longest=40)
    again.open()
    assert again.of("alice").urls == ("json://a/1", "json://a/2")
    assert again.of("bob").muted == ("granted",) and again.of("bob").urls == ()
    assert again.remove("alice", 1) == "json://a/1"
    with pytest.raises(DestinationError, match="no destination 2 \\(you have 1"):
        again.remove("alice", 2)
    assert again.mute("bob", "granted", False) == ()
    assert "bob" not in again.users()  # nothing left of his: no entry
    (tmp_path / "notify.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        broken = UserDestinations(str(tmp_path), most=2, longest=40)
        broken.open()
    assert broken.users() == () and not (tmp_path / "notify.json").exists()
    assert [n for n in os.listdir(tmp_path) if n.startswith("notify.json.corrupt-")]
    assert "every user starts with none" in caplog.text


def test_the_default_names_each_user_as_one_part_of_its_url():
    config = replace(Config(), notify_user_default="mailtos://smtp.lab?to={user}@lab.example")
    notifier = Notifier(config, "gpu1", None)
    assert notifier.people.urls_for("alice", "trespass") == (
        "mailtos://smtp.lab?to=alice@lab.example",
    )
    assert notifier.people.urls_for("eve&to=boss", "trespass") == (
        "mailtos://smtp.lab?to=eve%26to%3Dboss@lab.example",
    )
    by_email = Notifier(
        replace(Config(), notify_user_default="mailtos://smtp.lab?to={email}"), "gpu1", None
    )
    assert by_email.people.urls_for("bob@lab.example", "lost") == (
        "mailtos://smtp.lab?to=bob@lab.example",
    )
    assert by_email.people.urls_for("bob", "lost") == ()  # no e-mail in his name: not told
    notifier.people.users.add("alice", "ntfys://n/alice")
    assert notifier.people.urls_for("alice", "lost") == (
        "ntfys://n/alice",
    )  # her own, not the default
    notifier.people.users.mute("alice", "lost", True)
    assert notifier.people.urls_for("alice", "lost") == () and notifier.people.urls_for(
        "alice", "trespass"
    )


def test_the_watch_finds_idle_holds_and_holds_about_to_end():
    clock = FakeClock()
    leases = lease_manager(clock)
    alice = host_user("alice", 1000)
    [first] = leases.request(alice, {"gpu": 1}, duration=3600)
    [second] = leases.request(alice, {"gpu": 1})
    numbers = {d.uuid: d.number for d in leases.inventory}
    config = replace(Config(), notify_idle_after=7200, notify_before=900, idle_release=10800)
    quiet = {first.uuid: 7200.0, second.uuid: 7199.0}

    def found(at):
        return [
            (e.kind, e.devices[0][1], e.details)
            for e in due(leases.holds, numbers, leases.state, quiet.get, config, wall=AT, clock=at)
        ]

    now = found(clock())
    assert now == [
        ("idle", first.number, {"idle": 7200.0, "since": AT - 7200, "released_at": AT + 3600})
    ]
    later = found(clock() + 2700)  # 15 minutes before its end
    assert [k for k, _, _ in later] == ["idle", "expiring"]
    assert later[1][2] == {"ends": AT + 900, "left": 900.0, "until": clock() + 3600}
    assert [k for k, _, _ in found(clock() + 3600)] == ["idle"]  # ended: nothing to warn of
    leases.process_started(first.uuid, 4242, alice)  # a process holds it: --idle-release spares it
    assert found(clock())[0][2]["released_at"] is None
    notice = one(Event("idle", "alice", ((first.uuid, 3),), later[0][2]))
    assert notice.title == "gpu1: GPU 3 held idle by alice for 2h"
    assert notice.body == (
        "GPU 3 of gpu1, which alice holds, has computed nothing since 06:52 "
        "UTC (2h). If it is not needed, release it (`patroller release 3`) "
        "so that others may have it. It is released at 09:52 UTC all the "
        "same (the host's --idle-release)."
    )
    ending = one(Event("expiring", "alice", ((first.uuid, 3),), later[1][2]))
    assert ending.title == "gpu1: the hold of GPU 3 by alice ends at 09:07 UTC"
    assert ending.body == (
        "The hold of GPU 3 of gpu1 that alice asked for ends at 09:07 UTC, "
        "in 15m. Save what runs there: the GPU is then free for others "
        "(`patroller reserve --hold ...` asks again)."
    )


def test_a_gpu_taken_unasked_and_a_trespass_escalated_to_the_admin():
    taken = one(Event("claim", "carol", GPU0, {"pid": 42, "command": "python"}))
    assert taken.kind == "unreserved" and taken.concerns == ("carol",)
    assert taken.title == "gpu1: GPU 0 used by carol without a reservation"
    assert taken.body.startswith(
        "carol runs process 42 on GPU 0 of gpu1 (since 2026-12-03 "
        "08:52 UTC) without having reserved it: it is held for carol"
    )
    escalated = one(
        Event("escalated", "carol", GPU0, {"pid": 4242, "holder": "alice", "lasting": 1800})
    )
    assert escalated.kind == "trespass" and escalated.concerns == ()  # the admin's alone
    assert escalated.title == "gpu1: trespass on GPU 0 by carol, for 30m"
    assert escalated.body.endswith(
        "which is held by alice. The run is to move to a free GPU "
        "(`patroller status` shows which), reserved first (`patroller"
        " run`). It has gone on for 30m; the users concerned were told"
        " when it began."
    )
    assert (
        escalated.key != one(Event("trespass", "carol", GPU0, {"pid": 1, "holder": "alice"})).key
    )


def test_a_trespass_reaches_the_admin_only_if_it_still_goes_on():
    clock = FakeClock()
    leases = lease_manager(clock)
    alice, carol = host_user("alice", 1000), host_user("carol", 1001)
    [held] = leases.request(alice, {"gpu": 1})
    leases.process_started(held.uuid, 4242, carol)
    assert still_trespassing(leases.holds, held.uuid, "carol", "alice")
    assert not still_trespassing(leases.holds, held.uuid, "bob", "alice")
    assert not still_trespassing(leases.holds, held.uuid, "carol", "bob")  # held by another now
    leases.process_ended(held.uuid, 4242)
    assert not still_trespassing(leases.holds, held.uuid, "carol", "alice")
    ripe, later = escalations([(10.0, "a"), (20.0, "b")], 15.0)
    assert ripe == ["a"] and later == [(20.0, "b")]


@async_test
async def test_the_admin_hears_of_a_trespass_only_if_it_outlasts_the_escalation():
    clock = FakeClock(AT)
    leases = lease_manager(clock)
    told = []
    config = replace(
        Config(), notify=("json://admin/x",), notify_escalate=600, notify_retry_first=0.01
    )
    notifier = Notifier(
        config,
        "gpu1",
        None,
        leases=leases,
        clock=clock,
        senders=[lambda title, body: told.append(title) or True],
    )
    leases.on_event(notifier.on_event)
    notifier.start()
    try:
        alice, carol, dave = (
            host_user(n, u) for n, u in (("alice", 1000), ("carol", 1001), ("dave", 1002))
        )
        [first] = leases.request(alice, {"gpu": 1})
        [second] = leases.request(alice, {"gpu": 1})
        leases.process_started(first.uuid, 4242, carol)  # she stays
        leases.process_started(second.uuid, 4343, dave)  # he leaves before the admin is told
        notifier.check()
        assert told == []  # the users concerned are told at once; the admin not yet
        leases.process_ended(second.uuid, 4343)
        clock.advance(600)
        notifier.check()
        await until(lambda: told)
        assert told == [f"gpu1: trespass on GPU {first.number} by carol, for 10m"]
    finally:
        notifier.stop(5)


@async_test
async def test_the_daemons_own_trouble_reaches_the_admin_once_it_lasts_and_again_if_it_returns():
    clock = FakeClock(AT)
    told = []
    config = replace(Config(), notify=("json://admin/x",), notify_retry_first=0.01)
    notifier = Notifier(
        config,
        "gpu1",
        None,
        leases=lease_manager(clock),
        clock=clock,
        senders=[lambda title, body: told.append((title, body)) or True],
    )
    trouble = [
        (
            "usage-store",
            "the usage store cannot be written (No space left on device)",
            "Free room.",
        )
    ]
    notifier.troubles = lambda: trouble
    notifier.start()
    try:
        queued = lambda: notifier.metrics()["by_kind"].get("daemon", {}).get("queued", 0)
        notifier.check()
        clock.advance(config.notify_trouble_after - 1)
        notifier.check()
        assert queued() == 0  # a blip is no trouble to tell
        clock.advance(1)
        notifier.check()
        notifier.check()
        await until(lambda: told)
        assert told == [
            (
                "gpu1: the usage store cannot be written (No space left on device)",
                "Patroller on gpu1: the usage store cannot be written (No space left on "
                "device), since 2026-12-03 08:52 UTC. Free room.",
            )
        ]
        assert queued() == 1  # told once while it lasts
        again = list(trouble)
        trouble.clear()
        notifier.check()  # over: its episode ends
        trouble.extend(again)  # and back: told again once it lasts
        notifier.check()
        clock.advance(config.notify_trouble_after)
        notifier.check()
        await until(lambda: len(told) == 2)
        assert told[1][0] == told[0][0] and queued() == 2
    finally:
        notifier.stop(5)


@async_test
async def test_a_storm_of_notices_not_sent_is_one_warning_and_every_one_is_counted(caplog):
    hang = threading.Event()
    config = replace(
        Config(),
        notify=("json://admin/x",),
        notify_queue=2,
        notify_escalate=0,
        notify_rate=10**6,
        repeat_log_every=3600,
    )
    notifier = Notifier(
        config, "gpu1", AuditLog(None, 100, 60), senders=[lambda title, body: hang.wait(30)]
    )
    notifier.start()
    try:
        with caplog.at_level(logging.WARNING, logger="patroller.notify.notifier"):
            for n in range(12):  # one being sent, two queued, nine dropped
                notifier.on_event(
                    Event("trespass", f"user{n}", GPU0, {"pid": n, "holder": "alice"})
                )
            await until(lambda: notifier.metrics()["by_kind"]["trespass"]["dropped"] >= 9)
            await until(
                lambda: (
                    len([e for e in notifier.audit.recent if e.get("result") == "dropped"]) >= 9
                )
            )
        lines = [r.getMessage() for r in caplog.records if "notice" in r.getMessage()]
        assert len(lines) == 1 and "was dropped: its queue was full" in lines[0], lines
    finally:
        hang.set()
        notifier.stop(5)


@async_test
async def test_a_destination_no_user_names_any_more_ends_its_thread(tmp_path):
    """A user's destination has a thread once a notice is put to it; when the last user who
    names its URL removes it, that thread ends (a URL kept by another user keeps its own)."""
    sent = []
    config = replace(Config(), notify_escalate=0, notify_retry_first=0.01)

    def plugin_of(url):
        return lambda title, body: sent.append((url, title)) or True

    notifier = Notifier(config, "gpu1", None, str(tmp_path), senders=[], plugin_of=plugin_of)
    notifier.start()

    def threads():
        return sum(t.name == "notify-0" and t.is_alive() for t in threading.enumerate())

    try:
        assert await notifier.people.add("alice", "ntfys://n/alice") == 1
        assert await notifier.people.add("alice", "ntfys://n/shared") == 2
        assert await notifier.people.add("bob", "ntfys://n/shared") == 1
        trespass = Event("trespass", "carol", GPU0, {"pid": 1, "holder": "alice"})
        notifier.on_event(trespass)
        await until(lambda: len(sent) == 2)
        assert sorted(url for url, _ in sent) == ["ntfys://n/alice", "ntfys://n/shared"]
        assert threads() == 2
        notifier.people.remove("alice", 1)
        await until(lambda: threads() == 1)
        notifier.people.remove("alice", 1)  # now her second: bob still names it
        assert notifier.people.users.of("alice").urls == ()
        await asyncio.sleep(0.2)
        assert threads() == 1
        notifier.people.remove("bob", 1)
        await until(lambda: threads() == 0)
    finally:
        notifier.stop(5)
