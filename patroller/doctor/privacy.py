"""Who else may read what the daemon keeps: the state directory (the lease book, the usage
history, the pseudonyms' key) and the audit record name every user, account, job and pod, so
each must be the daemon's user's alone (state/private.py makes them so at start).

`probe_privacy` reads modes (blocking: the doctor runs it in the executor); `check_privacy` is
pure, over what it read."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from patroller.doctor.results import Result, failed, ok
from patroller.state.private import open_to_others


@dataclass(frozen=True)
class PrivacyFacts:
    """The modes found open to others, as (path, mode) pairs."""

    state_dir: str | None
    audit_log: str | None  # a file (not `-`), or None
    open_dirs: tuple[tuple[str, int], ...] = ()
    open_files: tuple[tuple[str, int], ...] = ()
    looked_at: int = 0  # files whose mode was read
    unlisted: str | None = None  # why the state directory could not be listed


def probe_privacy(state_dir: str | None, audit_log: str | None) -> PrivacyFacts:
    """The state directory's mode and each file's in it (links and what is not a file are
    passed over, as the daemon passes them over), and the audit record's."""
    audit = audit_log if audit_log not in (None, "", "-") else None
    dirs, files, looked, unlisted = [], [], 0, None
    if state_dir is not None:
        try:
            mode = stat.S_IMODE(os.stat(state_dir).st_mode)
        except OSError:
            mode = None  # not there yet (made 0700 at start), or the state check says why
        if mode is not None and open_to_others(mode):
            dirs.append((state_dir, mode))
        if mode is not None:
            try:
                names = sorted(os.listdir(state_dir))
            except OSError as exc:
                names, unlisted = [], exc.strerror or str(exc)
            for name in names:
                found = _file_mode(os.path.join(state_dir, name))
                looked += found is not None
                if found is not None and open_to_others(found):
                    files.append((os.path.join(state_dir, name), found))
    if audit is not None:
        found = _file_mode(audit)
        looked += found is not None
        if found is not None and open_to_others(found):
            files.append((audit, found))
    return PrivacyFacts(state_dir, audit, tuple(dirs), tuple(files), looked, unlisted)


def _file_mode(path: str) -> int | None:
    """The permission bits of a regular file at `path` (a link not followed), or None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode) else None


def check_privacy(facts: PrivacyFacts) -> Result:
    """Failed when others may enter the state directory or read a file in it or the audit
    record, with the commands that close them."""
    name = "private files"
    if facts.state_dir is None and facts.audit_log is None:
        return ok(name, "no state directory and no audit record file: nothing kept on disk")
    if facts.open_dirs or facts.open_files:
        opened = [f"{path} is mode {mode:o}" for path, mode in facts.open_dirs + facts.open_files]
        shown = "; ".join(opened[:4]) + (f" and {len(opened) - 4} more" if len(opened) > 4 else "")
        fix = [f"chmod 700 {path}" for path, _ in facts.open_dirs]
        if facts.open_files:
            fix.append(
                "chmod 600 "
                + " ".join(path for path, _ in facts.open_files[:4])
                + (" ..." if len(facts.open_files) > 4 else "")
            )
        return failed(
            name,
            f"{shown}: other local users may read the usage history, the "
            "audit record or the lease book, whoever --hide-users hides",
            "; ".join(fix) + " (the daemon makes the state directory private at "
            "start); under systemd: StateDirectoryMode=0700, LogsDirectoryMode=0750 "
            "and UMask=0077, as `patroller systemd-unit` prints them",
        )
    kept = [
        what
        for what, there in (
            ("the state directory", facts.state_dir),
            ("the audit record", facts.audit_log),
        )
        if there
    ]
    said = f"{' and '.join(kept)}: {facts.looked_at} file(s), none open to other users"
    if facts.unlisted is not None:
        said += f" (the state directory could not be listed: {facts.unlisted})"
    return ok(name, said)
