"""The web page in a real headless Chromium against live daemons: test mode and GPU host mode on
the simulator, with real processes. Under CI=true these run; elsewhere, without a browser,
they are skipped with the reason (tests/browser.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from browser import Browser, browser
from helpers import ScenarioFile, ServerProcess
from prometheus import free_port, get

BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
# The feed sends at most one snapshot a second, so a change is on the page about a second
# later; the deadline leaves room for a busy machine.
FOLLOWS = 3.0
SIZE = (1400, 1000)  # the module's browser's window, as Browser's default
H100 = [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "minor": n} for n in range(4)]


@pytest.fixture(scope="module")
def page():
    opened = browser(width=SIZE[0], height=SIZE[1])
    yield opened
    opened.quit()


@pytest.fixture(scope="module")
def shared():
    """One test-mode daemon for the module's tests that only reserve and release on it."""
    server = ServerProcess("--test", "--lease", "300").start()
    yield server
    assert server.stop() == 0, server.log


@pytest.fixture
def daemon(shared):
    """The shared daemon with every GPU free and nobody waiting, at the start and after."""
    free_all(shared)
    yield shared
    free_all(shared)


def free_all(server: ServerProcess) -> None:
    """Every GPU given back, whoever holds it (test mode lets a request name anyone), and
    nobody left waiting."""
    _, status = call(server, "/status")
    holders = {e["claim"]["user"]["user"] for e in status.values() if e["claim"]["user"]}
    for user in holders:
        assert call(server, "/release", user=user)[0] == 200
    _, status = call(server, "/status")
    assert all(e["claim"]["state"] == "free" for e in status.values()), status
    _, queue = call(server, "/queue")
    assert not queue, queue


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=H100)


def call(server: ServerProcess, path: str, **params: Any) -> Any:
    """The decoded JSON answer of GET path?params."""
    query = urllib.parse.urlencode(params)
    status, _, body = get(server.url + path + (f"?{query}" if query else ""))
    return status, json.loads(body)


def opened(page: Browser, server: ServerProcess) -> None:
    """The page loaded and drawn from its first snapshot; a marker that a reload would lose."""
    page.open(server.url + "/")
    page.until(
        lambda: page.js("return document.body.dataset.rendered === '1'"),
        "the first snapshot drawn",
    )
    page.js("window.notReloaded = true")


def card_where(page: Browser, number: int, what: str, test, timeout: float = FOLLOWS):
    """The card of GPU `number` once test(card) holds."""

    def probe() -> dict[str, Any] | None:
        found = page.card(number)
        return found if found is not None and test(found) else None

    return page.until(probe, f"GPU {number}: {what} (last card: {page.card(number)})", timeout)


def still_the_same_page(page: Browser) -> None:
    assert page.js("return window.notReloaded === true"), "the page reloaded"


def test_the_page_shows_every_gpu_with_its_state_and_figures(page, daemon):
    opened(page, daemon)
    cards = page.cards()
    _, devices = call(daemon, "/devices")
    assert sorted(c["uuid"] for c in cards) == sorted(devices)
    assert [c["number"] for c in cards] == list(range(8))
    for found in cards:
        assert found["state"] == "free"
        assert "NVIDIA A100-SXM4-80GB" in found["text"] and "FREE" in found["text"].upper()
        assert "°C" in found["text"] and "\u00a0W" in found["text"] and "GiB" in found["text"]
    # A utilisation and a memory bar and a sparkline on every card.
    assert page.js("return document.querySelectorAll('.card .bar.util .fill').length") == 8
    assert page.js("return document.querySelectorAll('.card .bar.mem .fill').length") == 8
    assert page.js("return document.querySelectorAll('.card svg.spark').length") == 8
    assert page.js("return document.body.dataset.connection") == "live"
    assert not page.banner_shown()
    # The strict Content-Security-Policy let everything run: nothing refused, no script error.
    errors = [e for e in page.console() if e.get("level") == "SEVERE"]
    assert not errors, errors


def test_a_reservation_appears_without_reloading_and_a_release_shows_free(page, daemon):
    opened(page, daemon)
    status, grant = call(daemon, "/request", gpu=1, user="alice@example.org")
    assert status == 200, grant
    number = grant[0]["info"]["number"]
    found = card_where(
        page,
        number,
        "reserved by alice",
        lambda c: c["state"] == "reserved" and c["holder"] == "alice@example.org",
    )
    assert "lease" in found["text"] and "left" in found["text"]
    # The user and the grant are in the users table and the recent events.
    page.until(
        lambda: page.js(
            "const r = document.querySelector('#users-body tr[data-user=\"alice@example.org\"]');"
            "return r && r.cells[1].textContent === '1'"
        ),
        "alice holding one GPU in the users table",
    )
    page.until(
        lambda: page.js(
            "return Array.from(document.querySelectorAll('#events li')).some("
            "(li) => /grant/.test(li.textContent) && /alice@example.org/.test(li.textContent))"
        ),
        "the grant among the recent events",
    )

    status, _ = call(daemon, "/release", user="alice@example.org")
    assert status == 200
    found = card_where(page, number, "free again", lambda c: c["state"] == "free")
    assert found["holder"] == "free"  # as found: "nobody", which reads like uid 65534's name
    still_the_same_page(page)


def test_the_lease_counts_down_on_the_page(page, daemon):
    opened(page, daemon)
    _, grant = call(daemon, "/request", gpu=1, user="alice@example.org")
    number = grant[0]["info"]["number"]

    def left() -> int | None:
        text = page.js(
            f'const c = document.querySelector(\'.card[data-number="{number}"] '
            ".countdown'); return c ? c.textContent : null"
        )
        if not text:
            return None
        minutes, seconds = text.split()[-2].split(":")[-2:]
        return int(minutes) * 60 + int(seconds)

    first = page.until(left, "a countdown on the reserved GPU")
    assert 280 <= first <= 300, first
    page.until(lambda: (left() or first) < first, "the countdown going down")


def test_a_device_held_for_a_process_says_for_which(page, daemon):
    opened(page, daemon)
    # hold=process binds to the connecting process, found by the kernel: this one.
    status, grant = call(daemon, "/request", gpu=1, user="alice@example.org", hold="process")
    assert status == 200, grant
    number = grant[0]["info"]["number"]
    card_where(
        page,
        number,
        f"held while pid {os.getpid()} lives",
        lambda c: f"while pid {os.getpid()} lives" in c["text"],
    )


def test_the_queue_shows_who_waits_for_how_many(page, daemon):
    opened(page, daemon)
    call(daemon, "/request", gpu=1, user="alice@example.org")
    answers: list[Any] = []
    waiter = threading.Thread(
        target=lambda: answers.append(
            call(daemon, "/wait", gpu=8, timeout=60, user="bob@example.org")
        )
    )
    waiter.start()
    try:
        text = page.until(
            lambda: page.js(
                "const q = document.querySelector('#queue li'); return q ? q.textContent : null"
            ),
            "bob in the queue",
        )
        assert "bob@example.org" in text and "8 gpu" in text and "waiting" in text, text
        assert page.js("return document.getElementById('queue-empty').hidden") is True
    finally:
        call(daemon, "/release", user="alice@example.org")
        waiter.join(30)
    assert answers and answers[0][0] == 200, answers
    page.until(
        lambda: page.js("return document.querySelectorAll('#queue li').length === 0"),
        "an empty queue once bob is served",
    )
    card_where(page, 0, "held by bob", lambda c: c["holder"] == "bob@example.org")


def test_html_from_the_daemon_is_shown_as_text(page, daemon):
    opened(page, daemon)
    name = "<b>x</b><img/src=/nothing/onerror=window.hacked=1>"
    status, grant = call(daemon, "/request", gpu=1, user=name)
    assert status == 200, grant
    found = card_where(
        page,
        grant[0]["info"]["number"],
        "held by the odd name",
        lambda c: c["state"] == "reserved",
    )
    assert found["holder"] == name  # the very characters, as text
    assert found["bold"] == 0, found["holder_html"]  # no element made from them
    assert (
        page.js("return document.querySelectorAll('#gpus b, #users b, #events b, img').length")
        == 0
    )
    assert page.js("return window.hacked === undefined")
    page.until(
        lambda: page.js(
            "return Array.from(document.querySelectorAll('#users-body th'))"
            ".some((th) => th.textContent === arguments[0])",
            name,
        ),
        "the name in the users table",
    )


def test_programs_still_get_json_and_a_browser_gets_the_page(daemon):
    for accept in (None, "*/*", "application/json"):
        status, kind, body = get(daemon.url + "/", accept=accept)
        assert status == 200 and kind.startswith("application/json"), (accept, kind)
        assert json.loads(body)["name"] == "patroller"
    status, kind, body = get(daemon.url + "/", accept=BROWSER_ACCEPT)
    assert status == 200 and kind.startswith("text/html"), kind
    assert b'src="/web/app.js"' in body and b'href="/web/style.css"' in body
    assert b"<script>" not in body and b"style=" not in body  # nothing inline: the CSP holds
    for name, expected in (("app.js", "javascript"), ("style.css", "text/css")):
        status, kind, _ = get(daemon.url + "/web/" + name)
        assert status == 200 and expected in kind, (name, kind)


def test_a_process_shows_its_command_and_memory_in_gpu_host_mode(page, scenario):
    sleeper = subprocess.Popen(["sleep", "120"])
    server = ServerProcess("--nvidia-smi", scenario.command, "--lease", "300").start()
    try:
        opened(page, server)
        assert [c["number"] for c in page.cards()] == [0, 1, 2, 3]
        assert all("H100" in c["text"] for c in page.cards())
        scenario.write(
            processes=[
                {
                    "pid": sleeper.pid,
                    "gpu": 2,
                    "type": "C",
                    "name": "<i>train</i>",
                    "used_mib": 4096,
                    "sm": 60,
                }
            ]
        )
        found = card_where(
            page,
            2,
            "the sleep process listed",
            lambda c: any(p["pid"] == sleeper.pid for p in c["processes"]),
            timeout=20,
        )
        process = next(p for p in found["processes"] if p["pid"] == sleeper.pid)
        # In GiB, as the cards say it (as found: the cards in GiB, the process table in MiB).
        assert process["command"] == "<i>train</i>" and process["memory"] == "4.0 GiB", process
        assert "4.0 GiB / 80 GiB" in found["text"], found["text"]
        assert page.js("return document.querySelectorAll('.procs i').length") == 0
        assert found["state"] in ("claimed", "shared") and found["holder"], found
        scenario.write(processes=[])
        card_where(page, 2, "the process gone", lambda c: not c["processes"], timeout=20)
    finally:
        server.stop()
        sleeper.kill()
        sleeper.wait()


def test_each_card_names_its_nvlink_peers_and_numa_node(page, tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=H100, topology="nvlink-pairs")
    server = ServerProcess("--nvidia-smi", scenario.command).start()
    try:
        opened(page, server)
        found = card_where(
            page,
            2,
            "its NVLink peer and node",
            lambda c: "NVLink\u00a0to\u00a00" in c["text"],
            timeout=20,
        )
        assert "NUMA\u00a01" in found["text"], found["text"]
        assert "NVLink\u00a0to\u00a03" in page.card(1)["text"]
    finally:
        server.stop()


def test_a_stopped_daemon_shows_the_lost_connection_and_the_page_recovers(page):
    port = free_port()
    server = ServerProcess("--test", "--port", str(port)).start()
    try:
        opened(page, server)
        assert page.connection() == "live" and not page.banner_shown()
        server.stop()
        banner = page.until(page.banner_shown, "the lost-connection banner", timeout=10)
        assert "connection to the daemon lost" in banner
        assert page.connection() == "lost"

        server = ServerProcess("--test", "--port", str(port)).start()
        page.until(lambda: page.connection() == "live", "the page live again", timeout=20)
        assert not page.banner_shown()
        # Snapshots of the new daemon arrive: a reservation made there shows.
        status, grant = call(server, "/request", gpu=1, user="carol@example.org")
        assert status == 200, grant
        card_where(
            page,
            grant[0]["info"]["number"],
            "reserved by carol",
            lambda c: c["holder"] == "carol@example.org",
        )
        still_the_same_page(page)
    finally:
        server.stop()


def test_readable_on_a_phone_and_dark_when_the_system_is(daemon):
    phone = browser(width=390, height=844)
    try:
        opened(phone, daemon)
        columns = phone.js(
            "return new Set(Array.from(document.querySelectorAll('.card'))"
            ".map((c) => c.getBoundingClientRect().left)).size"
        )
        assert columns == 1
        assert phone.js("return document.scrollingElement.scrollWidth <= window.innerWidth + 1")
        phone.color_scheme("light")
        light = phone.js("return getComputedStyle(document.body).backgroundColor")
        phone.color_scheme("dark")
        dark = phone.js("return getComputedStyle(document.body).backgroundColor")
        assert light != dark, (light, dark)
        # Dark means dark: the background's brightness is low.
        red, green, blue = (int(v) for v in dark[dark.index("(") + 1 : -1].split(",")[:3])
        assert red + green + blue < 150, dark
    finally:
        phone.quit()


def test_an_idle_reservation_and_a_lost_gpu_in_gpu_host_mode(page, tmp_path):
    devices = [
        dict(
            H100[n],
            uuid=f"GPU-{n}000000-5a1e-4e57-8000-00000000000{n}",
            pci=f"00000000:{n + 1:02X}:00.0",
        )
        for n in range(4)
    ]
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=devices)
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--lease",
        "300",
        "--idle-after",
        "1",
        "--inventory-every",
        "0.5",
    ).start()
    try:
        opened(page, server)
        status, grant = call(server, "/request", gpu=1)  # this host process's account
        assert status == 200, grant
        number = grant[0]["info"]["number"]
        found = card_where(page, number, "reserved and idle", lambda c: c["idle"], timeout=20)
        assert found["state"] == "reserved" and "IDLE" in found["text"].upper(), found
        # The second one falls off the bus: it keeps its number, 1, which nvidia-smi now gives
        # the third; on the page it goes last.
        scenario.write(devices=[devices[0], devices[2], devices[3]])
        gone = devices[1]["uuid"]
        page.until(
            lambda: next(
                (c for c in page.cards() if c["uuid"] == gone and c["state"] == "lost"), None
            ),
            "the lost GPU",
            timeout=20,
        )
        cards = page.cards()
        assert cards[-1]["uuid"] == gone and "LOST" in cards[-1]["text"].upper(), cards[-1]
        assert [c["state"] for c in cards].count("lost") == 1
        assert [c["number"] for c in cards] == [0, 1, 2, 1]
    finally:
        server.stop()


def test_an_unhealthy_gpu_says_why_and_what_to_do_and_a_degraded_one_says_so(page, tmp_path):
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=H100)
    server = ServerProcess("--nvidia-smi", scenario.command, "--inventory-every", "0.5").start()
    try:
        opened(page, server)
        scenario.write(
            devices=[
                H100[0],
                dict(H100[1], health={"remap_pending": True}),
                dict(H100[2], health={"slowdowns": ["hw_thermal_slowdown"]}),
                H100[3],
            ]
        )
        sick = card_where(
            page, 1, "granted to nobody", lambda c: "granted to nobody:" in c["text"], timeout=20
        )
        assert (
            "row remap pending: reset the GPU (`nvidia-smi -r -i 1`) when nothing runs on "
            "it" in sick["text"]
        ), sick
        slowed = card_where(page, 2, "degraded", lambda c: "degraded:" in c["text"])
        assert (
            "clocks slowed (hw_thermal_slowdown): check its cooling and power" in slowed["text"]
            and "granted to nobody" not in slowed["text"]
        ), slowed
        assert "granted to nobody" not in page.card(0)["text"]
        still_the_same_page(page)
    finally:
        server.stop()


def figures(page):
    """Each card's figures and the lines they take, once a held GPU draws three-digit watts."""
    found = page.js(
        "return Array.from(document.querySelectorAll('.card .facts')).map((f) =>"
        " [f.textContent, Math.round(f.getBoundingClientRect().height"
        " / (1.2 * parseFloat(getComputedStyle(f).fontSize)))])"
    )  # lines
    return found if any(re.search(r"\d{3}[ \u00a0]W", t) for t, _ in found) else None


@pytest.fixture(scope="module")
def held():
    """A test-mode daemon of its own with GPU 3 held by alice (its power soon at three digits)."""
    server = ServerProcess("--test", "--lease", "300").start()
    assert call(server, "/request", gpu=3, user="alice@example.org")[0] == 200
    yield server
    assert server.stop() == 0, server.log


@contextlib.contextmanager
def sized(page: Browser, width: int, height: int) -> Iterator[Browser]:
    """The module's browser at `width` x `height`, and back to its own size after."""
    page.resize(width, height)
    try:
        yield page
    finally:
        page.resize(*SIZE)


@pytest.mark.parametrize("width,height", [(1920, 1080), (1366, 768), (390, 844)])
def test_a_cards_figures_keep_their_line(page, held, width, height):
    """As found at 1,920 px: "GPU 39 °C · memory 44 °C · 133" ended a line and "W" stood on
    the next. The figures are one line on every card, the sparkline giving way."""
    with sized(page, width, height) as wide:
        wide.open(held.url + "/")
        assert wide.js("return window.innerWidth") == width
        facts = wide.until(lambda: figures(wide), "a held GPU's power at three digits", 60)
        assert all(lines == 1 for _, lines in facts), facts


USERS = [
    "alice.longname@example.org",
    "bob@example.org",
    "carol.researcher@university.example.edu",
]


@pytest.fixture(scope="module")
def crowded(tmp_path_factory):
    """A test-mode daemon of its own, two GPUs a user at most: alice, bob and carol hold two
    each, then alice's own limit is lowered to one (SIGHUP): she is over it."""
    limits = tmp_path_factory.mktemp("limits") / "limits.json"
    limits.write_text("{}")
    server = ServerProcess(
        "--test", "--lease", "300", "--max-per-user", "2", "--limits-file", str(limits)
    ).start()
    for user in USERS:
        assert call(server, "/request", gpu=2, user=user)[0] == 200
    limits.write_text(json.dumps({USERS[0]: 1}))  # alice's limit lowered: she is over it
    server.process.send_signal(signal.SIGHUP)
    yield server
    assert server.stop() == 0, server.log


@pytest.mark.parametrize("width", [1280, 1920, 2560])
def test_the_users_table_fits_at_every_width_and_a_user_over_the_limit_stands_out(
    page, crowded, width, tmp_path
):
    # As found at 1,920 px: the sidebar overflowed (493 > 446 px), the "waiting" column was
    # hidden and a row wrapped; a user over their limit was not highlighted.
    # Before the first snapshot, no empty-state text claims that nobody waits: the page as
    # served shows none (as found: "nobody is waiting" before anything was known).
    _, _, html = get(crowded.url + "/", accept=BROWSER_ACCEPT)
    empties = re.findall(r'<p id="[a-z]+-empty"[^>]*>', html.decode())
    assert len(empties) == 3 and all(" hidden" in tag for tag in empties), empties
    with sized(page, width, 1200) as wide:
        wide.open(crowded.url + "/")
        assert wide.js("return window.innerWidth") == width
        wide.until(
            lambda: wide.js(
                f"const r = document.querySelector('#users-body tr[data-user=\"{USERS[0]}\"]');"
                "return r && r.dataset.over === '1'"
            ),
            "alice shown over her limit",
        )
        wide.until(
            lambda: wide.js("return document.querySelectorAll('#users-body tr').length") == 3,
            "three users",
        )
        fit = wide.js("""
            const table = document.getElementById('users'), panel = table.closest('.panel');
            const head = table.querySelector('thead tr').getBoundingClientRect().height;
            const rows = Array.from(table.querySelectorAll('tbody tr'));
            const last = table.querySelector('thead th:last-child').getBoundingClientRect();
            return {fits: table.scrollWidth <= panel.clientWidth,
                    lastShown: last.right <= panel.getBoundingClientRect().right,
                    oneLine: rows.every((r) => r.getBoundingClientRect().height < 2 * head),
                    page: document.scrollingElement.scrollWidth <= window.innerWidth + 1,
                    overColour: getComputedStyle(rows[0].cells[0]).color,
                    plainColour: getComputedStyle(rows[1].cells[0]).color};""")
        assert fit["fits"] and fit["lastShown"] and fit["oneLine"] and fit["page"], fit
        assert fit["overColour"] != fit["plainColour"], fit
        # Each card's figures on one line, a three-digit power too (as found at 1,920 px:
        # "133" ended a line and "W" stood on the next).
        facts = wide.until(lambda: figures(wide), "a held GPU's power at three digits", 60)
        assert all(lines == 1 for _, lines in facts), facts
        wide.screenshot(str(tmp_path / f"page-{width}.png"))


def test_a_gpu_allocated_to_a_slurm_job_shows_the_job_and_its_user(page, tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    server = ServerProcess("--test", "--slurm-job-map", str(jobs)).start()
    try:
        opened(page, server)
        (jobs / ".3.new").write_text("4242 uid=1001 user=carol account=physics\n")
        os.replace(jobs / ".3.new", jobs / "3")
        card = card_where(
            page,
            3,
            "allocated to job 4242",
            lambda c: c["state"] == "allocated" and "Slurm job 4242" in c["text"],
        )
        assert card["holder"] == "carol" and "job 4242 · physics" in card["text"]
        os.remove(jobs / "3")
        card_where(page, 3, "free again", lambda c: c["state"] == "free")
        still_the_same_page(page)
    finally:
        server.stop()


def test_a_gpu_assigned_to_a_pod_shows_the_pod(page, tmp_path):
    from kubelet import Kubelet, gpu_pod

    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    server = ServerProcess("--test", "--kubelet-socket", kubelet.path).start()
    try:
        opened(page, server)
        _, devices = call(server, "/devices")
        uuid = next(u for u, d in devices.items() if d["number"] == 2)
        kubelet.pods = [gpu_pod("ml", "train-0", uuid)]
        card = card_where(
            page,
            2,
            "allocated to pod ml/train-0",
            lambda c: c["state"] == "allocated" and "Kubernetes pod ml/train-0" in c["text"],
        )
        assert card["holder"] == "namespace:ml"
        kubelet.pods = []
        card_where(page, 2, "free again", lambda c: c["state"] == "free")
        still_the_same_page(page)
    finally:
        server.stop()
        kubelet.stop()
