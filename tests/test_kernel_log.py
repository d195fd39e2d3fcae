"""The kernel's Xid lines: parsed from lines people published (tests/fixtures/kmsg), and
followed live by the kernel log's thread in a real file and a real FIFO, as /dev/kmsg would be
(the records already there count only when they are recent)."""

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import async_test, until

from patroller.config import Config, load
from patroller.observe.kernlog import KernelLog
from patroller.observe.signals import Signals
from patroller.observe.xid import XidLine, parse_xid, pci_key

LINES = (Path(__file__).parent / "fixtures" / "kmsg" / "xid-lines.txt").read_text().splitlines()


def test_the_published_xid_lines_are_read():
    found = [parse_xid(line) for line in LINES]
    assert [(x.pci, x.xid, x.pid, x.name) if x else None for x in found] == [
        ("0000:cb:00", 13, None, None),  # pid='<unknown>'
        ("0000:cb:00", 109, 1797828, "pt_main_thread"),
        ("0000:dc:00", 45, 1818990, "python3"),
        ("0000:44:00", 79, None, None),  # the GPU's own fault: no process
        ("0000:43:00", 13, None, None),
        ("0000:07:00", 13, None, None),  # an older driver: no pid at all
        ("0000:01:00", 13, 1773, ".gala-wrapped"),
        ("0000:00:00", 149, None, None),
        None,  # fallen off the bus, but no Xid line
    ]
    assert found[3].text == "GPU has fallen off the bus"
    assert found[2].text == "Ch 00000001 caused by previous Xid 149"
    assert all(x.uptime is None for x in found if x)  # no /dev/kmsg record: no time


def test_a_kmsg_record_says_when_and_a_sub_code_is_read_past():
    found = parse_xid(
        "4,1234,93297027938,-;NVRM: Xid (PCI:0000:3B:00.0): 149.38, pid=77, "
        "name=python3, NETIR_LINK_EVT Fatal"
    )
    assert found == XidLine(
        "0000:3b:00", 149, 77, "python3", "NETIR_LINK_EVT Fatal", uptime=93297.027938
    )


def test_pci_addresses_of_both_sides_meet():
    assert pci_key("00000000:3B:00.0") == pci_key("0000:3b:00") == "0000:3b:00"
    assert pci_key("00000001:01:00.0") == "0001:01:00"
    assert pci_key("3b:00.0") == "0000:3b:00"
    assert pci_key("GPU-1234") is None and pci_key(None) is None


def kmsg(xid: int, uptime: float, pci: str = "0000:01:00") -> str:
    return (
        f"3,{int(uptime)},{int(uptime * 1e6)},-;NVRM: Xid (PCI:{pci}): {xid}, pid=9, "
        "name=python, text\n"
    )


def follow(path: str, **settings) -> tuple:
    signals, seen = Signals(), []
    signals.xid.connect(lambda sender, record: seen.append(record), weak=False)
    config = replace(
        Config(), kernel_log=path, kernel_log_poll=0.05, kernel_log_retry=0.1, **settings
    )
    return KernelLog(signals, config), seen


@async_test
async def test_a_file_is_followed_from_now_with_the_recent_xids_of_before(tmp_path):
    path = str(tmp_path / "kmsg")
    now = time.monotonic()
    with open(path, "w") as f:
        f.write(kmsg(79, now - 7200))  # two hours ago: before the window
        f.write(kmsg(48, now - 30))  # half a minute ago: it counts
        f.write("NVRM: Xid (PCI:0000:01:00): 94, no time: does not count\n")
    log, seen = follow(path, xid_recall=3600.0)
    log.start()
    try:
        await until(lambda: log.lines == 3)  # counted once handled: the Xids are sent
        assert log.xids == 1
        await until(lambda: len(seen) == 1)
        assert [x.xid for x in seen] == [48]
        with open(path, "a") as f:
            f.write("unrelated line\n" + kmsg(63, now)[:20])  # half a record: not yet
            f.flush()
            await until(lambda: log.lines == 4)
            assert log.xids == 1
            f.write(kmsg(63, now)[20:] + LINES[3] + "\n")
        await until(lambda: len(seen) == 3)
        assert [(x.xid, x.pci) for x in seen] == [
            (48, "0000:01:00"),
            (63, "0000:01:00"),
            (79, "0000:44:00"),
        ]
        assert log.metrics().to_json() == {"state": "up", "lines": 6, "xids": 3, "failures": 0}
    finally:
        await log.stop(2.0)
    assert not log._thread.is_alive()


@async_test
async def test_a_fifo_is_followed_and_a_missing_log_is_tried_again(tmp_path):
    path = str(tmp_path / "kmsg")
    log, seen = follow(path)
    log.start()
    try:
        await until(lambda: log.failures >= 2)  # not there yet: tried again
        assert log.metrics().state == "failing"
        os.mkfifo(path)
        await until(lambda: log.metrics().state == "up")
        writer = os.open(path, os.O_WRONLY)
        os.write(writer, (LINES[2] + "\n").encode())
        await until(lambda: len(seen) == 1)
        assert seen[0].pid == 1818990
        os.close(writer)  # no writer: nothing to read, no busy loop, no failure
        failures = log.failures
        await asyncio.sleep(0.3)
        assert log.failures == failures and log.metrics().state == "up"
    finally:
        await log.stop(2.0)
    assert not log._thread.is_alive()


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK), reason="/dev/kmsg is not readable")
@async_test
async def test_the_real_kernel_log_is_read_without_blocking_and_stops_at_once():
    log, seen = follow("/dev/kmsg", xid_recall=0.0)
    log.start()
    await until(lambda: log.metrics().state == "up")
    await until(lambda: log.lines > 0)  # the ring, read once at start
    started = time.monotonic()
    await log.stop(5.0)
    assert time.monotonic() - started < 2.0 and not log._thread.is_alive()


def test_the_kernel_log_is_a_flag_and_none_follows_none(tmp_path):
    assert load([], environ={}).kernel_log == "/dev/kmsg"
    assert load(["--test"], environ={}).kernel_log is None
    assert load(["--kernel-log", "none"], environ={}).kernel_log is None
    assert load([], environ={"PATROLLER_KERNEL_LOG": ""}).kernel_log is None
    os.chdir(tmp_path)
    assert load(["--kernel-log", "kmsg"], environ={}).kernel_log == str(tmp_path / "kmsg")
