"""A storm of notices is bounded in what it writes and what it keeps: notices dropped at a full
queue past Config.notify_dropped_audited are counted, one audit line for many, and none is
lost from the count; the trespasses waiting to reach the admin are bounded; the outbox gathers
its lines, but writes a try's start, a flush and the stop's lines at once."""

import json
import threading
import time
from dataclasses import replace

from helpers import async_test, lease_manager, until
from receivers import wait_for

from patroller.config import Config
from patroller.core.leases import Event
from patroller.notify import messages
from patroller.notify.messages import Notice
from patroller.notify.notifier import Notifier
from patroller.notify.outbox import FILE, Outbox
from patroller.notify.watch import Escalations
from patroller.state.audit import AuditLog

GPU0 = (("GPU-0", 0),)


def trespass(n):
    return Event("trespass", f"user{n}", GPU0, {"pid": n, "holder": "alice"})


def dropped(audit):
    return [e for e in audit.recent if e["event"] == "notify" and e["result"] == "dropped"]


def hung_admin(**settings):
    """A started notifier whose one admin destination hangs on each notice until `hang` is
    set (`sending`: it began one), with `settings` beside notify_escalate 0; its audit record
    in memory. (notifier, audit, hang, sending)"""
    hang, sending = threading.Event(), threading.Event()

    def hung(title, body):
        sending.set()
        return hang.wait(30)

    config = replace(
        Config(),
        notify=("json://admin/x",),
        notify_escalate=0,
        repeat_log_every=3600,
        **settings,
    )
    audit = AuditLog(None, 1000, 60)
    notifier = Notifier(config, "gpu1", audit, leases=lease_manager(), senders=[hung])
    notifier.start()
    return notifier, audit, hang, sending


@async_test
async def test_a_storms_drops_past_the_bound_are_counted_in_one_line_and_none_is_lost():
    notifier, audit, hang, sending = hung_admin(
        notify_queue=2, notify_rate=10**6, notify_dropped_audited=3
    )
    try:
        notifier.on_event(trespass(0))
        await until(sending.is_set)  # the thread sends it, and hangs: the queue fills
        for n in range(1, 23):  # two queued, twenty dropped
            notifier.on_event(trespass(n))
        assert notifier.metrics()["by_kind"]["trespass"]["dropped"] == 20
        lines = dropped(audit)  # the first three one by one, with their own words
        assert [(e["user"], e.get("count")) for e in lines] == [
            ("user3", None),
            ("user4", None),
            ("user5", None),
        ]
        notifier.check()  # the watch's look writes what was counted
        [counted] = dropped(audit)[3:]
        assert {k: counted[k] for k in ("user", "kind", "recipient", "destination", "count")} == {
            "user": None,
            "kind": "trespass",
            "recipient": "admin",
            "destination": 1,
            "count": 17,
        }
        for n in range(23, 28):  # the same window: counted, none written one by one
            notifier.on_event(trespass(n))
        assert len(dropped(audit)) == 4
        notifier.check()
        assert dropped(audit)[4]["count"] == 5
        notifier.check()  # nothing more counted: no line
        for n in range(28, 30):  # counted, and written at the stop
            notifier.on_event(trespass(n))
        total = notifier.metrics()["by_kind"]["trespass"]["dropped"]
    finally:
        hang.set()
        notifier.stop(5)
    lines = dropped(audit)
    assert [e.get("count") for e in lines[3:]] == [17, 5, 2]
    assert sum(e.get("count", 1) for e in lines) == total == 27
    assert all(e["admin"] is True for e in lines)  # the admin's, one by one or counted


@async_test
async def test_a_notice_dropped_at_a_full_queue_has_no_words_made_nor_a_place_in_the_rate(
    monkeypatch,
):
    made = []
    words = messages._words
    monkeypatch.setattr(
        messages, "_words", lambda told, reader: made.append(told.key) or words(told, reader)
    )
    notifier, audit, hang, sending = hung_admin(
        notify_queue=1, notify_rate=3, notify_rate_window=3600
    )
    try:
        notifier.on_event(trespass(0))
        await until(sending.is_set)  # sent, and the thread hangs on it
        notifier.on_event(trespass(1))  # queued: the queue of one is full
        assert len(made) == 2
        for n in range(2, 12):
            notifier.on_event(trespass(n))
        counts = notifier.metrics()["by_kind"]["trespass"]
        assert counts["dropped"] == 10
        assert made == [("trespass", "GPU-0", f"user{n}", "alice") for n in (0, 1)]
        # each drop is audited as before, with whom it concerned
        assert [e["user"] for e in dropped(audit)] == [f"user{n}" for n in range(2, 12)]
        hang.set()
        await until(lambda: notifier.metrics()["by_kind"]["trespass"].get("sent", 0) == 2)
        notifier.on_event(trespass(12))  # the rate's third place: the drops took none
        assert notifier.held == 0
        assert notifier.metrics()["by_kind"]["trespass"]["queued"] == 3
    finally:
        hang.set()
        notifier.stop(5)


def test_the_trespasses_waiting_to_reach_the_admin_are_bounded():
    waiting = Escalations(600, 3)
    events = [trespass(n) for n in range(5)]
    for n, event in enumerate(events):
        waiting.add(event, ("trespass", "GPU-0", f"user{n}", "alice"), 100.0 + n)
    waiting.add(events[4], ("trespass", "GPU-0", "user4", "alice"), 200.0)  # waits already
    assert waiting.ripe(703.0) == events[2:4]  # the first two forgotten
    assert waiting.ripe(704.0) == [events[4]]  # its time is that of its first add
    assert waiting.ripe(10_000.0) == []


def test_a_line_after_a_quiet_is_written_at_once(tmp_path):
    """Gathering is for storms: the first line after nothing was written for
    notify_outbox_gather goes to disk at once (a kill -9 just after a lone notice loses
    nothing); the test below shows a line close behind a write waiting to be gathered."""
    now = [1000.0]
    config = Config(notify_outbox_gather=3600.0, notify_outbox_wait=3600.0)
    outbox = Outbox(str(tmp_path), config, clock=lambda: now[0])
    outbox.open(time.time())  # its rewrite is a write, at 1000
    now[0] += 3601.0  # a quiet longer than the gathering
    outbox.told(("idle", "GPU-0"), 1_800_000_000.0)
    wait_for(lambda: '"GPU-0"' in (tmp_path / FILE).read_text(), timeout=60)
    outbox.stop(60)


def test_the_outbox_gathers_its_lines_but_writes_a_tries_start_at_once(tmp_path):
    config = Config(notify_outbox_gather=3600.0, notify_outbox_wait=3600.0)
    outbox = Outbox(str(tmp_path), config)
    outbox.open(time.time())
    outbox.told(("idle", "GPU-9"), 1_800_000_000.0)  # after a quiet: written at once ...
    wait_for(lambda: '"GPU-9"' in (tmp_path / FILE).read_text(), timeout=60)
    notice = Notice("trespass", ("trespass", "GPU-0", "bob", "alice"), "bob", GPU0, "t", "b")
    ident = outbox.queued(notice, "admin", "t", 1)  # ... so this one is gathered (an hour)
    time.sleep(0.2)
    assert f'"{ident}"' not in (tmp_path / FILE).read_text()
    trying = threading.Thread(target=outbox.trying, args=(ident,), daemon=True)
    trying.start()  # a try's start is waited for: written now, and what was gathered with it
    trying.join(60)
    assert not trying.is_alive()
    lines = [json.loads(line) for line in (tmp_path / FILE).read_text().splitlines()]
    assert lines[-2]["q"] == ident and lines[-1] == {"s": ident}
    outbox.told(("idle", "GPU-0"), 1_800_000_000.0)  # gathered ...
    assert outbox.flush(60)  # ... and written at a flush
    outbox.told(("idle", "GPU-1"), 1_800_000_000.0)  # gathered ...
    outbox.stop(60)  # ... and written at the stop
    lines = [json.loads(line) for line in (tmp_path / FILE).read_text().splitlines()]
    assert lines[-2:] == [
        {"e": ["idle", "GPU-0"], "at": 1_800_000_000.0},
        {"e": ["idle", "GPU-1"], "at": 1_800_000_000.0},
    ]
