"""The fleet view (--fleet): a daemon that asks three real daemons (one stopped) and a host that
accepts and never answers for their GPUs, and serves them on /fleet.json and the /fleet page.
Every host is asked at once, each with its own timeout: the silent one holds up neither the
others nor the page, the dead ones are marked with since when, and a host that comes back is
shown again by itself."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from typing import Any

import pytest
from browser import browser
from helpers import ServerProcess, async_test, running
from prometheus import get

TIMEOUT = 4.0  # --fleet-timeout: long, so that whatever waits on the silent host shows it
INTERVAL = 0.5  # --fleet-interval
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


def fleet_json(server: ServerProcess) -> tuple[float, dict[str, Any]]:
    """(seconds it took, the answer) of GET /fleet.json."""
    began = time.monotonic()
    status, kind, body = get(server.url + "/fleet.json", timeout=30)
    assert status == 200 and kind.startswith("application/json"), (status, body[:300])
    return time.monotonic() - began, json.loads(body)


def by_host(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {host["host"]: host for host in answer["hosts"]}


def call(server: ServerProcess, path: str, **params: Any) -> tuple[int, Any]:
    status, _, body = get(f"{server.url}{path}?{urllib.parse.urlencode(params)}")
    return status, json.loads(body)


def silent_host() -> socket.socket:
    """A host that accepts connections (the kernel's backlog) and never answers."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    return silent


def address(sock: socket.socket) -> str:
    return f"127.0.0.1:{sock.getsockname()[1]}"


def fleet_daemon(hosts: list[str]) -> ServerProcess:
    return ServerProcess(
        "--test",
        "--fleet",
        ",".join(hosts),
        "--fleet-interval",
        str(INTERVAL),
        "--fleet-timeout",
        str(TIMEOUT),
    ).start()


@dataclass
class Fleet:
    live: list[ServerProcess]
    stopped: ServerProcess  # stopped before the fleet daemon started: its port refuses
    silent: socket.socket
    hosts: list[str]  # as the fleet daemon was given them
    daemon: ServerProcess  # the fleet daemon
    started: float  # monotonic time the fleet daemon was listening
    first: dict[str, Any]  # its first answer with both live hosts up
    first_after: float  # seconds after `started`


@pytest.fixture(scope="module")
def fleet():
    live = [ServerProcess("--test", "--lease", "300").start() for _ in range(3)]
    stopped = live.pop()
    stopped.stop()
    silent = silent_host()
    # The silent host first: a daemon that asked its hosts one after another would reach the
    # others only after the silent one's timeout.
    hosts = [address(silent), live[0].server, stopped.server, live[1].server]
    assert call(live[0], "/request", gpu=1, user="alice@example.org")[0] == 200
    daemon = fleet_daemon(hosts)
    started = time.monotonic()
    try:
        while True:
            _, first = fleet_json(daemon)
            if all(by_host(first).get(s.server, {}).get("state") == "up" for s in live):
                break
            assert time.monotonic() - started < 30, first
            time.sleep(0.05)
        yield Fleet(
            live, stopped, silent, hosts, daemon, started, first, time.monotonic() - started
        )
    finally:
        daemon.stop()
        for server in live:
            server.stop()
        silent.close()


def until_json(fleet: Fleet, what: str, test, timeout: float = 20) -> dict[str, Any]:
    """The first /fleet.json answer for which test(answer) holds; each must come at once."""
    deadline = time.monotonic() + timeout
    while True:
        took, answer = fleet_json(fleet.daemon)
        assert took < 1.0, f"/fleet.json took {took:.2f} s"
        if test(answer):
            return answer
        assert time.monotonic() < deadline, f"{what}: not seen; last: {answer}"
        time.sleep(0.05)


def test_the_live_hosts_are_shown_before_the_silent_one_times_out(fleet):
    first = by_host(fleet.first)
    assert fleet.first_after < TIMEOUT, fleet.first_after
    assert first[fleet.hosts[0]]["state"] == "asking", first[fleet.hosts[0]]
    assert first[fleet.hosts[0]]["gpus"] == [] and first[fleet.hosts[0]]["free"] is None
    assert len(first[fleet.live[0].server]["gpus"]) == 8


def test_fleet_json_lists_every_gpu_and_marks_the_dead_hosts(fleet):
    answer = until_json(
        fleet,
        "the silent host marked",
        lambda a: by_host(a)[fleet.hosts[0]]["state"] == "not answering",
        timeout=TIMEOUT + 10,
    )
    hosts = by_host(answer)
    assert [h["host"] for h in answer["hosts"]] == fleet.hosts
    silent, stopped = hosts[fleet.hosts[0]], hosts[fleet.stopped.server]
    assert silent["error"] == f"no answer within {TIMEOUT:g}s", silent
    assert stopped["state"] == "refused" and stopped["error"] == "connection refused", stopped
    for dead in (silent, stopped):
        assert dead["gpus"] == [] and dead["free"] is None and dead["last_seen"] is None, dead
        assert dead["since"] and dead["checked"], dead
    alice, bob = hosts[fleet.live[0].server], hosts[fleet.live[1].server]
    for up in (alice, bob):
        assert up["state"] == "up" and up["error"] is None and up["last_seen"], up
        assert [g["number"] for g in up["gpus"]] == list(range(8))
        assert all(g["name"] == "NVIDIA A100-SXM4-80GB" and g["fb_total"] for g in up["gpus"])
    [held] = [g for g in alice["gpus"] if g["state"] != "free"]
    assert held["state"] == "reserved" and held["user"]["user"] == "alice@example.org", held
    assert (alice["free"], bob["free"]) == (7, 8)
    assert answer["totals"] == {
        "hosts": 4,
        "answering": 2,
        "gpus": 16,
        "free": 15,
        "states": {"free": 15, "reserved": 1},
    }
    assert (answer["interval"], answer["timeout"]) == (INTERVAL, TIMEOUT)


def test_a_live_host_is_asked_every_interval_whatever_the_silent_one_does(fleet):
    checked = set()
    deadline = time.monotonic() + 4 * TIMEOUT
    while len(checked) < 4:  # four askings ended
        checked.add(by_host(fleet_json(fleet.daemon)[1])[fleet.live[1].server]["checked"])
        assert time.monotonic() < deadline, checked
        time.sleep(0.05)
    # On the daemon's clock, every 0.5 s; a host asked only with the silent one, every 4 s.
    ended = sorted(datetime.fromisoformat(c).timestamp() for c in checked)
    assert max(b - a for a, b in pairwise(ended)) < TIMEOUT / 2, checked


def test_a_host_that_comes_back_is_shown_again_by_itself(fleet):
    host = fleet.stopped.server
    until_json(fleet, "the stopped host refused", lambda a: by_host(a)[host]["state"] == "refused")
    port = host.rsplit(":", 1)[1]
    again = ServerProcess("--test", "--port", port).start()
    try:
        back = until_json(fleet, "the host back", lambda a: by_host(a)[host]["state"] == "up")
        assert len(by_host(back)[host]["gpus"]) == 8 and by_host(back)[host]["free"] == 8
    finally:
        again.stop()
    gone = until_json(
        fleet, "the host gone again", lambda a: by_host(a)[host]["state"] == "refused"
    )
    assert by_host(gone)[host]["last_seen"] is not None  # now it was seen, and says when


def host_panels(page) -> list[dict[str, Any]]:
    return page.js("""
        return Array.from(document.querySelectorAll('#hosts section.host')).map((s) => ({
          host: s.dataset.host, state: s.dataset.state, text: s.innerText,
          rows: Array.from(s.querySelectorAll('tr.gpu')).map((r) => ({
            number: Number(r.dataset.number), state: r.dataset.state, user: r.dataset.user,
            text: r.innerText}))}));""")


def panel_where(page, host: str, what: str, test, timeout: float = 15) -> dict[str, Any]:
    def probe():
        found = next((p for p in host_panels(page) if p["host"] == host), None)
        return found if found is not None and test(found) else None

    return page.until(probe, f"{host}: {what}", timeout)


def test_the_page_shows_every_host_and_follows_a_reservation(fleet):
    page = browser()
    bob = fleet.live[1]
    try:
        page.open(fleet.daemon.url + "/fleet")
        page.until(
            lambda: page.js("return document.body.dataset.rendered === '1'"),
            "the first answer drawn",
        )
        panel_where(
            page,
            fleet.hosts[0],
            "marked not answering",
            lambda p: p["state"] == "not answering",
            timeout=TIMEOUT + 10,
        )
        panels = {p["host"]: p for p in host_panels(page)}
        assert list(panels) == fleet.hosts
        for server in fleet.live[:2]:
            shown = panels[server.server]
            assert shown["state"] == "up" and [r["number"] for r in shown["rows"]] == list(
                range(8)
            )
            assert all("A100" in r["text"] and "GiB" in r["text"] for r in shown["rows"])
        [held] = [r for r in panels[fleet.live[0].server]["rows"] if r["state"] != "free"]
        assert held["state"] == "reserved" and held["user"] == "alice@example.org"
        assert "alice@example.org" in held["text"]
        stopped = panels[fleet.stopped.server]
        assert stopped["state"] == "refused" and not stopped["rows"]
        assert "refused since" in stopped["text"] and "connection refused" in stopped["text"]
        silent = panels[fleet.hosts[0]]
        assert "not answering since" in silent["text"] and "no answer within" in silent["text"]
        summary = page.js("return document.getElementById('summary').textContent")
        assert summary.startswith("4 hosts: ") and "2 up" in summary, summary
        page.js("window.notReloaded = true")

        status, grant = call(bob, "/request", gpu=1, user="bob@example.org")
        assert status == 200, grant
        number = grant[0]["info"]["number"]
        panel_where(
            page,
            bob.server,
            "bob's reservation",
            lambda p: any(
                r["number"] == number
                and r["state"] == "reserved"
                and r["user"] == "bob@example.org"
                for r in p["rows"]
            ),
        )
        call(bob, "/release", user="bob@example.org")
        panel_where(
            page,
            bob.server,
            "all free again",
            lambda p: all(r["state"] == "free" for r in p["rows"]),
        )
        assert page.js("return window.notReloaded === true"), "the page reloaded"
        errors = [e for e in page.console() if e.get("level") == "SEVERE"]
        assert not errors, errors
        # On a phone's width: a block per GPU, nothing to scroll sideways.
        page.driver.set_window_size(390, 844)
        page.until(
            lambda: page.js(
                "return document.scrollingElement.scrollWidth <= window.innerWidth + 1"
            ),
            "no sideways scrolling on a phone",
        )
    finally:
        page.quit()
        call(bob, "/release", user="bob@example.org")


def compact_rows(page) -> list[dict[str, Any]]:
    """Each host's line as the page shows it: compact or not, its summary, its squares, how
    tall its panel is and how many GPU rows are visible."""
    return page.js("""
        return Array.from(document.querySelectorAll('#hosts section.host')).map((s) => ({
          host: s.dataset.host, compact: s.classList.contains('is-compact'),
          summary: s.querySelector('.host-summary').textContent,
          cells: Array.from(s.querySelectorAll('.strip .cell')).map((c) => c.title),
          free_cells: s.querySelectorAll('.strip .cell.is-free').length,
          height: s.getBoundingClientRect().height,
          visible_rows: Array.from(s.querySelectorAll('tr.gpu'))
            .filter((r) => r.offsetParent !== null).length}));""")


def test_a_fleet_of_three_by_eight_is_a_line_per_host_that_opens(fleet, tmp_path):
    """3 x 8 GPUs scrolled at 1,080 px: more than 16 GPUs start as a line per host (free and
    held counts, a square per GPU), each host opens and closes by itself, the page-wide button
    opens them all and the browser remembers that; all without scrolling at 1920 x 1080."""
    third = ServerProcess("--test", "--lease", "300").start()
    assert call(third, "/request", gpu=3, user="carol@example.org")[0] == 200
    daemon = fleet_daemon([s.server for s in fleet.live[:2]] + [third.server])
    page = browser(width=1920, height=1080)
    try:
        page.open(daemon.url + "/fleet")
        hosts = [s.server for s in fleet.live[:2]] + [third.server]
        rows = page.until(
            lambda: (
                lambda r: r if len(r) == 3 and all(len(h["cells"]) == 8 for h in r) else None
            )(compact_rows(page)),
            "three hosts drawn",
        )
        assert [r["host"] for r in rows] == hosts
        assert all(r["compact"] and r["visible_rows"] == 0 for r in rows), rows
        by = {r["host"]: r for r in rows}
        assert by[fleet.live[0].server]["summary"] == "7 free, 1 held of 8 GPUs"
        assert by[third.server]["summary"] == "5 free, 3 held of 8 GPUs"
        assert by[third.server]["free_cells"] == 5
        assert sum("reserved: carol@example.org" in t for t in by[third.server]["cells"]) == 3
        assert all(r["height"] < 60 for r in rows), rows  # one line each
        assert page.js("return document.scrollingElement.scrollHeight <= window.innerHeight")
        page.screenshot(str(tmp_path / "compact.png"))

        page.js(
            "document.querySelector(`section.host[data-host='${arguments[0]}'] "
            "button.toggle`).click()",
            third.server,
        )
        opened = page.until(
            lambda: next(
                (
                    r
                    for r in compact_rows(page)
                    if r["host"] == third.server and r["visible_rows"] == 8
                ),
                None,
            ),
            "the third host opened",
        )
        assert not opened["compact"]
        page.js(
            "return new Promise((done) => { const n = document.body.dataset.snapshots; "
            "const t = setInterval(() => { if (document.body.dataset.snapshots !== n) "
            "{ clearInterval(t); done(); } }, 50); })"
        )  # a new answer drawn: still open
        assert [r["compact"] for r in compact_rows(page)] == [True, True, False]
        page.screenshot(str(tmp_path / "one-open.png"))

        page.js("document.getElementById('compact').click()")
        page.until(
            lambda: all(not r["compact"] and r["visible_rows"] == 8 for r in compact_rows(page)),
            "every GPU shown",
        )
        page.open(daemon.url + "/fleet")  # remembered by this browser
        page.until(
            lambda: (
                lambda r: (
                    len(r) == 3 and all(not h["compact"] and h["visible_rows"] == 8 for h in r)
                )
            )(compact_rows(page)),
            "every GPU shown after a reload",
        )
        assert not [e for e in page.console() if e.get("level") == "SEVERE"]
    finally:
        page.quit()
        daemon.stop()
        third.stop()


def test_many_silent_hosts_hold_up_no_live_one_and_the_daemon_stops_at_once(fleet):
    silent = [silent_host() for _ in range(6)]
    # The live host last: 14 requests at once, more than a client's default ten connections.
    daemon = fleet_daemon([address(s) for s in silent] + [fleet.live[1].server])
    started = time.monotonic()
    try:
        while by_host(fleet_json(daemon)[1])[fleet.live[1].server]["state"] != "up":
            assert time.monotonic() - started < TIMEOUT / 2, "the live host held up"
            time.sleep(0.05)
        began = time.monotonic()
        assert daemon.stop(signal.SIGTERM) == 0  # with every silent host's request in flight
        assert time.monotonic() - began < 5
        assert "stopped" in daemon.log and "Traceback" not in daemon.log, daemon.log
    finally:
        daemon.stop()
        for sock in silent:
            sock.close()


@async_test
async def test_without_fleet_the_fleet_pages_say_how_to_have_them():
    async with running() as h:
        for path in ("/fleet", "/fleet.json"):
            status, body = await h.call(path)
            assert status == 404 and "--fleet" in body["error"], (path, body)
        # A browser gets the same JSON, and other methods are not allowed, as everywhere.
        response = await h.http.fetch(
            h.url + "/fleet", headers={"Accept": BROWSER_ACCEPT}, raise_error=False
        )
        assert response.code == 404 and "--fleet" in json.loads(response.body)["error"]
        assert (await h.call("/fleet.json", "POST", b""))[0] == 405
        assert "/fleet.json" in (await h.ok("/"))["endpoints"]


@async_test
async def test_the_hosts_are_asked_no_more_once_the_daemon_stopped():
    connections = []

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(time.monotonic())
        writer.close()  # no answer: a host that fails

    host = await asyncio.start_server(count, "127.0.0.1", 0)
    port = host.sockets[0].getsockname()[1]
    try:
        async with running(
            fleet=(f"127.0.0.1:{port}",), fleet_interval=0.5, fleet_timeout=1.0
        ) as h:
            while len(connections) < 4:
                await asyncio.sleep(0.05)
            answer = await h.ok("/fleet.json")
            assert answer["hosts"][0]["state"] == "failed", answer
            loops = set(h.api.fleet.tasks)
            assert len(loops) == 1 and not any(loop.done() for loop in loops)
        asked = len(connections)
        assert all(loop.done() for loop in loops)
        await asyncio.sleep(1.5)  # three intervals
        assert len(connections) == asked
    finally:
        host.close()
        await host.wait_closed()


def test_the_fleet_page_is_the_package_page_under_the_strict_policy(fleet):
    status, kind, body = get(fleet.daemon.url + "/fleet", accept=BROWSER_ACCEPT)
    assert status == 200 and kind.startswith("text/html"), (status, kind)
    assert b'src="/web/fleet.js"' in body and b'href="/web/style.css"' in body
    assert b"<script>" not in body and b"style=" not in body
    for name, expected in (("fleet.js", "javascript"), ("fleet.css", "text/css")):
        status, kind, _ = get(fleet.daemon.url + "/web/" + name)
        assert status == 200 and expected in kind, (name, kind)
