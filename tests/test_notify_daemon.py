"""Notifications from a real daemon on the simulator, through Apprise, to real receivers: an
SMTP server (aiosmtpd) and an HTTP server taking JSON webhooks, beside a destination that
accepts and never answers. A trespass by another uid's process, a GPU that falls off the bus
and a wait granted each reach both receivers once, word for word; the hung destination slows
nothing; no URL's secret appears anywhere; the audit record has a line for each notice at each
destination. And: a daemon without Apprise starts as today, and one given a URL Apprise does
not take refuses to start without repeating it."""

import asyncio
import base64
import json
import os
import re
import socket
import subprocess
import sys

import pytest
from helpers import (
    NOBODY,
    ROOT,
    ScenarioFile,
    ServerProcess,
    async_test,
    find,
    gpu_running,
    scrape,
    until,
)
from receivers import Hooks, Silent, Smtp

SECRET = "s3cr3t-t0ken"
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d UTC"
HOST = socket.gethostname()


def devices(count):
    return [
        {
            "uuid": f"GPU-{n}000000-5a1e-4e57-8000-00000000000{n}",
            "pci": f"00000000:{n + 1:02X}:00.0",
        }
        for n in range(count)
    ]


def told(receiver_texts, title):
    """The one notice with `title` a receiver got (it must have got it exactly once)."""
    found = [t for t in receiver_texts if t["title"] == title]
    assert len(found) == 1, (title, receiver_texts)
    return found[0]["body"]


@async_test
async def test_each_kind_reaches_email_and_webhook_once_and_a_hung_destination_harms_nothing(
    tmp_path,
):
    listed = devices(3)
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=listed)
    audit = tmp_path / "audit.jsonl"
    stranger = subprocess.Popen(["sleep", "120"], user=NOBODY)
    with Smtp() as smtp, Hooks() as hooks, Silent() as silent:
        settings = dict(
            inventory_every=0.5,
            notify=(smtp.url(), hooks.url(SECRET), silent.url()),
            audit_log=str(audit),
            notify_timeout=1.0,
            notify_tries=2,
            notify_retry_first=0.2,
            notify_escalate=0,
            notify_events=("trespass", "granted", "lost"),
        )
        try:
            async with gpu_running(scenario, **settings) as h:
                await h.ok("/request?gpu=3&hold=1h")
                by_number = {d.number: d.uuid for d in h.services.inventory}
                waiter = asyncio.ensure_future(h.call("/wait?gpu=1", timeout=60))
                await until(lambda: len(h.services.leases.waiters) == 1)
                # another uid's process on GPU 0, which root holds: a trespass
                scenario.write(
                    processes=[
                        {
                            "pid": stranger.pid,
                            "gpu": 0,
                            "name": "python",
                            "used_mib": 1000,
                            "sm": 30,
                        }
                    ]
                )
                await until(lambda: len(hooks.bodies) == 1, timeout=30)
                # the silent destination holds its connection: /status answers meanwhile
                await until(lambda: silent.open >= 1, timeout=10)
                assert len(await h.ok("/status")) == 3
                # GPU 2 falls off the bus
                scenario.write(devices=listed[:2])
                await until(lambda: len(hooks.bodies) == 2, timeout=30)
                # GPU 1 released: the waiter is granted it
                await h.ok(f"/release?uuid={by_number[1]}")
                status, granted = await waiter
                assert status == 200, granted
                await until(lambda: len(hooks.bodies) == 3 and len(smtp.messages) == 3, timeout=30)
                # each receiver has a notice before its sender hears the answer: wait on both
                await until(
                    lambda: all(
                        h.services.notifier.metrics()["by_kind"].get(kind, {}).get(result) == count
                        for kind in ("trespass", "lost", "granted")
                        for result, count in (("sent", 2), ("failed", 1))
                    ),
                    timeout=30,
                )
                await until(
                    lambda: (
                        len([e for e in h.services.audit.recent if e["event"] == "notify"]) == 9
                    )
                )
                metrics = h.services.notifier.metrics()
                served = await h.ok("/metrics.json")
                scraped, _, text = await scrape(h)
                log_status = json.dumps(await h.ok("/status"))
        finally:
            stranger.kill()
    webhook = [{"title": b["title"], "body": b["message"]} for b in hooks.bodies]
    mail = [{"title": m["subject"], "body": m["text"]} for m in smtp.texts()]
    assert all(to == "admin@lab.example" for _, [to], _ in smtp.messages)
    for got in (webhook, mail):
        body = told(got, f"{HOST}: trespass on GPU 0 by nobody")
        assert re.fullmatch(
            f"nobody runs process {stranger.pid} \\(python\\) on GPU 0 of {re.escape(HOST)} "
            f"\\(since "
            f"{WHEN}\\), which is held by root. The run is to move to a free GPU "
            r"\(`patroller status` shows which\), reserved first \(`patroller run`\).",
            body,
        ), body
        body = told(got, f"{HOST}: GPU 2 is lost")
        assert re.fullmatch(
            f"GPU 2 of {re.escape(HOST)}, held by root, is gone from nvidia-smi's list or has "
            f"stopped reporting, since {WHEN}. Nobody is granted it until it is back; its "
            r"holder keeps it. Look at the kernel log \(Xid errors\) and `nvidia-smi` on the "
            "host; a reset or a reboot may be needed.",
            body,
        ), body
        [granted_title] = [t["title"] for t in got if "granted" in t["title"]]
        assert re.fullmatch(
            f"{re.escape(HOST)}: GPU 1 granted to root after [0-9.]+s", granted_title
        ), granted_title
        body = told(got, granted_title)
        assert re.fullmatch(
            f"root waited [0-9.]+s and now holds GPU 1 of {re.escape(HOST)} "
            f"\\(since {WHEN}\\). Start the run now: the reservation is held "
            "for a short lease until its process shows up on the GPU.",
            body,
        ), body
    # Each kind: sent to both receivers, failed at the silent one after its two tries.
    for kind in ("trespass", "lost", "granted"):
        assert metrics["by_kind"][kind] == {
            "queued": 3,
            "sent": 2,
            "failed": 1,
            "retried": 1,
            "dropped": 0,
        }, metrics
    assert metrics["repeats"] >= 0 and metrics["state"] == "on"
    assert served["notifications"]["destinations"] == 3
    for kind in ("trespass", "lost", "granted"):
        assert find(scraped, "patroller_notifications_total", kind=kind, result="sent") == [2.0]
        assert find(scraped, "patroller_notifications_total", kind=kind, result="failed") == [1.0]
    assert SECRET not in text
    # The webhook's password went to the webhook alone.
    assert (
        hooks.authorizations[0]
        == "Basic " + base64.b64encode(f"patroller:{SECRET}".encode()).decode()
    )
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    notes = [r for r in records if r["event"] == "notify"]
    assert sorted((n["kind"], n["destination"], n["result"]) for n in notes) == sorted(
        (kind, number, "sent" if number < 3 else "failed")
        for kind in ("trespass", "lost", "granted")
        for number in (1, 2, 3)
    )
    assert all(n["recipient"] == "admin" for n in notes)
    assert SECRET not in audit.read_text() and SECRET not in log_status
    assert SECRET not in json.dumps(served)


@async_test
async def test_an_episode_is_told_once_then_again_after_the_repeat(tmp_path):
    """The same trespasser on the same GPU is one episode: her process ending and another
    starting is not told again within --notify-repeat; a GPU back and lost again is."""
    listed = devices(2)
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=listed)
    with Hooks() as hooks:
        async with gpu_running(
            scenario,
            inventory_every=0.3,
            notify=(hooks.url(),),
            notify_events=("trespass", "lost"),
            notify_escalate=0,
        ) as h:
            await h.ok("/request?gpu=2&hold=1h")
            for _ in range(2):
                stranger = subprocess.Popen(["sleep", "120"], user=NOBODY)
                try:
                    scenario.write(processes=[{"pid": stranger.pid, "gpu": 1, "name": "python"}])
                    await until(
                        lambda: any(
                            e["event"] == "trespass" and e.get("pid") == stranger.pid
                            for e in h.services.audit.recent
                        ),
                        timeout=30,
                    )
                    scenario.write(processes=[])
                    gone = listed[1]["uuid"]
                    while (await h.ok("/status"))[gone]["claim"]["processes"]:  # she left
                        await asyncio.sleep(0.05)
                finally:
                    stranger.kill()
            await until(lambda: h.services.notifier.repeats == 1, timeout=10)
            assert [b["title"] for b in hooks.bodies] == [f"{HOST}: trespass on GPU 1 by nobody"]
            for _ in range(2):  # lost, back, lost again: each told
                scenario.write(devices=listed[:1])
                await until(lambda: h.services.leases.state(listed[1]["uuid"]) == "lost", 30)
                scenario.write(devices=listed)
                await until(lambda: h.services.leases.state(listed[1]["uuid"]) != "lost", 30)
            await until(lambda: len(hooks.bodies) == 5, timeout=30)
    titles = [b["title"] for b in hooks.bodies[1:]]
    assert titles == [f"{HOST}: GPU 1 is lost", f"{HOST}: GPU 1 is back"] * 2


NO_APPRISE = "raise ImportError('No module named apprise (hidden by the test)')\n"


def test_without_apprise_the_daemon_starts_as_today_and_says_how(tmp_path):
    hidden = tmp_path / "hidden"
    (hidden / "apprise").mkdir(parents=True)
    (hidden / "apprise" / "__init__.py").write_text(NO_APPRISE)
    env = {"PYTHONPATH": f"{hidden}{os.pathsep}{ROOT}"}
    server = ServerProcess(
        "--test", "--notify", f"json://user:{SECRET}@127.0.0.1:9/x", env=env
    ).start()
    try:
        assert (
            "notifications are off: Apprise is not installed: pip install "
            "'patroller[notify]'" in server.log
        )
    finally:
        assert server.stop() == 0
    assert SECRET not in server.log
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "patroller",
            "doctor",
            "--json",
            "--test",
            "--port",
            "0",
            "--notify",
            f"json://user:{SECRET}@127.0.0.1:9/x",
        ],
        cwd=ROOT,
        env={**os.environ, **env, "PATROLLER_STATE_DIR": ""},
        capture_output=True,
        text=True,
        timeout=120,
    )
    [found] = [r for r in json.loads(done.stdout) if r["check"] == "notifications"]
    assert found["status"] == "degraded" and found["fix"] == "pip install 'patroller[notify]'"
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "url, said",
    [
        (
            f"nosuch://user:{SECRET}@host/x",
            "--notify: URL 2 (nosuch://...) is not one Apprise knows",
        ),
        (f"no-scheme-{SECRET}", "--notify: URL 2 is not a URL of the form scheme://..."),
    ],
)
def test_a_url_that_cannot_be_used_stops_the_start_naming_it_by_number_alone(url, said):
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "patroller",
            "--test",
            "--port",
            "0",
            "--address",
            "127.0.0.1",
            "--notify",
            "json://127.0.0.1:9/x",
            "--notify",
            url,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT, "PATROLLER_STATE_DIR": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode in (1, 2), process.stderr
    # One line, the refusal: Apprise's own log, which names a URL it cannot parse with its
    # password's first and last letters, is kept quiet.
    [line] = [
        x
        for x in process.stderr.splitlines()
        if "DeprecationWarning" not in x and not x.startswith("  ")
    ]
    assert line.startswith(("patroller: " + said, "patroller: error: " + said)), line
    assert SECRET not in process.stdout + process.stderr


@async_test
async def test_the_watch_tells_of_idle_and_ending_holds_unreserved_use_and_escalates(tmp_path):
    """What no single event says: a hold that computes nothing, a hold about to end, a GPU
    taken without asking, and a trespass still going on after --notify-escalate, which alone
    reaches the admin; the users reach the host's default for them ({user} in its path)."""
    listed = devices(2)
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=listed)
    stranger = subprocess.Popen(["sleep", "120"], user=NOBODY)
    with Hooks() as admin, Hooks() as users:
        settings = dict(
            notify=(admin.url(),),
            notify_check_every=0.2,
            notify_before=60,
            notify_idle_after=0.5,
            notify_escalate=1.0,
            notify_user_default=f"json://127.0.0.1:{users.port}/" + "{user}",
        )
        try:
            async with gpu_running(scenario, **settings) as h:
                await h.ok("/request?gpu=1&hold=30s")  # GPU 0, idle, ending within a minute
                await until(lambda: {"idle", "expiring"} <= kinds(admin), timeout=30)
                scenario.write(
                    processes=[  # GPU 1 taken unasked; GPU 0 trespassed on
                        {"pid": stranger.pid, "gpu": 1, "name": "python", "sm": 50},
                        {"pid": stranger.pid, "gpu": 0, "name": "python", "sm": 50},
                    ]
                )
                await until(lambda: "unreserved" in kinds(admin), timeout=30)
                await until(lambda: "trespass" in kinds(admin), timeout=30)
                told_users = {
                    (b["title"].split(": ", 1)[1], path)
                    for b, path in zip(users.bodies, users.paths, strict=True)
                }
        finally:
            stranger.kill()
    titles = [b["title"].split(": ", 1)[1] for b in admin.bodies]
    assert "GPU 0 held idle by root for " in " ".join(titles)
    assert any(t.startswith("the hold of GPU 0 by root ends at ") for t in titles), titles
    assert "GPU 1 used by nobody without a reservation" in titles
    [escalated] = [b for b in admin.bodies if "trespass" in b["title"]]
    assert escalated["title"].endswith("trespass on GPU 0 by nobody, for 1s")
    assert escalated["message"].endswith(
        "It has gone on for 1s; the users concerned were told when it began."
    )
    assert ("trespass on GPU 0 by nobody", "/nobody") in told_users
    assert ("trespass on GPU 0 by nobody", "/root") in told_users
    assert ("GPU 1 used by nobody without a reservation", "/nobody") in told_users
    assert any(
        path == "/root" and t.startswith("the hold of GPU 0 by root ends at ")
        for t, path in told_users
    )


def kinds(hooks):
    found = set()
    for body in hooks.bodies:
        title = body["title"]
        found |= {
            kind
            for kind, word in (
                ("idle", " held idle by "),
                ("expiring", "the hold of"),
                ("unreserved", "without a reservation"),
                ("trespass", "trespass on"),
            )
            if word in title
        }
    return found


@async_test
async def test_a_failing_nvidia_smi_reaches_the_admin_as_the_daemons_trouble(tmp_path):
    scenario = ScenarioFile(
        str(tmp_path / "scenario.json"), devices=devices(1), faults={"pmon": {"fail": "gpu_lost"}}
    )
    with Hooks() as admin:
        async with gpu_running(
            scenario, notify=(admin.url(),), notify_check_every=0.2, notify_trouble_after=0.5
        ) as h:
            await until(lambda: admin.bodies, timeout=30)
            troubles = h.services.troubles()
    assert ("monitor-pmon", "pmon is failing: what it watches is not seen") in [
        (key, what) for key, what, _ in troubles
    ]
    [told] = admin.bodies
    assert told["title"] == f"{HOST}: pmon is failing: what it watches is not seen"
    assert told["message"].endswith(
        "Run `patroller doctor` on the host, and look at the "
        "daemon's log for how its command ends."
    )
