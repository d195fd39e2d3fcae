"""The doctor's check of who else may read what the daemon keeps, over real files in tmp_path
(`probe_privacy`: the modes it reads, what it passes over) and word for word over the facts
(`check_privacy`, pure): nothing kept, what was looked at, a directory it could not list, and
the open ones named four at most, with the commands that close them."""

import os

from patroller.doctor.privacy import PrivacyFacts, check_privacy, probe_privacy
from patroller.doctor.results import Result

NAME = "private files"
WHY = (
    ": other local users may read the usage history, the audit record or the lease book, "
    "whoever --hide-users hides"
)
AFTER = (
    " (the daemon makes the state directory private at start); under systemd: "
    "StateDirectoryMode=0700, LogsDirectoryMode=0750 and UMask=0077, as `patroller "
    "systemd-unit` prints them"
)


def made(path, mode: int, text: str = "") -> str:
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_the_modes_read_are_the_regular_files_and_links_and_folders_are_passed_over(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o705)
    book = made(state / "leases.json", 0o604)
    made(state / "pseudonyms.key", 0o600)
    made(state / "usage.sqlite3", 0o600)
    outside = made(tmp_path / "outside", 0o666)
    os.symlink(outside, state / "link")  # not followed: the daemon passes links over
    (state / "folder").mkdir(mode=0o777)
    audit = made(tmp_path / "audit.jsonl", 0o640)
    assert probe_privacy(str(state), audit) == PrivacyFacts(
        str(state), audit, ((str(state), 0o705),), ((book, 0o604), (audit, 0o640)), 4
    )
    os.chmod(state, 0o700)
    os.chmod(book, 0o600)
    assert probe_privacy(str(state), audit) == PrivacyFacts(
        str(state), audit, (), ((audit, 0o640),), 4
    )


def test_an_audit_record_that_is_no_file_is_not_looked_at(tmp_path):
    for audit in (None, "", "-"):
        assert probe_privacy(None, audit) == PrivacyFacts(None, None)
    missing = str(tmp_path / "audit.jsonl")
    assert probe_privacy(None, missing) == PrivacyFacts(None, missing)
    os.symlink(made(tmp_path / "elsewhere", 0o666), missing)
    assert probe_privacy(None, missing) == PrivacyFacts(None, missing)
    os.unlink(missing)
    assert probe_privacy(None, made(tmp_path / "audit.jsonl", 0o600)) == PrivacyFacts(
        None, missing, looked_at=1
    )


def test_a_state_directory_not_there_or_not_listed_is_said_so(tmp_path):
    missing = str(tmp_path / "not-yet")
    assert probe_privacy(missing, None) == PrivacyFacts(missing, None)
    file = made(tmp_path / "a-file", 0o604)  # no directory: it cannot be listed
    facts = probe_privacy(file, None)
    assert facts == PrivacyFacts(file, None, ((file, 0o604),), unlisted=os.strerror(20))
    listless = PrivacyFacts(file, None, looked_at=2, unlisted=os.strerror(20))
    assert check_privacy(listless) == Result(
        NAME,
        "ok",
        "the state directory: 2 file(s), none open to other users (the state directory could "
        f"not be listed: {os.strerror(20)})",
    )


def test_nothing_kept_and_what_is_kept_are_said_so():
    assert check_privacy(PrivacyFacts(None, None)) == Result(
        NAME, "ok", "no state directory and no audit record file: nothing kept on disk"
    )
    assert check_privacy(PrivacyFacts(None, "/var/log/audit.jsonl", looked_at=1)) == Result(
        NAME, "ok", "the audit record: 1 file(s), none open to other users"
    )
    assert check_privacy(PrivacyFacts("/var/lib/p", None, looked_at=0)) == Result(
        NAME, "ok", "the state directory: 0 file(s), none open to other users"
    )
    assert check_privacy(PrivacyFacts("/var/lib/p", "/var/log/a", looked_at=4)) == Result(
        NAME, "ok", "the state directory and the audit record: 4 file(s), none open to other users"
    )


def test_four_open_ones_are_all_named_and_a_fifth_is_counted():
    files = tuple((f"/s/f{n}", 0o644) for n in range(4))
    assert check_privacy(PrivacyFacts("/s", None, (), files, 4)) == Result(
        NAME,
        "failed",
        "/s/f0 is mode 644; /s/f1 is mode 644; /s/f2 is mode 644; /s/f3 is mode 644" + WHY,
        "chmod 600 /s/f0 /s/f1 /s/f2 /s/f3" + AFTER,
    )
    assert check_privacy(PrivacyFacts("/s", None, (("/s", 0o755),), files, 4)) == Result(
        NAME,
        "failed",
        "/s is mode 755; /s/f0 is mode 644; /s/f1 is mode 644; /s/f2 is mode 644 and 1 more" + WHY,
        "chmod 700 /s; chmod 600 /s/f0 /s/f1 /s/f2 /s/f3" + AFTER,
    )
    five = files + (("/s/f4", 0o640),)
    assert check_privacy(PrivacyFacts("/s", None, (), five, 5)) == Result(
        NAME,
        "failed",
        "/s/f0 is mode 644; /s/f1 is mode 644; /s/f2 is mode 644; /s/f3 is mode 644 and 1 more"
        + WHY,
        "chmod 600 /s/f0 /s/f1 /s/f2 /s/f3 ..." + AFTER,
    )
    assert check_privacy(PrivacyFacts("/s", None, (("/s", 0o701),))) == Result(
        NAME, "failed", "/s is mode 701" + WHY, "chmod 700 /s" + AFTER
    )
