"""How a command ends: the exit statuses (sysexits.h where one fits) and the failure that
carries one.

0 done; 2 bad usage; 69 server unreachable (EX_UNAVAILABLE); 75 busy, or not free in time
(EX_TEMPFAIL); 77 refused by the server (EX_NOPERM: any other 4xx, the server's error is
printed); 78 a check of `patroller doctor` failed (EX_CONFIG); 126 command not executable; 127
command not found; 130 interrupted (Ctrl-C) while
waiting; 141 the reader of the output left (a pipe closed early: `| head`), as SIGPIPE ends a
Unix tool. Once `run` has started the command, the status is the command's own.
"""

from __future__ import annotations

from patroller.client import RequestRefused
from patroller.safetext import printable

EX_OK = 0
EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_NOPERM = 77
EX_CONFIG = 78
EX_NOEXEC = 126
EX_NOTFOUND = 127
EX_INTERRUPTED = 130
EX_PIPE = 141  # 128 + SIGPIPE: what the shell says of a tool that SIGPIPE ended


class Failure(Exception):
    """A command ends with a message for people and an exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def error_text(refused: RequestRefused) -> str:
    """A refusal's words, printable: they are the daemon's, and may quote what others chose."""
    return printable(
        str(refused.body.get("error", refused.body))
        if isinstance(refused.body, dict)
        else str(refused.body)
    )


def refused_code(refused: RequestRefused) -> int:
    """77 for a refusal (4xx), 69 for a server that cannot serve (5xx)."""
    return EX_UNAVAILABLE if refused.status >= 500 else EX_NOPERM
