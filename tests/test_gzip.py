"""/fleet.json gzipped for those who accept it (http/fleetbody.py): 2 MB at a thousand hosts,
a seventh of that compressed. Each body is packed once (its gzip and its ETags), in a thread,
and only a body packed whole is sent: every answer is a copy of bytes already made, in the
encoding the client takes, under that encoding's own ETag."""

import asyncio
import gzip
import json

import pytest
from helpers import async_test, until
from test_fleet_polling import polling_recorders

from patroller.http import fleetbody
from patroller.http.encoding import accepts_gzip
from patroller.http.fleetbody import Packer

GZIP = {"Accept-Encoding": "gzip, deflate, br"}  # as a browser asks


@pytest.mark.parametrize(
    "header, takes",
    [
        ("gzip", True),
        ("GZIP", True),
        ("x-gzip", True),
        ("br, gzip;q=0.5", True),
        ("gzip, deflate, br", True),
        ("*", True),
        ("deflate, *;q=0.1", True),
        ("", False),
        ("identity", False),
        ("deflate, br", False),
        ("gzip;q=0", False),
        ("gzip;q=0.0", False),
        ("*;q=0", False),
        ("gzip;q=0, *", False),
        ("gzip;q=x", False),
        (" gzip ; q=1 ", True),
    ],
)
def test_which_accept_encoding_takes_gzip(header, takes):
    assert accepts_gzip(header) is takes


def body_of(n: int) -> bytes:
    return json.dumps(
        {"hosts": [{"name": f"gpu{k}", "free": k % n} for k in range(5000)]}
    ).encode()


@async_test
async def test_each_body_is_packed_once_in_a_thread_and_only_a_whole_one_is_served():
    packer = Packer(level=6)
    first, second, third = body_of(3), body_of(4), body_of(5)
    packed = await packer.of(first)  # the first: nothing to send before it, waited for
    assert packed.body is first and gzip.decompress(packed.gzipped) == first
    assert len(packed.gzipped) < len(first) / 5
    assert await packer.of(second) is packed  # being packed: the one before meanwhile
    assert await packer.of(third) is packed  # one at a time: the third waits its turn
    await until(lambda: packer.packed is not packed, timeout=10)
    assert packer.packed.body is second and gzip.decompress(packer.packed.gzipped) == second
    assert packer.packed.tag != packed.tag
    for _ in range(20):  # asked again and again: each body packed once
        newest = await packer.of(third)
    await until(lambda: packer.packed.body is third, timeout=10)
    assert (await packer.of(third)).body is third
    assert packer.made == 3, packer.made
    body, encoding, tag = packer.packed.answer("gzip, deflate")
    assert (body, encoding, tag) == (packer.packed.gzipped, "gzip", f'"{packer.packed.tag}-gzip"')
    body, encoding, tag = packer.packed.answer("identity")
    assert (body, encoding, tag) == (third, None, f'"{packer.packed.tag}"')
    assert newest is not None


@async_test
async def test_fleet_json_in_the_encoding_each_client_takes_with_its_own_etag():
    async with polling_recorders(3, 1) as (h, hosts):

        async def fetch(**headers):
            return await h.http.fetch(
                h.url + "/fleet.json",
                headers=headers,
                decompress_response=False,
                raise_error=False,
            )

        # Each answer is the body as it was when asked for; those of one version (one ETag
        # but for the encoding's name) are the same body, in either encoding.
        for _ in range(50):
            packed, plain = await fetch(**GZIP), await fetch()
            if packed.headers["ETag"] == plain.headers["ETag"][:-1] + '-gzip"':
                break
        else:
            raise AssertionError("never one body in both encodings")
        assert packed.headers["Content-Encoding"] == "gzip"  # the first answer already
        assert packed.headers["Vary"] == plain.headers["Vary"] == "Accept-Encoding"
        assert int(packed.headers["Content-Length"]) == len(packed.body)
        assert int(plain.headers["Content-Length"]) == len(plain.body)
        assert "Content-Encoding" not in plain.headers
        assert gzip.decompress(packed.body) == plain.body
        shown = json.loads(plain.body)
        assert [host["host"] for host in shown["hosts"]] == [host.host for host in hosts]
        assert shown["totals"]["hosts"] == 3
        refused = await fetch(**{"Accept-Encoding": "gzip;q=0, identity"})
        assert "Content-Encoding" not in refused.headers
        assert json.loads(refused.body)["totals"]["hosts"] == 3

        # If-None-Match: the tag of the encoding the client takes is answered 304 while the
        # body is the same; another encoding's tag is not that representation's.
        for _ in range(50):
            tag = (await fetch(**GZIP)).headers["ETag"]
            again = await fetch(**GZIP, **{"If-None-Match": tag})
            if again.code == 304:
                break
        assert again.code == 304 and again.body == b"", again.code
        assert again.headers["ETag"] == tag
        for _ in range(50):
            tag = (await fetch(**GZIP)).headers["ETag"]
            other = await fetch(**{"If-None-Match": tag})  # the gzip's tag, from a plain client
            assert other.code == 200 and "Content-Encoding" not in other.headers
            if other.headers["ETag"][:-1] + '-gzip"' == tag:
                break  # the same body: its tag matched the gzip's alone
        else:
            raise AssertionError("never the same body twice")
        json.loads(other.body)


@async_test
async def test_fleet_json_is_never_compressed_per_answer(monkeypatch):
    """However many ask, gzip runs once per body built (the real compressor, counted)."""
    calls = []
    real = gzip.compress

    def counted(data, *args, **kwargs):
        calls.append(len(data))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(fleetbody.gzip, "compress", counted)
    async with polling_recorders(3, 1) as (h, _):
        fleet = h.api.fleet
        built = fleet.builds
        made = fleet.packer.made
        answers = await asyncio.gather(
            *(
                h.http.fetch(h.url + "/fleet.json", headers=GZIP, decompress_response=False)
                for _ in range(60)
            )
        )
        assert all(a.headers["Content-Encoding"] == "gzip" for a in answers)
        await until(lambda: fleet.packer._packing is None, timeout=10)
        # one packing per body built at most (a body may be skipped for a newer one)
        assert fleet.packer.made - made <= fleet.builds - built + 1, (fleet.builds, made)
        assert len(calls) == fleet.packer.made, (len(calls), fleet.packer.made)
