"""Take docs/report.png: the usage report's page (/report) over a lab's month of history.

    .venv/bin/python scripts/report_screenshot.py [--out docs/report.png] [--dark]

A test-mode daemon whose usage store holds 30 days of eight GPUs (tests/usage_history.py's
lab: hours written straight into the file, as its writer writes them), its page opened in
headless Chromium (tests/browser.py) at 1400x1700 once the charts are drawn. The browser's time
zone is UTC, the lab's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
sys.path[:0] = [ROOT, TESTS]

from browser import Browser
from helpers import ServerProcess
from usage_history import lab, write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "report.png"))
    parser.add_argument("--dark", action="store_true", help="the dark colour scheme")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1700)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="patroller-report-") as state:
        write(os.path.join(state, "usage.sqlite3"), lab(time.time(), 30))
        server = ServerProcess("--test", "--state-dir", state, "--usage-interval", "1h").start()
        browser = Browser(width=options.width, height=options.height)
        try:
            browser.driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "UTC"})
            if options.dark:
                browser.color_scheme("dark")
            browser.open(server.url + "/report")
            browser.until(
                lambda: browser.js("return document.body.dataset.state === 'shown'"),
                "the report drawn",
                timeout=30,
            )
            browser.screenshot(options.out)
        finally:
            browser.quit()
            server.stop()
    print(options.out)


if __name__ == "__main__":
    main()
