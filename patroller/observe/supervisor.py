"""The one way Patroller runs an nvidia-smi child: `RestartingChild` for the dmon and pmon
streams, which run as long as the daemon does (restarted after a growing delay when they exit,
killed and restarted when they print nothing for too long: a hung nvidia-smi stays alive and
silent), and `OneShotChild` for the queries (`-q -x`, `--query-compute-apps`), killed when they
take longer than their timeout. Each run is a `Child` (child.py): its own process group, the
parent-death signal, its exit awaited. Stopping either terminates the child's group, and kills
it after the grace given.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from patroller.config import Config
from patroller.core.throttle import Throttle
from patroller.durations import describe
from patroller.observe.child import Child, one_line, status_text

log = logging.getLogger(__name__)


class Backoff:
    """Restart delays: `first` doubling up to `limit`; back to `first` after a healthy run."""

    def __init__(self, first: float, limit: float, healthy: float) -> None:
        self.first, self.limit, self.healthy = first, limit, healthy
        self._next = first

    def delay(self, ran: float) -> float:
        """The delay before the next start, given how long the last run lasted."""
        if ran >= self.healthy:
            self._next = self.first
        delay = self._next
        self._next = min(self.limit, self._next * 2)
        return delay


class RestartingChild:
    """Runs `argv` for as long as the daemon runs, handing each line of its output to `on_line`.

    After an exit it is started again after the Backoff's delay; `restart()` starts it again at
    once. A child that prints nothing for `stream_silence` s is hung: one warning, its group
    killed, restarted with the usual delay. Its first output may take `stream_startup` s.
    `on_exit(status, what it said)` hears of every exit that was not asked for.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        on_line: Callable[[str], None],
        config: Config,
        env: Mapping[str, str] | None = None,
        on_start: Callable[[], None] | None = None,
        on_exit: Callable[[int, str], None] | None = None,
    ) -> None:
        self.name = name
        self.argv = argv  # may be changed between runs: the next start uses it
        self.on_line = on_line
        self.on_start = on_start
        self.on_exit = on_exit
        self.env = dict(env) if env is not None else None
        self.backoff = Backoff(config.restart_first, config.restart_limit, config.restart_healthy)
        self.silence = config.stream_silence
        self.startup = max(config.stream_startup, config.stream_silence)
        self.max_line = config.max_line
        self.slice = config.loop_slice
        self.stderr_tail = config.stderr_tail
        self.linger = config.child_linger
        self.child: Child | None = None  # the current run, or the last one
        self.starts = 0  # how many times the child was started
        self.hangs = 0  # how many times it was killed for printing nothing
        self.last_exit: int | None = None
        self.heard: float | None = None  # monotonic time of its last output in this run
        self._hung = False
        self._stopping = False
        self._again = False  # restart at once, not after the backoff delay
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Future[None] | None = None
        self._recent: collections.deque[str] = collections.deque(maxlen=3)
        self._handler_failures = Throttle(1, config.repeat_log_every)

    @property
    def running(self) -> bool:
        """Whether its child runs now."""
        return self.child is not None and self.child.running

    def start(self) -> None:
        """Begin supervising on the running loop."""
        self._wake = asyncio.Event()  # made here: on Python 3.9 an Event binds to a loop
        self._task = asyncio.ensure_future(self._supervise())

    async def stop(self, grace: float) -> None:
        """Terminate the child (kill its group after `grace` s) and stop restarting it."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self.child is not None:
            self.child.signal(signal.SIGTERM)
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), grace)
            except asyncio.TimeoutError:
                if self.child is not None:
                    self.child.signal(signal.SIGKILL)
                await self._task

    def restart(self) -> None:
        """End the running child and start it again at once (with `argv` as it is now)."""
        self._again = True
        if self._wake is not None:
            self._wake.set()
        if self.child is not None:
            self.child.signal(signal.SIGTERM)

    async def _supervise(self) -> None:
        assert self._wake is not None
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._run_once()
            except Exception:  # a bug in a line handler must not end the supervision
                log.exception("%s: reader failed", self.name)
            if self._stopping:
                break
            if self._again:
                self._again = False
                self._wake.clear()
                log.info("%s: restarting with %s", self.name, " ".join(self.argv[-4:]))
                continue
            delay = self.backoff.delay(time.monotonic() - started)
            log.warning("%s: restarting in %s", self.name, describe(delay))
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except asyncio.TimeoutError:
                pass
            if not self._stopping:  # woken by restart(): it starts now, with the new argv
                self._again = False
                self._wake.clear()

    async def _run_once(self) -> None:
        try:
            child = await Child.start(self.argv, self.env, self.stderr_tail)
        except OSError as exc:
            log.error("%s: cannot start %s: %s", self.name, self.argv[0], exc.strerror or exc)
            self.last_exit = None
            return
        self.child = child
        self.starts += 1
        self._recent.clear()
        self.heard, self._hung = None, False
        log.info("%s: started pid %d", self.name, child.pid)
        if self._stopping:  # stopped while it was being started
            child.signal(signal.SIGTERM)
        if self.on_start is not None:
            self.on_start()
        watch = asyncio.ensure_future(self._watch(child))
        try:
            await self._read_lines(child.stdout)
        except BaseException:
            child.signal(signal.SIGTERM)  # cancelled, or a bug: never leave it behind
            raise
        finally:
            watch.cancel()
            code = await child.exited(self.linger)
        self.last_exit = code
        self._log_exit(code, time.monotonic() - child.started, child.said())

    async def _watch(self, child: Child) -> None:
        """Kill the child's group once it has printed nothing for too long."""
        while True:
            limit = self.startup if self.heard is None else self.silence
            quiet = time.monotonic() - (child.started if self.heard is None else self.heard)
            if quiet >= limit:
                break
            await asyncio.sleep(min(limit - quiet, self.silence))  # the first output shortens it
        if self._stopping:
            return  # being stopped already: not a hang
        self._hung = True
        self.hangs += 1
        said = "nothing since it started" if self.heard is None else "nothing more"
        log.warning("%s: printed %s for %s: hung, killing it", self.name, said, describe(quiet))
        child.signal(signal.SIGKILL)  # a hung nvidia-smi need not answer SIGTERM

    async def _read_lines(self, stdout: asyncio.StreamReader) -> None:
        pending = b""
        discarding = False  # inside a line that grew too long: drop it up to its end
        # This turn on the loop: its start, and the lines since the clock was last read. Both
        # go on from chunk to chunk: a read of what the reader has buffered already returns at
        # once, without letting anything else run.
        began, unchecked = time.monotonic(), 0
        while True:
            chunk = await stdout.read(self.max_line)
            if not chunk:
                break  # end of output: the child exited or closed its stdout
            self.heard = time.monotonic()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if lines and discarding:
                discarding = False
                lines = lines[1:]
            if len(pending) > self.max_line:
                pending, discarding = b"", True
            for line in lines:
                if len(line) <= self.max_line:
                    self._deliver(line)
                unchecked += 1
                if unchecked == 32:
                    unchecked = 0
                    if time.monotonic() - began > self.slice:
                        await asyncio.sleep(0)  # a burst of lines lets requests in between
                        began = time.monotonic()
        if pending and not discarding:
            self._deliver(pending)

    def _deliver(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace")
        self._recent.append(line)
        try:
            self.on_line(line)
        except Exception:  # a handler's bug loses one line, not the stream
            admitted, held = self._handler_failures.admit()
            if admitted:
                log.exception(
                    "%s: handling a line failed%s: %r",
                    self.name,
                    f" ({held} more since the last report)" if held else "",
                    line[:200],
                )

    def _log_exit(self, code: int, ran: float, stderr: str) -> None:
        if self._stopping:
            log.info("%s: stopped (status %s)", self.name, code)
            return
        if self._hung:  # the warning was given when it was killed
            log.info("%s: hung child ended (status %s) after %s", self.name, code, describe(ran))
            return
        if self._again:  # restarted on purpose
            return
        said = stderr or " / ".join(self._recent).strip()
        if self.on_exit is not None:
            try:
                self.on_exit(code, said)
            except Exception:
                log.exception("%s: exit handler failed", self.name)
        log.warning(
            "%s: exited with %s after %s%s",
            self.name,
            status_text(code),
            describe(ran),
            f": {said[-500:]}" if said else "",
        )


@dataclass(frozen=True)
class Answer:
    """How one run of a OneShotChild ended."""

    output: str = ""  # its stdout
    status: int | None = None  # its exit status (negative: the signal); None: never started
    said: str = ""  # the tail of its stderr
    error: OSError | None = None  # why it could not be started
    timed_out: bool = False  # killed for taking longer than its timeout
    stopped: bool = False  # ended by stop(): whatever it printed is incomplete

    def account(self) -> str:
        """What it said, on one line: its stderr, else its output."""
        return one_line(self.said) or one_line(self.output) or "nothing"


class OneShotChild:
    """Runs `argv` to its end, one run at a time. A run that takes longer than `timeout` s is
    killed, its whole group (a hung nvidia-smi need not answer SIGTERM), and counted in
    `hangs`. `stop()` ends a run in progress and refuses later ones."""

    def __init__(
        self, argv: list[str], env: Mapping[str, str] | None, timeout: float, config: Config
    ) -> None:
        self.argv = argv
        self.env = env
        self.timeout = timeout
        self.stderr_tail = config.stderr_tail
        self.linger = config.child_linger
        self.child: Child | None = None  # the run in progress
        self.hangs = 0
        self._stopping = False

    @property
    def running(self) -> bool:
        return self.child is not None and self.child.running

    async def run(self) -> Answer:
        """One run, to its end, its timeout or a stop."""
        if self._stopping:
            return Answer(stopped=True)
        try:
            child = await Child.start(self.argv, self.env, self.stderr_tail)
        except OSError as exc:
            return Answer(error=exc)
        self.child = child
        if self._stopping:  # stopped while it was being started
            child.signal(signal.SIGKILL)
        finishing = asyncio.ensure_future(self._finish(child))
        timed_out = False
        try:
            output, code = await asyncio.wait_for(asyncio.shield(finishing), self.timeout)
        except asyncio.TimeoutError:
            timed_out = not self._stopping
            if timed_out:
                self.hangs += 1
            child.signal(signal.SIGKILL)
            output, code = await finishing
        except asyncio.CancelledError:
            child.signal(signal.SIGKILL)  # never left behind
            # and its exit collected before the caller goes on: a loop that closes meanwhile
            # (the doctor giving up at its bound) would leave its pipes open
            await asyncio.shield(finishing)
            raise
        finally:
            self.child = None
        return Answer(
            output.decode("utf-8", "replace"),
            code,
            child.said(),
            timed_out=timed_out,
            stopped=self._stopping,
        )

    async def stop(self, grace: float) -> None:
        """End the run in progress (its group killed after `grace` s); no run after this."""
        self._stopping = True
        if self.child is not None:
            await self.child.end(grace)

    async def _finish(self, child: Child) -> tuple[bytes, int]:
        output = await child.stdout.read()
        return output, await child.exited(self.linger)


def problem(answer: Answer, query: OneShotChild) -> str:
    """Why a query gave no answer (it could not start, timed out, or failed), in a few words."""
    if answer.error is not None:
        return f"cannot start {query.argv[0]}: {answer.error.strerror or answer.error}"
    if answer.timed_out:
        return f"no answer in {describe(query.timeout)}: killed"
    assert answer.status is not None
    return f"{status_text(answer.status)}: {answer.account()}"
