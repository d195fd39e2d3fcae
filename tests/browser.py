"""A real headless browser (Debian's `chromium` and `chromium-driver`, driven by Selenium) for
the web page's tests, the screenshot script and the benchmark.

`browser()` starts one: under CI=true a missing browser, driver or Selenium fails the test,
elsewhere the test is skipped with the reason (tests/setup.sh installs them as root on Debian
or Ubuntu). Nothing is downloaded: Selenium is pointed at /usr/bin/chromedriver, whose version
is the browser's own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

BROWSERS = ("chromium", "chromium-browser")
DRIVERS = ("chromedriver",)
HINT = (
    "tests/setup.sh installs Debian's chromium and chromium-driver, and the test extra "
    "installs selenium"
)


class BrowserUnavailable(Exception):
    """No headless browser can be started here, and why."""


def _which(names: tuple[str, ...], extra: tuple[str, ...] = ()) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    for path in extra:
        if os.access(path, os.X_OK):
            return path
    return None


def find() -> tuple[str, str]:
    """(browser, driver) paths; BrowserUnavailable when either or Selenium is missing."""
    try:
        import selenium  # noqa: F401 (is it installed?)
    except ImportError as exc:
        raise BrowserUnavailable(f"selenium is not installed ({exc}); {HINT}") from None
    binary = _which(BROWSERS, ("/usr/lib/chromium/chromium",))
    if binary is None:
        raise BrowserUnavailable(f"chromium is not installed; {HINT}")
    driver = _which(DRIVERS, ("/usr/lib/chromium/chromedriver",))
    if driver is None:
        raise BrowserUnavailable(f"chromedriver is not installed; {HINT}")
    return binary, driver


class Browser:
    """Headless Chromium through chromedriver, with a profile of its own in a temporary
    directory."""

    def __init__(self, width: int = 1400, height: int = 1000) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        binary, driver = find()
        self.profile = tempfile.TemporaryDirectory(prefix="patroller-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for argument in (
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-extensions",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            f"--window-size={width},{height}",
            f"--user-data-dir={self.profile.name}",
        ):
            options.add_argument(argument)
        # The browser's console (CSP violations, script errors) for the tests to read.
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        try:
            self.driver = webdriver.Chrome(
                options=options, service=Service(executable_path=driver)
            )
        except Exception as exc:  # the driver did not start: say why, as a missing tool
            self.profile.cleanup()
            raise BrowserUnavailable(f"headless chromium did not start: {exc}") from None
        self.driver.set_page_load_timeout(30)
        self.driver.set_window_size(width, height)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def resize(self, width: int, height: int) -> None:
        """The window's size from now on (the page is laid out again)."""
        self.driver.set_window_size(width, height)

    def js(self, script: str, *args: Any) -> Any:
        """The value of a JavaScript function body (`return ...`) run in the page."""
        return self.driver.execute_script(script, *args)

    def until(self, probe: Callable[[], T | None], what: str, timeout: float = 10) -> T:
        """Poll probe() until it returns something other than None or False; fail after
        `timeout` seconds with `what` and the last value seen."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = probe()
            if last is not None and last is not False:
                return last
            time.sleep(0.05)
        raise AssertionError(f"{what}: not seen within {timeout}s; last: {last!r}")

    def cards(self) -> list[dict[str, Any]]:
        """Every GPU card as the page shows it: number, state, holder, text, processes."""
        return self.js("""
            return Array.from(document.querySelectorAll('#gpus .card')).map((c) => ({
              number: Number(c.dataset.number), uuid: c.dataset.uuid, state: c.dataset.state,
              idle: c.dataset.idle === '1',
              holder: (c.querySelector('.holder') || {}).textContent || '',
              holder_html: (c.querySelector('.holder') || {}).innerHTML || '',
              bold: c.querySelectorAll('.holder b, .holder *').length,
              text: c.innerText,
              processes: Array.from(c.querySelectorAll('.procs tbody tr')).map((r) => ({
                pid: Number(r.dataset.pid), command: r.querySelector('.command').textContent,
                memory: r.querySelector('.pmem').textContent,
                user: r.querySelector('.puser').textContent})),
            }));""")

    def card(self, number: int) -> dict[str, Any] | None:
        return next((c for c in self.cards() if c["number"] == number), None)

    def connection(self) -> str:
        """What the page says of its connection: connecting, live or lost."""
        return self.js("return document.body.dataset.connection")

    def banner_shown(self) -> bool:
        return self.js(
            "const b = document.getElementById('banner');"
            "return !b.hidden && b.offsetParent !== null ? b.textContent : false"
        )

    def console(self) -> list[dict[str, Any]]:
        """The browser console's entries since the last call."""
        try:
            return self.driver.get_log("browser")
        except Exception:  # some driver versions do not keep the log
            return []

    def color_scheme(self, scheme: str) -> None:
        """What prefers-color-scheme says from now on: "light" or "dark"."""
        self.driver.execute_cdp_cmd(
            "Emulation.setEmulatedMedia",
            {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
        )

    def screenshot(self, path: str) -> None:
        self.driver.save_screenshot(path)

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            self.profile.cleanup()


def browser(**options: Any) -> Browser:
    """A started Browser; under CI=true its absence fails the test, elsewhere skips it."""
    import pytest

    try:
        return Browser(**options)
    except BrowserUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the web page's browser tests, but {exc}")
        pytest.skip(str(exc))
        raise AssertionError("unreachable") from exc
