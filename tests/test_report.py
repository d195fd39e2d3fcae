"""`patroller report`: the real command line against real daemons whose usage stores hold real
samples (written straight into the store, as the daemon writes them): the table, JSON and CSV;
the daemon's 400s said under the option they name (status 2); and `--hosts`, summed over two
daemons while a daemon with no store, a refusing port, a silent listener and a host that lies
are each a line of their own."""

import csv
import io
import json
import re
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace

import pytest
from helpers import ROOT, ServerProcess
from liars import LyingServer, trickle
from test_fleet import ENV
from test_usage_store import interval

from patroller.core.usage import Party, Present
from patroller.state.usage import schema, tables

BOB = Party(user="bob", account="bob")
HEADER = [
    "GPU-HOURS",
    "SHARE",
    "ACTIVE",
    "IDLE-HELD",
    "UNUSED",
    "TRESPASS",
    "UNASKED",
    "FREE",
    "LOST",
]


def patroller(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "patroller.cli", "report", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**ENV, "PATROLLER_HOSTS": "", **(env or {})},
    )


def stored(state, minutes, holder=None):
    """A state directory whose usage store holds `minutes` one-minute intervals of two GPUs,
    ending now: GPU-a held (alice's, or `holder`'s) and computing half the time, GPU-b free."""
    state.mkdir(mode=0o700)
    db = sqlite3.connect(state / "usage.sqlite3", isolation_level=None)
    schema.migrate(db)
    keys, start = tables.Keys(), time.time() - 60 * minutes
    samples = interval()
    if holder is not None:
        samples = [
            replace(samples[0], holder=holder, present=(Present(holder, own=True),)),
            samples[1],
        ]
    for n in range(minutes):
        tables.write_interval(db, keys, start + 60 * n, samples)
    db.close()
    return state


def url_get(server, path):
    with urllib.request.urlopen(server.url + path, timeout=20) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Two daemons with samples (alice: 2 h on one of two GPUs; bob: 1 h), one without a usage
    store, a refusing port, a silent listener and a host whose /usage lies."""
    where = tmp_path_factory.mktemp("report")
    one = ServerProcess(
        "--test", "--state-dir", str(stored(where / "one", 120)), "--usage-interval", "1h"
    ).start()
    two = ServerProcess(
        "--test", "--state-dir", str(stored(where / "two", 60, BOB)), "--usage-interval", "1h"
    ).start()
    bare = ServerProcess("--test").start()
    gone = ServerProcess("--test").start()
    gone.stop()  # its port now refuses
    silent = socket.socket()  # accepts (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    lie = json.loads(json.dumps(url_get(one, "/usage")))
    lie["rows"][0]["hours"]["active"] = "lots"
    liar = LyingServer({"/usage": json.dumps(lie).encode()}).start()
    yield {
        "one": one,
        "two": two,
        "bare": bare.server,
        "gone": gone.server,
        "silent": f"127.0.0.1:{silent.getsockname()[1]}",
        "liar": liar.host,
    }
    for server in (one, two, bare):
        server.stop()
    silent.close()
    liar.shutdown()


def rows_of(stdout):
    """The table's rows by their first cell: the cells after it."""
    lines = stdout.splitlines()
    assert lines[0].startswith("GPU-hours by "), stdout
    if lines[1].startswith("nothing recorded before "):
        del lines[1]
    assert [h for h in lines[1].split() if h not in ("UUID", "USER", "GPU")] == HEADER, stdout
    found = {}
    for line in lines[2:]:
        if "  not answering: " in line or " asked" in line:
            break
        cells = line.split()
        found[cells[0]] = cells[1:]
    return found


def test_the_table_shows_gpu_hours_per_category_and_shares_sorted_by_use(hosts):
    done = patroller("--server", hosts["one"].server)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("GPU-hours by user in the whole hours from ")
    assert lines[0].endswith("(7d01h)")  # 7 days from within an hour: to that hour's end
    assert lines[1].startswith("nothing recorded before ")  # the store's two hours
    assert lines[2].split() == ["USER", *HEADER]
    rows = rows_of(done.stdout)
    assert list(rows) == ["alice", "(none)", "total", "share"]  # by use, the total last
    assert rows["alice"] == ["2.00", "50%", "1.00", "1.00", "0", "0", "0", "0", "0"]
    assert rows["(none)"] == ["2.00", "50%", "0", "0", "0", "0", "0", "2.00", "0"]
    assert rows["total"] == ["4.00", "100%", "1.00", "1.00", "0", "0", "0", "2.00", "0"]
    assert rows["share"] == ["25%", "25%", "0%", "0%", "0%", "50%", "0%"]
    by_gpu = rows_of(patroller("--server", hosts["one"].server, "--by", "gpu").stdout)
    assert list(by_gpu)[:2] == ["0", "1"] and by_gpu["0"][-1] == "GPU-a"


def test_json_is_the_answer_and_csv_a_row_per_key(hosts):
    server = hosts["one"].server
    done = patroller("--server", server, "--json", "--since", "1d", "--by", "account")
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["by"] == "account"
    assert [row["key"] for row in answer["rows"]] == ["alice", None]
    assert answer["total"]["gpu_hours"] == 4.0
    done = patroller("--server", server, "--csv", "--by", "gpu")
    assert done.returncode == 0, done.stderr
    table = list(csv.reader(io.StringIO(done.stdout)))
    assert table[0] == [
        "gpu",
        "number",
        "gpu_hours",
        "share",
        "active",
        "idle_held",
        "reserved_unused",
        "trespass",
        "unreserved",
        "free",
        "lost",
    ]
    assert table[1] == [
        "GPU-a",
        "0",
        "2.0",
        "0.5",
        "1.0",
        "1.0",
        "0.0",
        "0.0",
        "0.0",
        "0.0",
        "0.0",
    ]
    assert table[2][:3] == ["GPU-b", "1", "2.0"] and len(table) == 3
    by_day = list(
        csv.reader(io.StringIO(patroller("--server", server, "--csv", "--by", "day").stdout))
    )
    assert by_day[0][0] == "day" and sum(float(row[1]) for row in by_day[1:]) == 4.0
    pairs = list(
        csv.reader(io.StringIO(patroller("--server", server, "--csv", "--by", "gpu,user").stdout))
    )
    assert pairs[0][:5] == ["gpu", "user", "number", "gpu_hours", "share"], pairs[0]
    numbers = {row[0]: row[2] for row in pairs[1:]}
    assert numbers == {"GPU-a": "0", "GPU-b": "1"}, pairs  # the GPU's number, as by gpu alone


@pytest.mark.parametrize(
    "args, said",
    [
        (("--since", "2999-01-01"), "--since: since= is in the future"),
        (("--until", "soon"), "--until: until='soon' is neither a duration"),
        (("--since", "1h", "--until", "2h"), "--since: since= is not before until="),
        (("--until", "2026-11-01T08:00"), "--until: until= needs a time zone"),
        (("--by", "team"), "--by: by='team': must be one of user, account"),
    ],
)
def test_a_range_the_daemon_refuses_is_its_words_under_the_option_and_status_2(hosts, args, said):
    done = patroller("--server", hosts["one"].server, *args)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith(f"patroller: {said}"), done.stderr
    over = patroller("--hosts", f"{hosts['one'].server},{hosts['two'].server}", *args)
    assert over.returncode == 2 and over.stderr.startswith(f"patroller: {said}"), over.stderr


def test_no_store_is_77_and_no_server_69(hosts):
    done = patroller("--server", hosts["bare"])
    assert done.returncode == 77 and "no usage store here" in done.stderr, done.stderr
    done = patroller("--server", hosts["gone"])
    assert done.returncode == 69 and "cannot reach the server" in done.stderr, done.stderr
    done = patroller("--server", hosts["liar"])
    assert (
        done.returncode == 69
        and "bad answer: /usage.rows[0].hours.'active' is a string" in done.stderr
    ), done.stderr


def test_many_hosts_are_summed_and_each_one_that_does_not_answer_is_a_line(hosts):
    order = [
        hosts["one"].server,
        hosts["bare"],
        hosts["two"].server,
        hosts["gone"],
        hosts["silent"],
        hosts["liar"],
    ]
    started = time.monotonic()
    done = patroller("--hosts", ",".join(order), "--host-timeout", "1")
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    rows = rows_of(done.stdout)
    assert list(rows) == ["alice", "bob", "(none)", "total", "share"]  # by use
    assert rows["alice"] == ["2.00", "33%", "1.00", "1.00", "0", "0", "0", "0", "0"]
    assert rows["bob"] == ["1.00", "17%", "0.50", "0.50", "0", "0", "0", "0", "0"]
    assert rows["total"] == ["6.00", "100%", "1.50", "1.50", "0", "0", "0", "3.00", "0"]
    tail = done.stdout.splitlines()[-5:]
    assert tail[0].startswith(f"{hosts['bare']}  not answering: 404: no usage store here")
    assert tail[1].startswith(f"{hosts['gone']}  not answering: Patroller at ")
    assert tail[2].startswith(f"{hosts['silent']}  not answering: ") and "timed out" in tail[2]
    assert tail[3] == (
        f"{hosts['liar']}  not answering: bad answer: "
        "/usage.rows[0].hours.'active' is a string, not a number of hours"
    )
    assert tail[4] == "6 hosts asked, 4 not answering"
    assert took < 8, took  # the silent host held nobody up past its second


def test_a_host_that_trickles_is_left_behind_at_the_deadline(hosts):
    slow = LyingServer({"/usage": trickle}).start()
    try:
        started = time.monotonic()
        done = patroller("--hosts", f"{hosts['one'].server},{slow.host}", "--host-timeout", "1")
        took = time.monotonic() - started
    finally:
        slow.shutdown()
    assert done.returncode == 0, done.stderr
    assert f"{slow.host}  not answering: no answer within 1s" in done.stdout
    assert rows_of(done.stdout)["alice"][0] == "2.00"
    assert took < 10, took  # one second, and one more for them all; not for ever


def test_by_gpu_over_hosts_keeps_each_hosts_gpus_apart_and_json_names_the_hosts(hosts):
    one, two = hosts["one"].server, hosts["two"].server
    done = patroller("--hosts", f"{one},{two},{hosts['gone']}", "--by", "gpu", "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    found = [(row["host"], row["key"], row["number"], row["gpu_hours"]) for row in answer["rows"]]
    assert found == [
        (one, "GPU-a", 0, 2.0),
        (two, "GPU-a", 0, 1.0),
        (one, "GPU-b", 1, 2.0),
        (two, "GPU-b", 1, 1.0),
    ]
    assert [(h["host"], h["error"] is None) for h in answer["hosts"]] == [
        (one, True),
        (two, True),
        (hosts["gone"], False),
    ]
    assert done.stderr.startswith(f"{hosts['gone']}  not answering: ")  # JSON alone on stdout
    table = list(
        csv.reader(
            io.StringIO(
                patroller("--by", "gpu", "--csv", env={"PATROLLER_HOSTS": f"{one} {two}"}).stdout
            )
        )
    )
    assert table[0][:4] == ["gpu", "host", "number", "gpu_hours"]
    assert [row[:3] for row in table[1:]] == [
        ["GPU-a", one, "0"],
        ["GPU-a", two, "0"],
        ["GPU-b", one, "1"],
        ["GPU-b", two, "1"],
    ]


def test_no_host_answering_is_69_and_every_one_without_a_store_77(hosts):
    done = patroller("--hosts", f"{hosts['gone']},{hosts['liar']}")
    assert done.returncode == 69 and "no host answered (2 asked)" in done.stderr, done.stderr
    assert f"{hosts['gone']}  not answering: " in done.stderr
    done = patroller("--hosts", hosts["bare"])
    assert done.returncode == 77 and "404: no usage store here" in done.stderr, done.stderr


def test_two_keys_and_a_zone_one_host_and_many(hosts):
    """--by day,user: a row per day and user, keyed by both, in the daemon's order; over many
    hosts summed by the pair; --tz goes to the daemon; CSV has a column per key."""
    one, two = hosts["one"].server, hosts["two"].server
    done = patroller("--server", one, "--by", "user,day", "--tz", "+02:00", "--json")
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["by"] == "user,day" and answer["tz"] == "+02:00"
    assert {tuple(row["key"][:1]) for row in answer["rows"]} == {("alice",), (None,)}
    summed = patroller("--hosts", f"{one},{two}", "--by", "user,day")
    assert summed.returncode == 0, summed.stderr
    lines = summed.stdout.splitlines()
    assert lines[2].split()[:3] == ["USER", "DAY", "GPU-HOURS"]  # a column per key
    keyed = [line.split() for line in lines[3:] if re.match(r"\S+\s+\d{4}-\d\d-\d\d\s", line)]
    users = [cells[0] for cells in keyed]
    assert users == sorted(users, key=["alice", "bob", "(none)"].index)  # by use, null last
    hours = {}  # a user's GPU-hours over their days (midnight may split them in two rows)
    for cells in keyed:
        hours[cells[0]] = hours.get(cells[0], 0.0) + float(cells[2])
    assert hours == {
        "alice": pytest.approx(2.0),
        "bob": pytest.approx(1.0),
        "(none)": pytest.approx(3.0),
    }
    table = list(
        csv.reader(
            io.StringIO(patroller("--hosts", f"{one},{two}", "--csv", "--by", "day,user").stdout)
        )
    )
    assert table[0][:3] == ["day", "user", "gpu_hours"]
    assert sum(float(row[2]) for row in table[1:]) == pytest.approx(6.0)
