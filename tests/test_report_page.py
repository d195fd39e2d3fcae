"""The usage report's page (/report) in a real headless Chromium against real daemons whose usage
store holds a lab's weeks (tests/usage_history.py): the bars are as tall as /usage's GPU-hours,
the heatmap's cells and the lists are /usage's, the range control asks for the range chosen, an
empty store and a daemon without one say so, and --hide-users shows each caller their own name
and root every name. Under CI=true these run; elsewhere, without a browser, they are skipped
with the reason (tests/browser.py)."""

from __future__ import annotations

import json
import shutil
import time
import urllib.parse
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from browser import Browser, browser
from helpers import ScenarioFile, ServerProcess, need_root
from prometheus import get
from test_hide_users import PSEUDONYM
from usage_history import gpu_hour, lab, write

from patroller.cli.usage import hours_text

USED = ("active", "idle_held", "reserved_unused", "trespass", "unreserved")
CATEGORIES = (*USED, "free", "lost")
ZONE = "America/New_York"  # the browser's: days and hours are not UTC's
LAB_USERS = {"alice", "bob", "carol", "dave", "erin", "frank"}


@pytest.fixture(scope="module")
def page():
    opened = browser()
    yield opened
    opened.quit()


def store_daemon(state, *args: str) -> ServerProcess:
    """A test-mode daemon over the store in `state`; it samples once an hour, so that what the
    page shows is what was written."""
    return ServerProcess(
        "--test", "--state-dir", str(state), "--usage-interval", "1h", *args
    ).start()


@pytest.fixture(scope="module")
def lab_file(tmp_path_factory):
    """A store's file holding a lab's 40 days, to copy into each daemon's state directory."""
    path = tmp_path_factory.mktemp("lab") / "usage.sqlite3"
    write(str(path), lab(time.time(), 40))
    return path


def lab_state(lab_file, where):
    """A state directory of its own, whose store holds the lab's days."""
    where.mkdir(mode=0o700)
    shutil.copy(lab_file, where / "usage.sqlite3")
    return where


@pytest.fixture(scope="module")
def daemon(lab_file, tmp_path_factory):
    server = store_daemon(lab_state(lab_file, tmp_path_factory.mktemp("daemon") / "state"))
    yield server
    server.stop()


def usage(server: ServerProcess, **params: Any) -> dict[str, Any]:
    status, _, body = get(f"{server.url}/usage?{urllib.parse.urlencode(params)}")
    assert status == 200, body[:300]
    return json.loads(body)


def opened(page: Browser, url: str, zone: str = ZONE) -> str:
    """The report opened at `url` in `zone` and drawn (or refused); its state."""
    page.driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": zone})
    page.open(url)
    return page.until(
        lambda: page.js(
            "const s = document.body.dataset.state;return s === 'loading' ? false : s"
        ),
        "the report drawn",
    )


def bars(page: Browser, chart: str) -> tuple[float, list[dict[str, Any]], list[str]]:
    """(pixels per GPU-hour, every segment, every column) of one stacked-bar chart."""
    return page.js(
        """
        const svg = document.querySelector('#' + arguments[0] + ' svg');
        return [Number(svg.dataset.scale),
                Array.from(svg.querySelectorAll('rect.seg')).map((r) => ({
                  column: r.dataset.column, series: r.dataset.series,
                  value: Number(r.dataset.value), height: Number(r.getAttribute('height')),
                  y: Number(r.getAttribute('y'))})),
                Array.from(svg.querySelectorAll('g.stack')).map((g) => g.dataset.column)];""",
        chart,
    )


def legend(page: Browser, chart: str) -> list[str]:
    return page.js(
        "return Array.from(document.querySelectorAll('#' + arguments[0] + "
        "'-legend li')).map((li) => li.textContent)",
        chart,
    )


def top(page: Browser, table: str) -> list[tuple[str, str, str]]:
    return [
        tuple(row)
        for row in page.js(
            "return Array.from(document.querySelectorAll('#' + arguments[0] + ' tbody tr'))"
            ".map((tr) => Array.from(tr.cells).map((td) => td.textContent))",
            table,
        )
    ]


def page_range(page: Browser) -> tuple[str, str]:
    return tuple(
        page.js(
            "return [document.getElementById('from').value, document.getElementById('to').value]"
        )
    )


def used(hours: dict[str, float]) -> float:
    return sum(hours[c] for c in USED)


def days(first: str, last: str) -> list[str]:
    start, end = date.fromisoformat(first), date.fromisoformat(last)
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


def asked(first: str, last: str, zone: str = ZONE) -> dict[str, str]:
    """What the page asks /usage for a range of days: since the first, until the day after the
    last unless that is still to come, in the browser's zone."""
    params = {"since": first, "tz": zone}
    end = (date.fromisoformat(last) + timedelta(days=1)).isoformat()
    if end <= datetime.now(ZoneInfo(ZONE)).date().isoformat():
        params["until"] = end
    return params


def check_bars(page: Browser, server: ServerProcess) -> tuple[str, str]:
    """Both charts' bars against /usage by day and user for the range the page shows."""
    first, last = page_range(page)
    zone = page.js("return document.body.dataset.zone")
    answer = usage(server, by="day,user", **asked(first, last, zone))
    scale, segments, columns = bars(page, "by-user")
    assert columns == days(first, last)
    expected = {
        (row["key"][0], row["key"][1] or ""): used(row["hours"])
        for row in answer["rows"]
        if used(row["hours"]) > 0
    }
    drawn = {(s["column"], s["series"]): s for s in segments}
    assert set(drawn) == set(expected)
    for key, hours in expected.items():
        assert drawn[key]["value"] == pytest.approx(hours, abs=1e-6), key
        assert drawn[key]["height"] == pytest.approx(hours * scale, abs=1e-3), key
    scale, segments, columns = bars(page, "by-category")
    per_day: dict[tuple[str, str], float] = {}
    for row in answer["rows"]:
        for category in CATEGORIES:
            key = (row["key"][0], category)
            per_day[key] = per_day.get(key, 0.0) + row["hours"][category]
    drawn = {(s["column"], s["series"]): s["height"] for s in segments}
    assert set(drawn) == {key for key, hours in per_day.items() if hours > 0}
    for key, height in drawn.items():
        assert height == pytest.approx(per_day[key] * scale, abs=1e-3), key
    return first, last


def test_the_bars_are_as_tall_as_the_gpu_hours_of_usage_per_day_user_and_category(page, daemon):
    assert opened(page, daemon.url + "/report") == "shown"
    assert page.js("return document.body.dataset.zone") == ZONE  # the browser's
    first, last = check_bars(page, daemon)
    today = datetime.now(ZoneInfo(ZONE)).date()
    assert (first, last) == ((today - timedelta(days=29)).isoformat(), today.isoformat())
    assert set(legend(page, "by-user")) == LAB_USERS
    assert legend(page, "by-category") == [
        "active",
        "idle-held",
        "reserved, unused",
        "trespass",
        "unreserved use",
        "free",
        "lost",
    ]
    # another category: the bars by user are that category's hours
    page.js(
        "const s = document.getElementById('category'); s.value = 'idle_held';"
        "s.dispatchEvent(new Event('change'))"
    )
    answer = usage(daemon, by="day,user", **asked(first, last))
    scale, segments, _ = bars(page, "by-user")
    assert {(s["column"], s["series"]): round(s["height"] / scale, 4) for s in segments} == {
        (row["key"][0], row["key"][1]): round(row["hours"]["idle_held"], 4)
        for row in answer["rows"]
        if row["hours"]["idle_held"] > 0
    }
    assert not [e for e in page.console() if e.get("level") == "SEVERE"]


def test_the_heatmap_cells_are_the_hours_of_the_week_in_the_browsers_zone(page, daemon):
    assert opened(page, daemon.url + "/report") == "shown"
    first, last = page_range(page)
    answer = usage(daemon, by="weekday,hour", **asked(first, last))
    cells = page.js("""return Array.from(document.querySelectorAll('#heat rect.cell')).map((c) =>
        ({row: c.dataset.row, column: c.dataset.column, value: Number(c.dataset.value),
          zero: c.classList.contains('zero'), shade: Number(c.getAttribute('fill-opacity'))}))""")
    assert len(cells) == 7 * 24
    assert [c["row"] for c in cells[::24]] == ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    expected = {tuple(row["key"]): used(row["hours"]) for row in answer["rows"]}
    for cell in cells:
        hours = expected.get((cell["row"], cell["column"]), 0.0)
        assert cell["value"] == pytest.approx(hours, abs=1e-6), cell
        assert cell["zero"] == (hours == 0)
    most = max(cells, key=lambda c: c["value"])
    assert most["shade"] == 1.0
    # the lab works 08:00-19:00 UTC on weekdays: in New York, a weekday's afternoon is busier
    # than its night
    value = {(c["row"], c["column"]): c["value"] for c in cells}
    assert value[("Tue", "10")] > value[("Tue", "23")]


def test_the_lists_are_the_users_most_idle_held_and_reserved_unused(page, daemon):
    assert opened(page, daemon.url + "/report") == "shown"
    answer = usage(daemon, by="user", **asked(*page_range(page)))
    for table, category in (("top-idle", "idle_held"), ("top-unused", "reserved_unused")):
        rows = sorted(
            (r for r in answer["rows"] if r["hours"][category] > 0),
            key=lambda r: -r["hours"][category],
        )[:10]
        shown = top(page, table)
        assert [name for name, _, _ in shown] == [r["key"] for r in rows], table
        for (_, hours, share), row in zip(shown, rows, strict=True):
            assert hours == hours_text(row["hours"][category])  # as `patroller report` says
            part = 100 * row["hours"][category] / used(row["hours"])
            assert float(share.split()[0]) == pytest.approx(part, abs=0.05)
    assert top(page, "top-unused")[0][0] == "bob"  # his weekends
    assert top(page, "top-idle")[0][0] == "alice"  # her nights


HOURS = (
    0,
    0.004,
    0.00999,
    0.01,
    0.125,
    0.25,
    1 / 3,
    2.5,
    9.995,
    9.999,
    12.5,
    999.95,
    1234.5,
    99999.5,
    1e7,
)  # ties, edges and a little: 0.004 is "<0.01" beside its share, never "0"


def test_gpu_hours_are_said_by_the_command_lines_rule(page, daemon):
    assert opened(page, daemon.url + "/report") == "shown"
    said = page.js(f"return {list(HOURS)}.map(window.PatrollerCharts.hours)")
    assert said == [hours_text(value) for value in HOURS]
    assert said[1] == "<0.01" and said[4] == "0.13"


def test_the_range_control_asks_for_the_days_chosen(page, daemon):
    assert opened(page, daemon.url + "/report") == "shown"
    page.js("document.querySelector('[data-days=\"7\"]').click()")
    today = datetime.now(ZoneInfo(ZONE)).date()
    page.until(lambda: len(bars(page, "by-user")[2]) == 7, "seven days drawn")
    assert page_range(page) == ((today - timedelta(days=6)).isoformat(), today.isoformat())
    check_bars(page, daemon)
    assert (
        page.js("return document.querySelector('[data-days=\"7\"]').getAttribute('aria-pressed')")
        == "true"
    )
    # days of one's own, in the past: until the day after the last
    first, last = (
        (today - timedelta(days=20)).isoformat(),
        (today - timedelta(days=12)).isoformat(),
    )
    page.js(
        "document.getElementById('from').value = arguments[0];"
        "document.getElementById('to').value = arguments[1];"
        "document.getElementById('show').click()",
        first,
        last,
    )
    page.until(lambda: bars(page, "by-user")[2] == days(first, last), "the days chosen drawn")
    page.until(lambda: page.js("return document.body.dataset.state") == "shown", "drawn")
    check_bars(page, daemon)
    answer = usage(daemon, by="user", **asked(first, last))  # the days chosen, not up to now
    assert [name for name, _, _ in top(page, "top-unused")] == [
        row["key"]
        for row in sorted(answer["rows"], key=lambda r: -r["hours"]["reserved_unused"])
        if row["hours"]["reserved_unused"] > 0
    ][:10]
    assert float(top(page, "top-unused")[0][1]) == pytest.approx(
        max(row["hours"]["reserved_unused"] for row in answer["rows"]), abs=0.5
    )
    assert urllib.parse.parse_qs(urllib.parse.urlparse(page.driver.current_url).query) == {
        "from": [first],
        "to": [last],
    }
    # the address keeps the range: a reload shows it again
    assert opened(page, page.driver.current_url) == "shown"
    assert page_range(page) == (first, last)
    # a range that ends before it begins is refused on the page, not asked for
    page.js(
        "document.getElementById('from').value = arguments[1];"
        "document.getElementById('to').value = arguments[0];"
        "document.getElementById('show').click()",
        first,
        last,
    )
    refused = page.until(
        lambda: page.js(
            "const p = document.getElementById('problem');return !p.hidden && p.textContent"
        ),
        "refused",
    )
    assert refused.startswith("choose a range")


def test_a_host_that_knows_no_zone_by_name_is_asked_with_the_browsers_offset(
    page, lab_file, tmp_path
):
    nowhere = tmp_path / "no-zones"
    nowhere.mkdir()
    server = ServerProcess(
        "--test",
        "--state-dir",
        str(lab_state(lab_file, tmp_path / "state")),
        "--usage-interval",
        "1h",
        env={"PYTHONTZPATH": str(nowhere)},
    ).start()
    try:
        status, _, _ = get(f"{server.url}/usage?tz={ZONE}")
        if status == 200:
            pytest.skip("the tzdata package gives this daemon every zone's name")
        assert opened(page, server.url + "/report") == "shown"
        offset = datetime.now(ZoneInfo(ZONE)).strftime("%z")
        assert page.js("return document.body.dataset.zone") == offset[:3] + ":" + offset[3:]
        check_bars(page, server)
    finally:
        server.stop()


def test_past_eight_users_the_rest_are_one_segment_as_tall_as_their_hours(page, tmp_path):
    # ten users, user-N computing N hours on the day before yesterday (UTC), each on a GPU
    day = int(time.time() // 86400 * 86400) - 2 * 86400
    hours = [
        (
            day + (h + 1) * 3600,
            [
                gpu_hour(n, "claimed", f"u{n}", True, [(f"u{n}", True)], busy=60)
                for n in range(1, 11)
                if h < n
            ],
        )
        for h in range(10)
    ]
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    write(str(state / "usage.sqlite3"), hours)
    server = store_daemon(state)
    try:
        assert opened(page, server.url + "/report", zone="UTC") == "shown"
        assert legend(page, "by-user") == [f"u{n}" for n in range(10, 2, -1)] + ["2 others"]
        scale, segments, _ = bars(page, "by-user")
        drawn = {s["series"]: s["height"] / scale for s in segments}
        assert drawn.pop("\u0000others") == pytest.approx(1 + 2)  # u1 and u2
        assert drawn == pytest.approx({f"u{n}": float(n) for n in range(3, 11)})
    finally:
        server.stop()


def test_an_empty_store_says_nothing_is_recorded_yet(page, tmp_path):
    server = store_daemon(tmp_path / "state")
    try:
        assert opened(page, server.url + "/report") == "empty"
        assert "no GPU-time recorded" in page.js(
            "return document.getElementById('summary').textContent"
        )
        assert bars(page, "by-user")[1] == [] and len(bars(page, "by-user")[2]) == 30
        assert (
            page.js("return document.querySelectorAll('#heat rect.cell:not(.zero)').length") == 0
        )
        for table in ("top-idle", "top-unused"):
            assert top(page, table) == []
            assert page.js(f"return !document.getElementById('{table}-empty').hidden")
    finally:
        server.stop()


def test_a_daemon_without_a_store_says_why(page):
    server = ServerProcess("--test").start()
    try:
        assert opened(page, server.url + "/report") == "unavailable"
        problem = page.js(
            "const p = document.getElementById('problem');return p.hidden ? '' : p.textContent"
        )
        assert "no usage store here" in problem and "--state-dir" in problem
        assert (
            page.js("return document.getElementById('summary').textContent")
            == "no usage report here"
        )
        status, kind, body = get(server.url + "/report")
        assert status == 200 and kind.startswith("text/html") and b"report.js" in body
    finally:
        server.stop()


@pytest.fixture
def hidden(lab_file, tmp_path):
    server = store_daemon(lab_state(lab_file, tmp_path / "state"), "--hide-users")
    yield server
    server.stop()


@pytest.mark.parametrize("caller", ["alice", "bob", "zed"])
def test_a_caller_sees_their_own_name_and_everyone_else_as_pseudonyms(page, hidden, caller):
    assert opened(page, f"{hidden.url}/report?user={caller}") == "shown"
    names = set(legend(page, "by-user"))
    names |= {name for table in ("top-idle", "top-unused") for name, _, _ in top(page, table)}
    mine = {name for name in names if not PSEUDONYM.match(name)}
    assert mine == ({caller} if caller in LAB_USERS else set()), names
    assert len(names) == len(LAB_USERS)
    # the names are /usage's for that caller
    answer = usage(hidden, by="user", user=caller, **asked(*page_range(page)))
    assert names == {row["key"] for row in answer["rows"]} - {None}


def test_root_sees_every_name(page, lab_file, tmp_path):
    need_root("the browser is root's process, which the kernel names root")
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{} for _ in range(8)])
    state = lab_state(lab_file, tmp_path / "state")
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--state-dir",
        str(state),
        "--hide-users",
        "--usage-interval",
        "1h",
    ).start()
    try:
        assert opened(page, server.url + "/report") == "shown"
        assert set(legend(page, "by-user")) == LAB_USERS
    finally:
        server.stop()


def test_the_live_page_links_to_the_report(page, daemon):
    """A user finds the report from the live page: its link opens it, drawn."""
    page.open(daemon.url + "/")
    page.until(
        lambda: page.js("return document.body.dataset.connection") == "live",
        "the live page connected",
    )
    href = page.js(
        "const a = document.querySelector('a.report-link');"
        "return a ? a.getAttribute('href') : null"
    )
    assert href == "/report"
    page.js("document.querySelector('a.report-link').click()")
    page.until(lambda: page.js("return location.pathname") == "/report", "the report opened")
    assert (
        page.until(
            lambda: page.js(
                "const s = document.body.dataset.state;return s === 'loading' ? false : s"
            ),
            "the report drawn",
        )
        == "shown"
    )
