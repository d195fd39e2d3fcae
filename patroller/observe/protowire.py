"""Protocol Buffers' wire format, the little of it that gRPC APIs read here need (containerd's
containers, the kubelet's pod-resources): messages are written and read by field number, as
their public .proto files give them, with no generated code and no protobuf package.

A message is read into a `Message`: each field number with the values it had, in order (a
repeated field has many). Read twice, a field is what protobuf makes of it: a scalar (`integer`,
`text`, `raw`) is the last value; a singular nested message (`message`) is all its pieces
merged, which is the message their concatenation encodes (in it, again, scalars the last,
repeated fields all, nested messages merged); a repeated one (`messages`) is each piece.
Varints are ints; length-delimited fields are bytes, to be read as a string (`text`) or as a
nested message (`message`, `messages`), which only the .proto can tell. Fixed 32- and 64-bit
fields are skipped over (nothing read here has one). Malformed input raises WireError, never
anything else. tests/test_protobuf_wire.py checks all this against the protobuf package.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

VARINT, FIXED64, DELIMITED, FIXED32 = 0, 1, 2, 5
_MAX_FIELD = (1 << 29) - 1

Value = int | bytes


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def varint(value: int) -> bytes:
    """A non-negative int as a varint (a negative one as protobuf's 10-byte two's complement)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, kind: int) -> bytes:
    if not 1 <= number <= _MAX_FIELD:
        raise ValueError(f"no such field number: {number}")
    return varint(number << 3 | kind)


def integer(number: int, value: int) -> bytes:
    """A varint field (int32, int64, uint32, uint64, bool, enum)."""
    return _key(number, VARINT) + varint(value)


def delimited(number: int, payload: bytes) -> bytes:
    """A length-delimited field: bytes, or an encoded nested message."""
    return _key(number, DELIMITED) + varint(len(payload)) + payload


def string(number: int, value: str) -> bytes:
    """A string field."""
    return delimited(number, value.encode("utf-8"))


def strings(number: int, values: Iterable[str]) -> bytes:
    """A repeated string field."""
    return b"".join(string(number, value) for value in values)


def string_map(number: int, values: Mapping[str, str]) -> bytes:
    """A map<string, string> field: a repeated entry message with key 1 and value 2."""
    return b"".join(
        delimited(number, string(1, key) + string(2, value)) for key, value in values.items()
    )


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if at >= len(data):
            raise WireError("a varint runs past the end")
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, at
        shift += 7
        if shift >= 70:
            raise WireError("a varint longer than ten bytes")


def fields(data: bytes) -> Iterator[tuple[int, Value]]:
    """The (field number, value) pairs of an encoded message, in order."""
    at = 0
    while at < len(data):
        key, at = _read_varint(data, at)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        if kind == VARINT:
            value, at = _read_varint(data, at)
            yield number, value
        elif kind == DELIMITED:
            length, at = _read_varint(data, at)
            if at + length > len(data):
                raise WireError(f"field {number} runs past the end")
            yield number, bytes(data[at : at + length])
            at += length
        elif kind in (FIXED64, FIXED32):
            at += 8 if kind == FIXED64 else 4
            if at > len(data):
                raise WireError(f"field {number} runs past the end")
        else:
            raise WireError(f"field {number} has wire type {kind}, which is not read here")


class Message:
    """A decoded message: its fields by number."""

    def __init__(self, data: bytes) -> None:
        self._fields: dict[int, list[Value]] = {}
        for number, value in fields(data):
            self._fields.setdefault(number, []).append(value)

    def _all(self, number: int, kind: type) -> list[Value]:
        values = self._fields.get(number, [])
        for value in values:
            if not isinstance(value, kind):
                raise WireError(f"field {number} is not of the type its .proto gives")
        return values

    def integer(self, number: int, default: int = 0) -> int:
        values = self._all(number, int)
        return int(values[-1]) if values else default

    def text(self, number: int, default: str = "") -> str:
        values = self._all(number, bytes)
        return _decode(values[-1]) if values else default

    def texts(self, number: int) -> list[str]:
        return [_decode(value) for value in self._all(number, bytes)]

    def raw(self, number: int) -> bytes:
        values = self._all(number, bytes)
        # _all(number, bytes) keeps the length-delimited values alone: bytes, whatever Value says
        return values[-1] if values else b""  # type: ignore[return-value]

    def message(self, number: int) -> Message:
        """The nested message: its pieces merged, as protobuf merges a singular embedded
        message that comes more than once (an empty one when the field is absent)."""
        return Message(b"".join(self._all(number, bytes)))  # type: ignore[arg-type]  # bytes

    def messages(self, number: int) -> list[Message]:
        return [
            Message(value)  # type: ignore[arg-type]  # bytes alone, as in raw()
            for value in self._all(number, bytes)
        ]

    def string_map(self, number: int) -> dict[str, str]:
        """A map<string, string> field."""
        return {entry.text(1): entry.text(2) for entry in self.messages(number)}

    def has(self, number: int) -> bool:
        return number in self._fields


def _decode(value: Value) -> str:
    try:
        return value.decode("utf-8")  # type: ignore[union-attr]  # called on bytes alone
    except UnicodeDecodeError as exc:
        raise WireError(f"a string that is not UTF-8: {exc}") from None
