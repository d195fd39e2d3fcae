"""--hide-users: other callers see a holder as a stable pseudonym. The key on disk."""
import os
import re
import stat

from patroller.state.pseudonyms import KEY_FILE, Pseudonyms

PSEUDONYM = re.compile(r"user-[0-9a-f]{12}\Z")


# -- the key ------------------------------------------------------------------------------------

def test_the_key_is_made_once_private_and_read_at_the_next_start(tmp_path):
    first = Pseudonyms(str(tmp_path), 16)
    first.open()
    key = tmp_path / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert re.fullmatch(r"[0-9a-f]{64}\n", key.read_text())
    again = Pseudonyms(str(tmp_path), 16)
    again.open()
    alice = first.of("alice@example.org")
    assert PSEUDONYM.match(alice) and again.of("alice@example.org") == alice
    assert first.of("bob") != alice and first.of("alice@example.org") == alice
    elsewhere = Pseudonyms(str(tmp_path / "other"), 16)
    os.mkdir(tmp_path / "other")
    elsewhere.open()
    assert elsewhere.of("alice@example.org") != alice  # another key, another pseudonym


def test_without_a_state_directory_the_key_lasts_one_run():
    runs = [Pseudonyms(None, 16) for _ in range(2)]
    for run in runs:
        run.open()
    assert runs[0].of("alice") == runs[0].of("alice") != runs[1].of("alice")


def test_a_key_file_that_holds_no_key_is_replaced(tmp_path, caplog):
    (tmp_path / KEY_FILE).write_text("not a key\n")
    made = Pseudonyms(str(tmp_path), 16)
    made.open()
    assert re.fullmatch(r"[0-9a-f]{64}\n", (tmp_path / KEY_FILE).read_text())
    assert "holds no key" in caplog.text
    again = Pseudonyms(str(tmp_path), 16)
    again.open()
    assert again.of("alice") == made.of("alice")
