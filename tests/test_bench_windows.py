"""The benchmark's windows taking turns (bench/windows.py and windows.lua): a schedule, wrk's
requests counted in the window they began in, pooled percentiles and their comparison over
resampled cycles. The end-to-end test runs the real wrk against a real HTTP server on loopback
that answers as the schedule's window says."""

import math
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import windows
from bench.harness import have_wrk


def expanded(histograms, weights=None):
    """Every request's bucket, each histogram repeated as often as its weight."""
    weights = weights or [1] * len(histograms)
    return sorted(
        bucket
        for histogram, weight in zip(histograms, weights, strict=True)
        for bucket, count in histogram.items()
        for _ in range(count * weight)
    )


def test_a_pooled_percentile_is_that_of_every_request_together():
    draw = random.Random(7)
    for _ in range(40):
        histograms = [
            {draw.randrange(0, 400): draw.randrange(1, 20) for _ in range(draw.randrange(0, 30))}
            for _ in range(draw.randrange(1, 8))
        ]
        weights = [draw.randrange(0, 3) for _ in histograms]
        every = expanded(histograms, weights)
        pool = windows.Pool(histograms)
        for q in (0.5, 0.9, 0.99, 1.0):
            found = pool.percentile(q, weights)
            if not every:
                assert found is None
                continue
            # the smallest bucket with at least q of the requests at or below it
            wanted = every[max(0, math.ceil(q * len(every)) - 1)]
            assert found == pytest.approx((wanted + 0.5) * windows.BUCKET_MS), (q, weights)


def test_a_comparison_keeps_each_cycle_whole():
    """The machine's speed moves tenfold between cycles, and in each cycle both arms read the
    same: the ratio is exactly 1 and so is every resampled one. Drawing the arms' cycles apart
    would spread it."""
    cycles = []
    for scale in (1, 10, 2, 7, 3, 5):
        histogram = {10 * scale + k: 5 for k in range(20)}
        cycles.append({"with": dict(histogram), "without": dict(histogram)})
    found = windows.compare(cycles, "with", "without", resamples=300)
    assert found == {"ratio": 1.0, "low": 1.0, "high": 1.0, "cycles": 6}


def test_a_slower_arm_reads_as_a_ratio_with_its_interval():
    draw = random.Random(3)
    cycles = []
    for _ in range(30):
        speed = draw.uniform(0.5, 2.0)  # the machine's, the same for both arms of a cycle
        without = {round(speed * draw.gauss(300, 40)): 1 for _ in range(200)}
        slower = {round(speed * draw.gauss(390, 52)): 1 for _ in range(200)}
        cycles.append({"without": without, "with": slower, "again": dict(without)})
    found = windows.compare(cycles, "with", "without", resamples=300)
    assert 1.2 < found["low"] < found["ratio"] < found["high"] < 1.45
    assert windows.compare(cycles, "again", "without", resamples=300)["ratio"] == 1.0
    assert windows.compare([{"with": {}, "without": {1: 1}}], "with", "without") is None


def test_a_schedule_has_each_arm_once_a_cycle_and_is_read_back(tmp_path):
    schedule = windows.Schedule.shuffled(("a", "b", "c"), 50, 0.2, 0.05, lead=1.0, seed=4)
    assert len(schedule.phases) == 150
    orders = {tuple(schedule.phases[i : i + 3]) for i in range(0, 150, 3)}
    assert all(sorted(order) == [0, 1, 2] for order in orders)
    assert len(orders) > 3  # shuffled, not one order again and again
    path = str(tmp_path / "schedule")
    schedule.write(path)
    assert windows.Schedule.read(path) == schedule
    start = schedule.start
    assert schedule.window_at(start - 0.001) is None
    assert schedule.window_at(start) == 0
    assert schedule.window_at(start + 0.2 * 7 + 0.01) == 7
    assert schedule.arm_at(start + 0.2 * 7 + 0.01) == "abc"[schedule.phases[7]]
    assert schedule.window_at(schedule.end) is None
    counted = {7: {3: 1}, 8: {4: 2}}
    cycle = schedule.cycles(counted)[2]  # windows 6, 7 and 8
    assert cycle[schedule.arms[schedule.phases[7]]] == {3: 1}
    assert cycle[schedule.arms[schedule.phases[6]]] == {}
    assert len(schedule.cycles(counted)) == 50


def test_windows_lua_lines_are_parsed():
    found = windows.parse("noise\nW 300017 4\nW 300018 1\nW -4 2\nW 17 9\nW 300017 1\n")
    assert found.windows == {3: {17: 5, 18: 1}, 0: {17: 9}}
    assert found.errors == {3: 2}


LAG = 0.015  # how long the server's answers follow the window before (less than the guard)


@pytest.mark.skipif(not have_wrk(), reason="wrk is not installed (tests/setup.sh installs it)")
def test_wrk_counts_each_request_in_the_window_it_began_in(tmp_path):
    """A server that answers in 60 ms in the windows `slow`, at once in the windows `fast`,
    and 503 in the windows `broken`, each as the schedule says LAG (15 ms) before the request:
    each window's start still answers as the window before it did. wrk's script counts a
    request in the window in which it began, and only past that window's guard (30 ms): every
    request counted in a slow window took 60 ms, those in a fast window (where a slow answer
    begun in the window before may end past the guard) less, and the answers that were not
    200 are counted in the broken windows. A few requests are let through, for a server thread
    late by more than the guard's margin on a loaded machine."""
    holder = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # the head and the body in two writes, at once

        def do_GET(self):
            arm = holder["schedule"].arm_at(time.monotonic() - LAG)
            if arm == "slow":
                time.sleep(0.06)
            self.send_response(503 if arm == "broken" else 200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    schedule = windows.Schedule.shuffled(("fast", "slow", "broken"), 6, 0.2, 0.03, 0.5, seed=1)
    holder["schedule"] = schedule
    try:
        counted = windows.run(
            f"http://127.0.0.1:{server.server_address[1]}/", schedule, str(tmp_path / "s"), 4
        )
    finally:
        server.shutdown()
        server.server_close()
    cycles = schedule.cycles(counted.windows)
    slow = expanded([cycle["slow"] for cycle in cycles])
    fast = expanded([cycle["fast"] for cycle in cycles])
    broken = expanded([cycle["broken"] for cycle in cycles])  # its answers are errors
    assert len(slow) > 30 and len(fast) > 300
    assert sum(bucket < 6000 for bucket in slow) <= 3  # 60 ms: 6000 buckets of 10 us
    assert sum(bucket >= 6000 for bucket in fast) <= 3
    assert len(broken) <= 3
    phases = {k: schedule.arms[phase] for k, phase in enumerate(schedule.phases)}
    errors = {arm: 0 for arm in schedule.arms}
    for window, count in counted.errors.items():
        errors[phases[window]] += count
    assert errors["broken"] > 100 and errors["fast"] + errors["slow"] <= 3
