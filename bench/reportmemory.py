"""The daemon's memory while clients ask year-long usage reports at once, and once they stop:
its RSS idle, at its highest during the reports, and 1, 15 and 30 s after (the reader lets its
connection and answers go once no report came for Config.usage_reader_idle, 10 s), with the
answers' statuses (200, or 429 past Config.usage_reports_at_once) and /status's latency
meanwhile.

    python -m bench.reportmemory [--store DIR] [--days 365] [--clients 8] [--seconds 20]

Without --store, a store of `--days` days of 8 GPUs is written first (bench/usage.py's fill: a
year takes some 8 minutes on two cores).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from typing import Any

from .harness import Daemon
from .usage import fill

GROUPINGS = ["user", "day", "job", "gpu", "day,user", "hour", "weekday,hour", "account"]


def measure(
    daemon: Daemon,
    days: int,
    clients: int,
    seconds: float,
    marks: tuple[int, ...] = (1, 15, 30),
    settle: float = 3.0,
) -> dict[str, Any]:
    """RSS (MiB) idle (`settle` s after 50 /status), at its highest while `clients` ask
    `days`-day reports for `seconds`, and `marks` seconds after; each client asks the next
    grouping, an hour shorter each time (none answered from memory), and waits 0.2 s after a
    429."""
    for _ in range(50):
        daemon.get("/status")
    time.sleep(settle)
    idle = daemon.rss_mib()
    stop = threading.Event()
    codes: dict[int, int] = {}
    sizes: list[int] = []

    def client(n: int) -> None:
        k = 0
        while not stop.is_set():
            by = GROUPINGS[(n + k) % len(GROUPINGS)]
            status, body = daemon.get(f"/usage?since={days * 24 - k % 500}h&by={by}", 120)
            codes[status] = codes.get(status, 0) + 1
            if status == 200:
                sizes.append(len(json.dumps(body)))
            elif status == 429:
                time.sleep(0.2)
            k += 1

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    for thread in threads:
        thread.start()
    peak, latency = idle, []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        daemon.get("/status")
        latency.append((time.monotonic() - began) * 1000)
        peak = max(peak, daemon.rss_mib())
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(120)
    after: dict[str, float] = {}
    began = time.monotonic()
    for mark in marks:
        time.sleep(max(0.0, began + mark - time.monotonic()))
        after[f"{mark}s"] = round(daemon.rss_mib(), 1)
    return {
        "idle_mib": round(idle, 1),
        "peak_mib": round(peak, 1),
        "after_mib": after,
        "codes": {str(k): v for k, v in sorted(codes.items())},
        "largest_answer_mb": round(max(sizes) / 1e6, 2) if sizes else None,
        "status_ms": {
            "median": round(statistics.median(latency), 1),
            "max": round(max(latency), 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reportmemory")
    parser.add_argument("--store", help="a directory holding usage.sqlite3 (else one is made)")
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    directory = args.store or tempfile.mkdtemp(prefix="pbench-reportmemory")
    try:
        if args.store is None:
            fill(directory, 8, args.days, int(time.time()) // 60 * 60)
        daemon = Daemon(8, state_dir=directory).start()
        try:
            print(json.dumps(measure(daemon, args.days, args.clients, args.seconds)))
        finally:
            daemon.stop()
    finally:
        if args.store is None:
            shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
