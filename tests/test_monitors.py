"""The pmon and dmon monitors' handling of lines, with the real event loop and no child."""

import asyncio
import logging
from dataclasses import replace

from helpers import async_test, until

from patroller.config import Config
from patroller.observe.crosscheck import Unattributed
from patroller.observe.monitors import DmonMonitor, PmonMonitor
from patroller.observe.signals import Signals
from patroller.observe.testmode import synthetic_inventory

PMON_HEADER = [
    "# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command ",
    "# Idx           #      C/G      %      %      %      %      %      %    name ",
]


def interval(rows_by_gpu, gpus=3):
    lines = []
    for gpu in range(gpus):
        rows = rows_by_gpu.get(gpu)
        if not rows:
            lines.append(
                f"    {gpu}          -     -      -      -      -      -      -      -    -              "
            )
        for pid, name in rows or []:
            lines.append(
                f"    {gpu}    {pid:>7}     C     12      3      -      -      -      -    {name:<15}"
            )
    return lines


async def past_timers(delay: float) -> None:
    """Return once every loop timer armed before the call to fire within `delay` s has run:
    the loop runs its timers in deadline order, and ours is due later, however slow the host."""
    await asyncio.sleep(2 * delay)


def recorder(signals):
    events = []
    signals.process_started.connect(
        lambda s, record: events.append(("+", record.pid, record.uuid)), weak=False
    )
    signals.process_ended.connect(
        lambda s, record: events.append(("-", record.pid, record.uuid)), weak=False
    )
    return events


@async_test
async def test_a_process_is_announced_at_once_and_gone_after_a_complete_interval():
    inventory = synthetic_inventory(3)
    signals = Signals()
    events = recorder(signals)
    monitor = PmonMonitor(inventory, signals, ["nvidia-smi"], {}, Config())
    uuids = [d.uuid for d in inventory]
    for line in PMON_HEADER + interval({1: [(4242, "python"), (77, "sglang::schedul")]})[:2]:
        monitor._line(line)
    assert events == [("+", 4242, uuids[1])]  # seen: announced before the interval ends
    for line in interval({1: [(4242, "python"), (77, "sglang::schedul")]})[2:]:
        monitor._line(line)
    assert ("+", 77, uuids[1]) in events
    for line in interval({1: [(77, "sglang::schedul")]}):
        monitor._line(line)
    await until(lambda: ("-", 4242, uuids[1]) in events, timeout=2)  # quiet after the last gpu
    assert ("-", 77, uuids[1]) not in events
    await monitor.stop(0.5)


@async_test
async def test_an_unfinished_interval_reports_nothing_gone():
    inventory = synthetic_inventory(3)
    signals = Signals()
    events = recorder(signals)
    monitor = PmonMonitor(inventory, signals, ["nvidia-smi"], {}, Config())
    for line in PMON_HEADER + interval({2: [(500, "train")]}):
        monitor._line(line)
    await past_timers(Config().burst_gap)  # the quiet after the last device ends the interval
    for line in interval({})[:2]:  # the stream stalls before the last device's row
        monitor._line(line)
    await past_timers(Config().burst_gap)  # a quiet now is a stall: it ends nothing
    assert events == [("+", 500, inventory.by_number(2).uuid)]
    monitor._line(interval({})[2])
    await until(lambda: len(events) == 2, timeout=2)
    assert events[1][0] == "-"
    await monitor.stop(0.5)


def test_dmon_rows_become_samples_for_the_device_with_that_index():
    inventory = synthetic_inventory(2)
    signals = Signals()
    samples = []
    signals.sample.connect(lambda s, record: samples.append(record), weak=False)
    monitor = DmonMonitor(inventory, signals, ["nvidia-smi"], {}, Config())
    for line in [
        "# gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk",
        "# Idx     W     C     C     %     %     %     %   MHz   MHz",
        "    1    71    40     -    88    40     0     0  1593  1410",
        "    7    71    40     -    88    40     0     0  1593  1410",  # no such device
        "    0 garbage",
    ]:
        monitor._line(line)
    assert len(samples) == 1
    assert samples[0].uuid == inventory.by_number(1).uuid
    assert samples[0].values["power"] == 71 and samples[0].values["mtemp"] is None
    assert monitor.parser.skipped == 1


def test_the_streams_watch_every_device():
    inventory = synthetic_inventory(8)
    monitor = PmonMonitor(
        inventory, Signals(), ["nvidia-smi", "--extra"], {"PATH": "/bin"}, Config()
    )
    assert monitor.child.argv == [
        "nvidia-smi",
        "--extra",
        "pmon",
        "-s",
        "um",
        "-i",
        "0,1,2,3,4,5,6,7",
    ]
    assert monitor.child.env["NVSMI_SHOW_ALL_DEVICES"] == "1"
    dmon = DmonMonitor(inventory, Signals(), ["nvidia-smi"], {"PATH": "/bin"}, Config())
    assert dmon.child.argv == ["nvidia-smi", "dmon", "-s", "pucvmt", "-i", "0,1,2,3,4,5,6,7"]


@async_test
async def test_each_completed_interval_lists_the_devices_it_covered():
    inventory = synthetic_inventory(3)
    signals = Signals()
    listed = []
    signals.processes_listed.connect(lambda s, record: listed.append(record.uuids), weak=False)
    monitor = PmonMonitor(inventory, signals, ["nvidia-smi"], {}, Config())
    uuids = tuple(d.uuid for d in inventory)
    for line in PMON_HEADER + interval({1: [(4242, "python")]}):
        monitor._line(line)
    await until(lambda: listed, timeout=2)  # quiet after the last device's row
    assert listed == [uuids]
    for line in interval({})[:2]:  # the stream hangs before the last device's row
        monitor._line(line)
    await past_timers(Config().burst_gap)
    assert listed == [uuids]  # an unfinished interval makes no list current
    monitor._restarted()  # killed as hung and started again: it lists again
    for line in PMON_HEADER + interval({}) + interval({})[:1]:
        monitor._line(line)  # the next interval's first row completes this one
    assert listed == [uuids, uuids]
    await monitor.stop(0.5)


@async_test
async def test_unreadable_lines_are_reported_once_a_window_with_their_count(caplog):
    monitor = DmonMonitor(
        synthetic_inventory(2),
        Signals(),
        ["nvidia-smi"],
        {},
        replace(Config(), repeat_log_every=0.3),
    )
    monitor._line("# gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk")
    for n in range(5):
        monitor._line(f"    0 garbage {n}")
    await asyncio.sleep(0.4)  # the next window: at least 0.3 s on the throttle's clock
    monitor._line("    1 garbage 5")
    reports = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert reports == [
        "dmon: 1 unreadable line(s) skipped, the last: '0 garbage 0'",
        "dmon: 5 unreadable line(s) skipped, the last: '1 garbage 5'",
    ]


@async_test
async def test_a_blind_device_stays_blind_until_pmon_lists_a_process_on_it():
    inventory = synthetic_inventory(3)
    pmon = PmonMonitor(inventory, Signals(), ["nvidia-smi"], {}, Config())
    figures = {d.uuid: {"sm": 0, "fb": 0} for d in inventory}
    unattributed = Unattributed(inventory, figures.__getitem__, pmon, Config().busy_mib)
    blind = inventory.by_number(1).uuid
    assert unattributed() == set()  # idle, no process listed: nothing to cross-check
    figures[blind] = {"sm": 40, "fb": 9000}  # busy, and pmon lists nothing there
    assert unattributed() == {blind}
    figures[blind] = {"sm": 0, "fb": 0}  # quiet for a while: still blind, still cross-checked
    assert unattributed() == {blind}
    for line in PMON_HEADER + interval({1: [(4242, "python")]}):
        pmon._line(line)
    assert unattributed() == set()  # pmon names a process there: it sees this device
    await pmon.stop(0.5)


@async_test
async def test_a_device_whose_listed_processes_all_ended_is_attributed_no_more():
    inventory = synthetic_inventory(3)
    pmon = PmonMonitor(inventory, Signals(), ["nvidia-smi"], {}, Config())
    uuids = [d.uuid for d in inventory]
    for line in PMON_HEADER + interval(
        {1: [(4242, "python"), (4343, "python")], 2: [(77, "train")]}
    ):
        pmon._line(line)
    assert pmon.attributed() == {uuids[1], uuids[2]}
    for line in interval({1: [(4343, "python")], 2: [(77, "train")]}):
        pmon._line(line)
    await past_timers(Config().burst_gap)  # quiet after the last device: the interval ends
    assert pmon.attributed() == {uuids[1], uuids[2]}  # one of two ended: still listed there
    for line in interval({2: [(77, "train")]}):
        pmon._line(line)
    await past_timers(Config().burst_gap)
    assert pmon.attributed() == {uuids[2]}  # the last one on device 1 ended
    for line in interval({1: [(5000, "again")], 2: [(77, "train")]}):
        pmon._line(line)
    assert pmon.attributed() == {uuids[1], uuids[2]}
    await pmon.stop(0.5)


@async_test
async def test_a_process_that_ends_as_another_starts_on_its_device_is_reported_gone():
    """An interval's end compares each device's count of processes listed with those announced
    there: one gone and one new in the same interval leave the count as it was, and still end."""
    inventory = synthetic_inventory(3)
    signals = Signals()
    events = recorder(signals)
    sampled = []
    signals.process_sampled.connect(lambda s, record: sampled.append(record.values), weak=False)
    figured = []
    signals.process_sampled.connect(lambda s, record: figured.append(record.figured), weak=False)
    monitor = PmonMonitor(inventory, signals, ["nvidia-smi"], {}, Config())
    uuids = [d.uuid for d in inventory]
    for line in PMON_HEADER + interval({1: [(10, "a"), (11, "b")], 2: [(12, "c")]}):
        monitor._line(line)
    await until(lambda: sampled, timeout=2)
    figures = {"sm": 12, "mem": 3, "enc": None, "dec": None, "jpg": None, "ofa": None}
    assert sampled == [{uuids[1]: {10: figures, 11: figures}, uuids[2]: {12: figures}}]
    rows = interval({1: [(10, "a"), (13, "d")], 2: [(12, "c")]})
    rows[-1] = rows[-1].replace(" 12      3 ", "  -      - ")  # `-` in every cell on device 2
    for line in rows:
        monitor._line(line)
    await until(lambda: len(sampled) == 2, timeout=2)
    assert events == [
        ("+", 10, uuids[1]),
        ("+", 11, uuids[1]),
        ("+", 12, uuids[2]),
        ("+", 13, uuids[1]),
        ("-", 11, uuids[1]),
    ]
    dashes = dict.fromkeys(figures)
    assert sampled[1] == {uuids[1]: {10: figures, 13: figures}, uuids[2]: {12: dashes}}
    assert figured == [{uuids[1], uuids[2]}, {uuids[1]}]  # counted as the rows came
    assert monitor.figureless() == {uuids[2]}
    assert monitor.metrics().processes == 3
    # a restart drops the rows of an unfinished interval, and what they said of the figures
    for line in interval({1: [(10, "a"), (13, "d")], 2: [(12, "c")]}):
        monitor._line(line)  # device 2 has figures again, but the interval is not complete
    monitor._restarted()
    for line in PMON_HEADER + rows:
        monitor._line(line)
    await until(lambda: len(sampled) == 3, timeout=2)
    assert figured[2] == {uuids[1]} and monitor.figureless() == {uuids[2]}
    await monitor.stop(0.5)
