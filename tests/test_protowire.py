"""The protobuf wire format as patroller/observe/protowire.py writes and reads it: the encodings
the Protocol Buffers documentation gives byte for byte, round trips, and malformed input."""

import pytest

from patroller.observe import protowire as pw


def test_the_documented_encodings():
    # The Protocol Buffers encoding guide: field 1 = 150 is 08 96 01; field 2 = "testing" is
    # 12 07 74 65 73 74 69 6e 67; a message with field 3 = that first message is 1a 03 08 96 01.
    assert pw.integer(1, 150) == bytes.fromhex("089601")
    assert pw.string(2, "testing") == bytes.fromhex("120774657374696e67")
    assert pw.delimited(3, pw.integer(1, 150)) == bytes.fromhex("1a03089601")
    assert pw.varint(1) == b"\x01" and pw.varint(300) == bytes.fromhex("ac02")
    assert pw.varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes


def test_a_message_reads_back_what_was_written():
    data = (
        pw.string(1, "GPU-1")
        + pw.strings(2, ["a", "b"])
        + pw.integer(3, 2**40)
        + pw.delimited(4, pw.string(1, "inner"))
        + pw.delimited(4, pw.string(1, "second"))
        + pw.string_map(5, {"io.kubernetes.pod.name": "p", "é": "ü"})
    )
    message = pw.Message(data)
    assert message.text(1) == "GPU-1"
    assert message.texts(2) == ["a", "b"]
    assert message.integer(3) == 2**40
    assert [m.text(1) for m in message.messages(4)] == ["inner", "second"]
    assert message.message(4).text(1) == "second"  # two pieces merged: a scalar the last
    assert message.string_map(5) == {"io.kubernetes.pod.name": "p", "é": "ü"}
    assert message.text(9, "none") == "none" and message.integer(9) == 0
    assert not message.has(9) and message.has(1)
    assert message.message(9).texts(1) == []


def test_a_nested_message_in_pieces_is_the_pieces_merged():
    first = pw.string(1, "id") + pw.strings(2, ["a"]) + pw.delimited(3, pw.string(1, "x"))
    second = pw.strings(2, ["b"]) + pw.delimited(3, pw.string(2, "y")) + pw.integer(4, 7)
    merged = pw.Message(
        pw.delimited(5, first) + pw.string(6, "between") + pw.delimited(5, second)
    ).message(5)
    assert merged.text(1) == "id" and merged.texts(2) == ["a", "b"] and merged.integer(4) == 7
    assert (merged.message(3).text(1), merged.message(3).text(2)) == ("x", "y")


def test_fields_of_kinds_not_read_here_are_skipped():
    fixed64 = pw.varint(6 << 3 | pw.FIXED64) + bytes(8)
    fixed32 = pw.varint(7 << 3 | pw.FIXED32) + bytes(4)
    message = pw.Message(fixed64 + pw.string(1, "x") + fixed32)
    assert message.text(1) == "x" and not message.has(6) and not message.has(7)


@pytest.mark.parametrize(
    "data, why",
    [
        (b"\x08", "a varint runs past the end"),
        (b"\x08" + b"\xff" * 11, "a varint longer than ten bytes"),
        (b"\x12\x05abc", "field 2 runs past the end"),
        (b"\x00\x01", "field number 0"),
        (bytes([1 << 3 | 3]), "field 1 has wire type 3, which is not read here"),
        (pw.varint(6 << 3 | pw.FIXED64) + bytes(3), "field 6 runs past the end"),
    ],
)
def test_malformed_input_is_a_wire_error(data, why):
    with pytest.raises(pw.WireError) as refused:
        pw.Message(data)
    assert str(refused.value) == why


def test_the_edges_of_varints_and_field_numbers():
    assert pw.varint(0) == b"\x00" and pw.integer(1, 0) == b"\x08\x00"
    assert pw.Message(b"\x08" + b"\xff" * 9 + b"\x01").integer(1) == 2**64 - 1  # ten bytes
    top = (1 << 29) - 1
    assert pw.Message(pw.string(top, "last")).text(top) == "last"
    for number in (0, top + 1):
        with pytest.raises(ValueError) as refused:
            pw.string(number, "x")
        assert str(refused.value) == f"no such field number: {number}"


def test_repeated_strings_and_maps_are_their_fields_back_to_back():
    assert pw.strings(2, ["a", "b"]) == pw.string(2, "a") + pw.string(2, "b")
    assert pw.string_map(3, {"k": "v", "x": "y"}) == (
        pw.delimited(3, pw.string(1, "k") + pw.string(2, "v"))
        + pw.delimited(3, pw.string(1, "x") + pw.string(2, "y"))
    )
    message = pw.Message(
        pw.delimited(4, b"first") + pw.delimited(4, b"second") + pw.delimited(4, b"third")
    )
    assert message.raw(4) == b"third" and message.raw(5) == b"" and message.text(5) == ""


def test_a_field_of_the_wrong_type_or_bad_utf8_is_a_wire_error():
    with pytest.raises(pw.WireError, match="not of the type"):
        pw.Message(pw.integer(1, 5)).text(1)
    with pytest.raises(pw.WireError, match="not UTF-8"):
        pw.Message(pw.delimited(1, b"\xff\xfe")).text(1)
    with pytest.raises(ValueError):
        pw.string(0, "x")
