"""`patroller run`: reserve GPUs for the command's own process, then become the command.

The reservation is held with hold=process for this very pid, which `exec` keeps: the GPUs are
held exactly as long as the command runs. While the request waits, a progress line says where
it stands in the queue.
"""

from __future__ import annotations

import argparse
import errno
import os
import shlex
import shutil
import sys
import threading
import time
from typing import Any, TextIO

from patroller import client
from patroller.cli.exits import EX_NOEXEC, EX_NOTFOUND, EX_OK, EX_TEMPFAIL, EX_USAGE, Failure
from patroller.cli.render import (
    amount,
    describe,
    duration,
    holders_summary,
    numbers_of,
    progress_message,
)
from patroller.cli.table import cut
from patroller.client import PatrollerError, RequestRefused
from patroller.safetext import printable

PROGRESS_EVERY = 1.0  # seconds between looks at the queue while waiting
QUEUE_GRACE = 3.0  # seconds the progress line waits for the request to show in /queue
PIPED_PROGRESS_EVERY = 10.0  # at most one progress line this often when stderr is not a terminal


def run_command(options: argparse.Namespace) -> int:
    """Reserve with hold=process, then exec the command in this very process."""
    command = list(options.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise Failure("run needs a command: patroller run -n 1 -- python train.py", EX_USAGE)
    check_command(command[0])
    granted = reserve_for_run(options)
    numbers = numbers_of(granted, "gpu")
    if numbers:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(numbers)
        os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if not options.quiet:
        print(
            printable(
                f"patroller: {describe(granted)} reserved while pid {os.getpid()} runs: "
                f"{shlex.join(command)}"
            ),
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        for device in granted:
            try:
                client.release(options.server, device["uuid"])
            except PatrollerError:
                pass  # the reservation ends with this process anyway
        code = EX_NOTFOUND if exc.errno == errno.ENOENT else EX_NOEXEC
        raise Failure(f"cannot run {command[0]}: {exc.strerror or exc}", code) from None
    return EX_OK  # not reached: exec replaced this process


def check_command(name: str) -> None:
    """Fail before reserving anything when the command cannot be run."""
    if "/" in name:
        if not os.path.exists(name):
            raise Failure(f"{name}: no such file", EX_NOTFOUND)
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise Failure(f"{name}: not executable", EX_NOEXEC)
        return
    if shutil.which(name) is not None:
        return
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if os.path.isfile(os.path.join(directory or ".", name)):
            raise Failure(f"{name}: not executable", EX_NOEXEC)
    raise Failure(f"{name}: command not found", EX_NOTFOUND)


def reserve_for_run(options: argparse.Namespace) -> list[dict[str, Any]]:
    if options.wait is False:  # no --wait: ask once
        granted = client.reserve(
            options.count, options.server, 0, options.resource, "process", options.link
        )
        if granted is None:
            raise Failure(
                busy_message(options.server, options.count, options.resource)
                + "; add --wait SECONDS or --wait forever to queue",
                EX_TEMPFAIL,
            )
        return granted
    progress = Progress(options.server, options.count, options.resource, sys.stderr)
    progress.start()
    try:
        granted = client.reserve(
            options.count, options.server, options.wait, options.resource, "process", options.link
        )
    finally:
        progress.stop()
    if granted is None:
        raise Failure(
            f"{amount(options.count, options.resource)} not free within "
            f"{duration(options.wait or 0)}",
            EX_TEMPFAIL,
        )
    return granted


class Progress:
    """One line on stderr while a request waits: place in the queue, holders, time waited.

    A daemon thread with connections of its own: the wait itself runs in the main thread, where
    Ctrl-C lands. On a terminal the line is redrawn in place; otherwise a line is printed when
    what it says changes, at most every PIPED_PROGRESS_EVERY seconds.
    """

    def __init__(self, server: str | None, count: int, resource: str, out: TextIO) -> None:
        self.server, self.count, self.resource, self.out = server, count, resource, out
        self.terminal = out.isatty()
        self.started = time.monotonic()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="patroller-progress", daemon=True)
        self._shown = False
        self._last_key: str | None = None
        self._last_print = -PIPED_PROGRESS_EVERY

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(5)
        if self.terminal and self._shown:
            self.out.write("\r\033[K")
            self.out.flush()

    def _run(self) -> None:
        inventory: dict[str, Any] = {}
        while not self._stopping.is_set():
            try:
                if not inventory:
                    inventory = client.devices(self.server)
                queued = optional_queue(self.server)
                claims = client.status(self.server)
            except PatrollerError:
                queued, claims = None, None
            if self._stopping.is_set():
                return
            waited = time.monotonic() - self.started
            if (
                queued is not None
                and waited < QUEUE_GRACE
                and not any(w.get("pid") == os.getpid() for w in queued)
            ):
                self._stopping.wait(PROGRESS_EVERY / 10)  # the request is not in the queue yet
                continue
            key = progress_message(
                self.count, self.resource, os.getpid(), queued, claims, inventory, None
            )
            self._show(
                key,
                progress_message(
                    self.count, self.resource, os.getpid(), queued, claims, inventory, waited
                ),
            )
            self._stopping.wait(PROGRESS_EVERY)

    def _show(self, key: str, line: str) -> None:
        now = time.monotonic()
        line = printable(line)  # holders' names, as the daemon says them
        if self.terminal:
            width = shutil.get_terminal_size().columns
            self.out.write("\r\033[K" + cut(line, max(width - 1, 20)))
        elif key != self._last_key and now - self._last_print >= PIPED_PROGRESS_EVERY:
            self.out.write(line + "\n")
            self._last_key, self._last_print = key, now
        else:
            return
        self.out.flush()
        self._shown = True


def busy_message(server: str | None, count: int, resource: str) -> str:
    try:
        summary = "; " + holders_summary(client.status(server), client.devices(server), resource)
    except PatrollerError:
        summary = ""
    return f"busy: {amount(count, resource)} not free now{summary}"


def optional_users(server: str | None) -> dict[str, Any] | None:
    """/users, or None from a server without it."""
    try:
        return client.users(server)
    except RequestRefused:
        return None


def optional_queue(server: str | None) -> list[dict[str, Any]] | None:
    """/queue, or None from a server without it."""
    try:
        return client.queue(server)
    except RequestRefused:
        return None
