"""The dmon and pmon line parsers and the pmon interval tracker, on written fixtures."""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from patroller.observe.nvsmi.intervals import IntervalChange, PmonIntervals, PmonProcess
from patroller.observe.nvsmi.parsers import (
    ComputeApp,
    DmonParser,
    DmonRow,
    PmonParser,
    PmonRow,
    parse_compute_apps,
    parse_value,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nvsmi"
Cell = int | float | str | None


def lines(name: str) -> list[str]:
    """A fixture's lines as a reader gets them: newlines and `\\r` kept."""
    with open(FIXTURES / name, encoding="utf-8", errors="replace", newline="") as f:
        return f.readlines()


def feed_all(parser: DmonParser | PmonParser, text_lines: Sequence[str]) -> list:
    """Every row the parser returns for these lines."""
    return [row for row in map(parser.feed, text_lines) if row is not None]


def dmon(
    gpu: int,
    keys: Sequence[str],
    cells: Sequence[Cell],
    date: str | None = None,
    time: str | None = None,
) -> DmonRow:
    assert len(keys) == len(cells)
    return DmonRow(gpu, dict(zip(keys, cells, strict=True)), date, time)


def pmon(
    gpu: int,
    pid: int | None,
    kind: str | None,
    command: str | None,
    keys: Sequence[str],
    cells: Sequence[Cell],
    date: str | None = None,
    time: str | None = None,
) -> PmonRow:
    assert len(keys) == len(cells)
    return PmonRow(gpu, pid, kind, command, dict(zip(keys, cells, strict=True)), date, time)


_ = None  # a `-` cell
OLD = ("power", "gtemp", "sm", "mem", "enc", "dec", "mclk", "pclk")
FIVE = ("power", "gtemp", "mtemp", "sm", "mem", "enc", "dec", "mclk", "pclk")
WIDE = ("power", "gtemp", "mtemp", "sm", "mem", "enc", "dec", "jpg", "ofa", "mclk", "pclk")
FULL = WIDE + ("pviol", "tviol", "fb", "bar1", "ccpm", "sbecc", "dbecc", "pci", "rxpci", "txpci")

DMON_CASES = {
    "dmon_old_temp.txt": [
        dmon(0, OLD, (43, 48, 0, 0, 0, 0, 3505, 556)),
        dmon(1, OLD, (125, 67, 98, 43, 0, 0, 3505, 1632)),
        dmon(0, OLD, (44, 48, 0, 0, 0, 0, 3505, 556)),
        dmon(1, OLD, (127, 68, 99, 44, 0, 0, 3505, 1632)),
    ],
    "dmon_gtemp_mtemp.txt": [
        dmon(0, FIVE, (18, 35, _, 0, 0, 0, 0, 405, 300)),
        dmon(1, FIVE, (231, 71, _, 97, 58, 0, 0, 7000, 1860)),
        dmon(0, FIVE, (19, 35, _, 2, 1, 0, 0, 810, 645)),
        dmon(1, FIVE, (229, 71, _, 96, 57, 0, 0, 7000, 1860)),
    ],
    "dmon_wide_jpg_ofa.txt": [
        dmon(0, WIDE, (69, 34, 45, 0, 0, 0, 0, 0, 0, 2619, 1980)),
        dmon(1, WIDE, (312, 61, 72, 97, 54, 0, 0, 0, 0, 2619, 1980)),
        dmon(2, WIDE, (11, 38, _, 0, 0, 0, 0, 0, 0, _, 208)),  # unified memory: no mclk
    ],
    "dmon_s_m.txt": [
        dmon(0, ("fb", "bar1", "ccpm"), (40391, 5, 0)),
        dmon(1, ("fb", "bar1", "ccpm"), (0, 2, 0)),
    ],
    "dmon_s_t.txt": [
        dmon(0, ("rxpci", "txpci"), (160, 57)),
        dmon(1, ("rxpci", "txpci"), (0, 0)),
    ],
    "dmon_o_dt.txt": [
        dmon(0, FIVE, (62, 40, _, 28, 10, 0, 0, 5000, 1785), "20210102", "19:12:31"),
        dmon(0, FIVE, (63, 41, _, 30, 11, 0, 0, 5000, 1785), "20210102", "19:12:32"),
    ],
    "dmon_o_t.txt": [
        dmon(0, FIVE, (62, 40, _, 28, 10, 0, 0, 5000, 1785), None, "19:12:31"),
        dmon(1, FIVE, (35, 33, _, 0, 0, 0, 0, 405, 300), None, "19:12:31"),
    ],
    "dmon_full_pucvmet.txt": [
        dmon(
            0,
            FULL,
            (88, 41, 49, 35, 12, 0, 0, 0, 0, 1593, 1410, 0, 0, 30215, 4, 0, 0, 0, 0, 124, 37),
        ),
        dmon(1, FULL, (62, 37, _, 0, 0, 0, 0, 0, 0, 9501, 210, 0, 0, 1, 2, 0, _, _, 0, 0, 0)),
    ],
}


@pytest.mark.parametrize("name", sorted(DMON_CASES))
def test_dmon_fixture_rows(name: str) -> None:
    parser = DmonParser()
    assert feed_all(parser, lines(name)) == DMON_CASES[name]
    assert (parser.skipped, parser.last_skipped, parser.headers) == (0, None, 1)


def test_dmon_stream_quirks_skipped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    parser = DmonParser()
    with caplog.at_level(logging.DEBUG):
        rows = feed_all(parser, lines("dmon_stream_quirks.txt"))
    assert rows == [
        dmon(0, FIVE, (71, 52, _, 99, 41, 0, 0, 7000, 1911)),
        dmon(1, FIVE, (16, 30, _, 0, 0, _, _, 405, 139)),
        dmon(0, FIVE, (72, 52, _, 99, 40, 0, 0, 7000, 1911)),
        dmon(1, FIVE, (16, 30, _, 0, 0, _, _, 405, 139)),
        dmon(0, FIVE, (70, 53, _, 98, 40, 0, 0, 7000, 1911)),
        dmon(1, FIVE, (17, 30, _, 0, 0, _, _, 405, 139)),
        dmon(1, FIVE, (17, 30, _, 0, 0, _, _, 405, 139)),
    ]
    # before the header, two ^C, too few, gpu `x`, binary junk, too many, mojibake: not blank ones
    assert parser.skipped == 8
    assert parser.last_skipped == "1    17    3\ufffd     -     0     0     -     -   405   139"
    assert parser.headers == 2
    assert caplog.records == []  # the caller logs from the counters, not the parser


def test_dmon_relearns_a_different_header_mid_stream() -> None:
    parser = DmonParser()
    rows = feed_all(
        parser,
        [
            "# gpu   pwr  temp    sm   mem   enc   dec  mclk  pclk\n",
            "# Idx     W     C     %     %     %     %   MHz   MHz\n",
            "    0    43    48     0     0     0     0  3505   556\n",
            "# gpu     fb   bar1   ccpm \n",
            "# Idx     MB     MB     MB \n",
            "    0  40391      5      0 \n",
            # old shape: no longer readable
            "    0    43    48     0     0     0     0  3505   556\n",
        ],
    )
    assert rows == [
        dmon(0, OLD, (43, 48, 0, 0, 0, 0, 3505, 556)),
        dmon(0, ("fb", "bar1", "ccpm"), (40391, 5, 0)),
    ]
    assert parser.skipped == 1


def test_dmon_unknown_columns_floats_and_text_kept() -> None:
    parser = DmonParser()
    rows = feed_all(
        parser,
        [
            "# gpu    pwr  nvlrx  state\n",
            "    3  61.25   1024   busy\n",
        ],
    )
    assert rows == [DmonRow(3, {"power": 61.25, "nvlrx": 1024, "state": "busy"})]
    assert isinstance(rows[0].values["nvlrx"], int)


def test_dmon_temp_keeps_its_name_when_gtemp_is_also_a_column() -> None:
    parser = DmonParser()
    parser.feed("# gpu  temp gtemp\n")
    assert parser.feed("    0    40    41\n") == DmonRow(0, {"temp": 40, "gtemp": 41})


def test_dmon_failure_text_before_header_is_counted() -> None:
    parser = DmonParser()
    assert parser.feed("Not supported on the device(s)\n") is None
    assert parser.feed("Failed to process command line\n") is None
    assert (parser.skipped, parser.last_skipped) == (2, "Failed to process command line")


def test_dmon_comment_that_is_no_header_keeps_the_old_header() -> None:
    parser = DmonParser()
    parser.feed("# gpu   pwr\n")
    assert parser.feed("# something else entirely\n") is None
    assert parser.feed("    1    30\n") == DmonRow(1, {"power": 30})
    assert parser.skipped == 1


def test_dmon_reset_forgets_the_header() -> None:
    parser = DmonParser()
    parser.feed("# gpu   pwr\n")
    parser.reset()
    assert parser.feed("    1    30\n") is None
    assert parser.skipped == 1
    parser.feed("# gpu   pwr\n")
    assert parser.feed("    1    30\n") == DmonRow(1, {"power": 30})


@pytest.mark.parametrize(
    "token, value",
    [
        ("-", None),
        ("0", 0),
        ("1426541", 1426541),
        ("-3", -3),
        ("61.25", 61.25),
        (".5", 0.5),
        ("N/A", "N/A"),
        ("1_000", "1_000"),
        ("nan", "nan"),
        ("3.2.1", "3.2.1"),
    ],
)
def test_parse_value(token: str, value: Cell) -> None:
    parsed = parse_value(token)
    assert parsed == value and type(parsed) is type(value)


PM = ("sm", "mem", "enc", "dec")
PM_FB = PM + ("fb",)
PM_NEW = ("sm", "mem", "enc", "dec", "jpg", "ofa", "fb", "ccpm")

PMON_CASES = {
    "pmon_old_narrow.txt": [
        pmon(0, 1867, "G", "Xorg", PM, (0, 0, 0, 0)),
        pmon(0, 2410, "C", "python", PM, (97, 61, 0, 0)),
        pmon(1, None, None, None, PM, (_, _, _, _)),
        pmon(15, 1426541, "C", "python3", PM, (66, 20, _, _)),  # 7-digit pid fills the column
    ],
    "pmon_standard.txt": [
        pmon(0, 1923, "G", "Xorg", PM, (0, 0, _, _)),
        pmon(0, 2231, "C+G", "gnome-shell", PM, (3, 1, _, _)),
        pmon(0, 48213, "C", "sglang::schedul", PM, (88, 37, _, _)),  # cut at 15 characters
        pmon(1, 48213, "C", "sglang::schedul", PM, (91, 40, _, _)),  # same pid, second device
        pmon(1, 50110, "C", "python", PM, (_, _, _, _)),
        pmon(2, None, None, None, PM, (_, _, _, _)),
        pmon(3, 61001, "G", "Web Content", PM, (0, 0, 0, 0)),  # a name with a space
        pmon(3, 61555, "C", None, PM, (5, 2, _, _)),  # command `-`
    ],
    "pmon_s_um.txt": [
        pmon(0, 12345, "C", "python", PM_FB, (45, 20, 0, 0, 8021)),
        pmon(1, None, None, None, PM_FB, (_, _, _, _, _)),
    ],
    "pmon_newest.txt": [
        pmon(0, 1426541, "C", "python3", PM_NEW, (66, 20, _, _, _, _, 40210, 0)),
        pmon(1, None, None, None, PM_NEW, (_,) * 8),
        pmon(2, 88012, "C+G", "Xwayland", PM_NEW, (1, 0, 0, 0, 0, 0, 312, 0)),
    ],
    "pmon_o_dt.txt": [
        pmon(0, 31337, "C", "python", PM, (45, 12, _, _), "20240312", "10:00:01"),
        pmon(0, 31400, "C", "torchrun", PM, (3, 0, _, _), "20240312", "10:00:02"),
        pmon(0, 31400, "C", "torchrun", PM, (12, 1, _, _), "20240312", "10:00:03"),
        pmon(0, 31500, "G", "Xorg", PM, (0, 0, _, _), "20240312", "10:00:03"),
        pmon(0, None, None, None, PM, (_, _, _, _), "20240312", "10:00:04"),
    ],
}


@pytest.mark.parametrize("name", sorted(PMON_CASES))
def test_pmon_fixture_rows(name: str) -> None:
    parser = PmonParser()
    assert feed_all(parser, lines(name)) == PMON_CASES[name]
    assert (parser.skipped, parser.last_skipped, parser.headers) == (0, None, 1)


def test_pmon_padded_command_with_spaces_in_newest_format() -> None:
    parser = PmonParser()
    parser.feed(lines("pmon_newest.txt")[0])
    row = parser.feed(
        "    0        4242      G      0      0      -      -      -      -     12"
        "      0    Web Content     \r\n"
    )
    assert row == pmon(0, 4242, "G", "Web Content", PM_NEW, (0, 0, _, _, _, _, 12, 0))


def test_pmon_garbage_is_skipped_and_counted() -> None:
    parser = PmonParser()
    header = lines("pmon_standard.txt")[:2]
    rows = feed_all(
        parser,
        header
        + [
            "    0      48213     C    88\n",  # cut short, no command
            "    0      4821x     C    88    37     -     -   python\n",  # pid not a number
            "    0      48213     C    88    37     -     -   pyth^C\n",  # all columns there
            "    0      48213     C    88    3^C\n",
            "\n",
            *header,  # repeated mid-stream
            "    1      50110     C     -     -     -     -   python\n",
        ],
    )
    assert rows == [pmon(1, 50110, "C", "python", PM, (_, _, _, _))]
    assert (parser.skipped, parser.headers) == (4, 2)
    assert parser.last_skipped == "0      48213     C    88    3^C"


def test_pmon_parser_refuses_a_dmon_header() -> None:
    parser = PmonParser()
    parser.feed("# gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk\n")
    assert parser.columns is None
    assert parser.feed("    0    18    35     -     0     0     0     0   405   300\n") is None
    assert parser.skipped == 2


def test_pmon_without_trailing_command_column_needs_exact_count() -> None:
    parser = PmonParser()
    parser.feed("# gpu   pid  type    sm\n")
    assert parser.feed("    0   100     C     7\n") == PmonRow(0, 100, "C", None, {"sm": 7})
    assert parser.feed("    0   100     C     7   extra\n") is None


# The tracker.


def track(rows: Sequence[PmonRow]) -> list[tuple[int | str, IntervalChange]]:
    """Feed rows to a fresh tracker, then end the last interval: (row index or 'end', change)."""
    tracker = PmonIntervals()
    changes: list[tuple[int | str, IntervalChange]] = []
    for index, row in enumerate(rows):
        change = tracker.feed(row)
        if change is not None:
            changes.append((index, change))
    last = tracker.end_interval()
    if last is not None:
        changes.append(("end", last))
    return changes


def fixture_rows(name: str) -> list[PmonRow]:
    return feed_all(PmonParser(), lines(name))


def pids(processes: Sequence[PmonProcess]) -> list[tuple[int, int]]:
    return [(p.gpu, p.pid) for p in processes]


def outcome(change: IntervalChange) -> tuple[tuple[PmonProcess, ...], ...]:
    """(appeared, disappeared, present)."""
    return change.appeared, change.disappeared, change.present


def summary(changes: Sequence[tuple[int | str, IntervalChange]]) -> list:
    return [(at, pids(c.appeared), pids(c.disappeared)) for at, c in changes]


XORG = PmonProcess(0, 1923, "G", "Xorg")
SGLANG0 = PmonProcess(0, 48213, "C", "sglang::schedul")
SGLANG1 = PmonProcess(1, 48213, "C", "sglang::schedul")
PY3 = PmonProcess(3, 1426541, "C", "python3")
BLENDER = PmonProcess(2, 55001, "C+G", "blender")


def test_intervals_on_a_four_gpu_host() -> None:
    changes = track(fixture_rows("pmon_intervals.txt"))
    assert [at for at, _c in changes] == [5, 10, "end"]  # where the gpu index goes down
    first, second, third = (c for _at, c in changes)
    # the first interval after start reports every process; the same pid on two devices is two
    assert outcome(first) == ((XORG, SGLANG0, SGLANG1, PY3), (), (XORG, SGLANG0, SGLANG1, PY3))
    # `-` statistics for 48213 in interval 2: still present; 1426541 absent: gone
    assert outcome(second) == ((BLENDER,), (PY3,), (XORG, SGLANG0, SGLANG1, BLENDER))
    assert outcome(third) == ((), (SGLANG0,), (XORG, SGLANG1, BLENDER))


def test_intervals_on_a_one_gpu_host() -> None:
    assert summary(track(fixture_rows("pmon_one_gpu.txt"))) == [
        (2, [(0, 100), (0, 200)], []),  # pid 100 repeats: interval 1 is complete
        (4, [], []),
        (5, [], [(0, 100)]),  # interval 3 held only 200
        (6, [], []),  # the device turns idle: a new interval
        (7, [], [(0, 200)]),  # a second `-` row: the idle interval is complete
        (8, [], []),
        ("end", [(0, 300)], []),
    ]


def test_intervals_split_on_time_column() -> None:
    assert summary(track(fixture_rows("pmon_o_dt.txt"))) == [
        (1, [(0, 31337)], []),  # only the time tells 31337 and 31400 apart
        (2, [(0, 31400)], [(0, 31337)]),
        (4, [(0, 31500)], []),
        ("end", [], [(0, 31400), (0, 31500)]),
    ]


def row(gpu: int, pid: int | None, command: str | None = "python") -> PmonRow:
    return PmonRow(
        gpu, pid, None if pid is None else "C", command if pid is not None else None, {}
    )


def test_explicit_end_interval_separates_a_quiet_one_gpu_stream() -> None:
    tracker = PmonIntervals()
    assert tracker.end_interval() is None  # nothing yet
    assert tracker.feed(row(0, 100)) is None
    first = tracker.end_interval()
    assert first is not None and pids(first.appeared) == [(0, 100)] and first.disappeared == ()
    assert tracker.end_interval() is None  # already ended
    assert tracker.feed(row(0, 200)) is None  # the row after an explicit end starts anew
    second = tracker.end_interval()
    assert second is not None
    assert (pids(second.appeared), pids(second.disappeared)) == ([(0, 200)], [(0, 100)])
    assert pids(tracker.known) == [(0, 200)]


def test_without_end_interval_a_replaced_process_on_one_gpu_waits_for_the_next_boundary() -> None:
    tracker = PmonIntervals()
    assert tracker.feed(row(0, 100)) is None
    assert tracker.feed(row(0, 200)) is None  # indistinguishable from two processes at once
    change = tracker.feed(row(0, 200))
    assert change is not None and pids(change.appeared) == [(0, 100), (0, 200)]


def test_reset_after_restart_reports_nothing_gone_and_back() -> None:
    first_interval = fixture_rows("pmon_intervals.txt")[:5]
    tracker = PmonIntervals()
    for r in first_interval:
        tracker.feed(r)
    assert tracker.end_interval() is not None
    tracker.feed(first_interval[0])
    tracker.feed(row(0, 777))  # a partial interval cut by the restart
    tracker.reset()
    assert tracker.end_interval() is None
    changes = [tracker.feed(r) for r in first_interval]  # the restarted child prints the same
    assert changes == [None] * 5
    after = tracker.end_interval()
    assert after is not None and not after
    assert (after.appeared, after.disappeared) == ((), ())
    assert pids(tracker.known) == pids((XORG, SGLANG0, SGLANG1, PY3))


def test_unmonitored_gpu_rows_are_tracked_and_idle_rows_are_not_processes() -> None:
    changes = track(fixture_rows("pmon_old_narrow.txt"))
    assert summary(changes) == [("end", [(0, 1867), (0, 2410), (15, 1426541)], [])]


def test_interval_change_is_false_when_nothing_changed() -> None:
    xorg, blender = {(0, 1923): XORG}, {(2, 55001): BLENDER}
    assert not IntervalChange(xorg, dict(xorg))
    assert IntervalChange({}, xorg)  # one came
    assert IntervalChange(xorg, {})  # one went
    assert IntervalChange(xorg, blender)  # as many, but others
    assert outcome(IntervalChange(xorg, blender)) == ((BLENDER,), (XORG,), (BLENDER,))


# ---- --query-compute-apps --------------------------------------------------------------------

A100 = "GPU-d1e2f3a4-b5c6-d7e8-f9a0-b1c2d3e4f5a6"
H100 = "GPU-4f3c2b1a-0e9d-8c7b-6a59-483726150f1e"


def test_compute_apps_lines() -> None:
    text = (
        f"{A100}, 77120, 4096, python\n"
        f"{A100}, 1426541, 18650, /opt/conda/bin/python3\n"
        f"{H100}, 91234, 20200, python3 train.py, stage 2,  final\n"  # commas in the name
        f"{H100}, 91802, 9500, /usr/bin/my worker\r\n"
    )
    skipped: list[str] = []
    assert parse_compute_apps(text, skipped) == [
        ComputeApp(A100, 77120, 4096, "python"),
        ComputeApp(A100, 1426541, 18650, "/opt/conda/bin/python3"),
        ComputeApp(H100, 91234, 20200, "python3 train.py, stage 2,  final"),
        ComputeApp(H100, 91802, 9500, "/usr/bin/my worker"),
    ]
    assert skipped == []


@pytest.mark.parametrize(
    "memory, mib",
    [
        ("[N/A]", None),
        ("N/A", None),
        ("[Insufficient Permissions]", None),
        ("[Not Supported]", None),
        ("4096 MiB", 4096),
        ("0", 0),
        ("-", None),
    ],
)
def test_compute_apps_used_memory(memory: str, mib: int | None) -> None:
    assert parse_compute_apps(f"{A100}, 5150, {memory}, python\n") == [
        ComputeApp(A100, 5150, mib, "python")
    ]


@pytest.mark.parametrize(
    "line, name",
    [
        (f"{A100}, 5150, 10, ", None),
        (f"{A100}, 5150, 10,", None),
        (f"{A100}, 5150, 10", None),
        (f"{A100}, 5150, 10, [Not Found]", None),
        (f"{A100}, 5150, 10, [N/A]", None),
        (f"{A100}, 5150, 10, sglang::scheduler_TP0", "sglang::scheduler_TP0"),
    ],
)
def test_compute_apps_missing_names(line: str, name: str | None) -> None:
    assert parse_compute_apps(line + "\n") == [ComputeApp(A100, 5150, 10, name)]


def test_compute_apps_blank_lines_ignored_and_unreadable_lines_skipped() -> None:
    text = (
        "\n".join(
            [
                "",
                "   ",
                # a header: noheader was lost
                "gpu_uuid, pid, used_gpu_memory [MiB], process_name",
                "No running processes found",
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                f"{A100}, -, 10, python",  # no pid
                f"{A100}, 12x, 10, python",
                "N/A, 5150, 10, python",  # no uuid
                f"{A100}, 5150, 10, pyt\x00hon",  # damaged
                f"{A100}",
                f"{A100}, 7, 10, python",
            ]
        )
        + "\n"
    )
    skipped: list[str] = []
    assert parse_compute_apps(text, skipped) == [ComputeApp(A100, 7, 10, "python")]
    assert len(skipped) == 8 and skipped[0].startswith("gpu_uuid")
    assert parse_compute_apps(text) == parse_compute_apps(text, skipped)  # counting is optional


@pytest.mark.parametrize("text", ["", "\n", "\n\n  \n"])
def test_compute_apps_nothing_listed(text: str) -> None:
    skipped: list[str] = []
    assert parse_compute_apps(text, skipped) == [] and skipped == []


def test_compute_apps_never_raises_on_random_text() -> None:
    rng = random.Random(10)
    pieces = [
        A100,
        "GPU-",
        ", ",
        ",",
        " ",
        "1234",
        "[N/A]",
        "N/A",
        "MiB",
        "python",
        "\x00",
        "\r",
        "\n",
        "\t",
        "é",
        "-",
        "[",
        "]",
        "0",
    ]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        skipped: list[str] = []
        for app in parse_compute_apps(text, skipped):
            assert app.uuid.startswith("GPU-") and app.pid >= 0
            assert app.used_mib is None or app.used_mib >= 0
        assert all(line.strip() for line in skipped)


# -- the columns Patroller asks for, in every era (fixtures printed by the simulator) -----------


@pytest.mark.parametrize("era", ["r384", "r470", "r550"])
def test_dmon_pucvmt_gives_every_group_in_every_era(era: str) -> None:
    rows = [r for r in feed_all(DmonParser(), lines(f"{era}-dmon-pucvmt.txt")) if r is not None]
    assert rows and {r.gpu for r in rows} == {0, 1}
    for row in rows:
        for name in (
            "power",
            "gtemp",
            "sm",
            "mem",
            "enc",
            "dec",
            "mclk",
            "pclk",
            "pviol",
            "tviol",
            "fb",
            "bar1",
            "rxpci",
            "txpci",
        ):
            assert name in row.values, (era, name)
        assert isinstance(row.values["fb"], int)
    busy = rows[0].values
    assert busy["fb"] == 40210 and busy["sm"] == 66
    assert ("jpg" in busy) == ("ccpm" in busy) == (era == "r550")
    assert ("mtemp" in busy) == (era != "r384")


@pytest.mark.parametrize("era", ["r384", "r470", "r550"])
def test_pmon_um_gives_each_process_its_memory_in_every_era(era: str) -> None:
    rows = [r for r in feed_all(PmonParser(), lines(f"{era}-pmon-um.txt")) if r is not None]
    busy = [r for r in rows if r.pid is not None]
    assert busy and all(r.values["fb"] == 40210 and r.values["sm"] == 66 for r in busy), era
    assert all(r.pid is None for r in rows if r.gpu == 1)


def test_pmon_row_with_more_cells_than_its_header_is_skipped_not_misread() -> None:
    # As found: under an eight-column header ending in `command`, the row of a `-s um` stream
    # (an fb cell more) was read as sm 7669 and command `-   python3.9`.
    parser = PmonParser()
    parser.feed("# gpu        pid  type    sm   mem   enc   dec   command\n")
    parser.feed("# Idx          #   C/G     %     %     %     %   name\n")
    assert (
        parser.feed("    0     447153     C  7669     -     -     -     -   python3.9\n") is None
    )
    assert (
        parser.feed("    0     447153     C     -     -     -     -  7669   python3.9\n") is None
    )
    assert parser.skipped == 2
    # What fits is read, names with spaces and a leading dash included.
    assert parser.feed("    0     447153     C    97    40     -     -   python3.9\n") == PmonRow(
        0, 447153, "C", "python3.9", {"sm": 97, "mem": 40, "enc": None, "dec": None}
    )
    assert (
        parser.feed("    0     447154     C   100     0     0     0   python train.py\n").command
        == "python train.py"
    )
    assert (
        parser.feed("    0     447155     G     0     0     0     0   -bash\n").command == "-bash"
    )
    assert parser.feed("    0          -     -     -     -     -     -   -\n") == PmonRow(
        0, None, None, None, {"sm": None, "mem": None, "enc": None, "dec": None}
    )
    assert parser.skipped == 2
