"""Text others chose, made safe for one log line (core/text.py): what is printable is kept as it
is, what is not is escaped as Python escapes it, and a long text is cut, saying so."""

from patroller.core.text import SHOWN, printable


def test_printable_text_is_kept_as_it_is():
    assert printable("alice's job: train.py --lr 0.1") == "alice's job: train.py --lr 0.1"
    assert printable("") == ""


def test_a_newline_or_an_escape_sequence_is_escaped_and_the_rest_kept():
    assert printable("a\nb\x1b[31mred\tc") == "a\\nb\\x1b[31mred\\tc"
    assert printable("\u200bzero width") == "\\u200bzero width"


def test_a_long_text_is_cut_at_the_limit_and_says_so():
    assert SHOWN == 200
    assert printable("x" * SHOWN) == "x" * SHOWN
    assert printable("x" * (SHOWN + 1)) == "x" * SHOWN + "..."
    assert printable("abcdef", limit=3) == "abc..."
    assert printable("abc", limit=3) == "abc"


def test_the_cut_is_made_before_escaping_and_only_what_is_kept_is_escaped():
    assert printable("ab\ncd\x00", limit=3) == "ab\\n..."
    assert printable("ab\ncd\x00", limit=6) == "ab\\ncd\\x00"


def test_a_backslash_beside_an_escaped_character_stays_one_backslash():
    # only the unprintable characters are escaped: a backslash that was in the text is not
    # doubled, so "\\n" in the line is the newline, "\\\\" never appears for one backslash
    assert printable("C:\\runs\nnext") == "C:\\runs\\nnext"
