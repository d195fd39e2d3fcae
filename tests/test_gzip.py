"""/fleet.json gzipped for those who accept it (http/encoding.py): 2 MB at a thousand hosts,
a tenth of that compressed. The gzip is made once per body, in a thread; an answer never waits
for it (the body goes as it is meanwhile)."""

import asyncio
import gzip
import json

import pytest
from helpers import async_test, until
from test_fleet_polling import polling_recorders

from patroller.http.encoding import Gzipped, accepts_gzip


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


@async_test
async def test_a_body_is_compressed_once_in_a_thread_and_never_waited_for():
    packer = Gzipped(level=6)
    first = json.dumps(
        {"hosts": [{"name": f"gpu{n}", "free": n % 3} for n in range(5000)]}
    ).encode()
    assert packer.of(first) is None  # being made: the asker sends the body as it is
    await until(lambda: packer.of(first) is not None, timeout=10)
    packed = packer.of(first)
    assert gzip.decompress(packed) == first and len(packed) < len(first) / 5
    second = first.replace(b"gpu1", b"gpuX")
    assert packer.of(second) is None  # another body: the old gzip is not it
    assert packer.of(second) is None and packer.of(first) == packed  # each its own
    await until(lambda: packer.of(second) is not None, timeout=10)
    assert gzip.decompress(packer.of(second)) == second
    assert packer.made == 2  # asked again and again, each body compressed once


@async_test
async def test_fleet_json_is_gzipped_for_a_client_that_accepts_it():
    async with polling_recorders(3, 1) as (h, hosts):

        async def fetch(**headers):
            return await h.http.fetch(
                h.url + "/fleet.json", headers=headers, decompress_response=False
            )

        answers = []

        async def gzipped() -> bool:
            answers.append(await fetch(**{"Accept-Encoding": "gzip, deflate, br"}))
            return answers[-1].headers.get("Content-Encoding") == "gzip"

        for _ in range(200):
            if await gzipped():
                break
            await asyncio.sleep(0.01)
        answer = answers[-1]
        assert answer.headers.get("Content-Encoding") == "gzip", "never gzipped"
        assert answer.headers["Vary"] == "Accept-Encoding"
        shown = json.loads(gzip.decompress(answer.body))
        assert [host["host"] for host in shown["hosts"]] == [host.host for host in hosts]
        assert all(a.headers.get("Content-Encoding") in (None, "gzip") for a in answers)
        plain = await fetch()  # no Accept-Encoding: the body as it is
        assert "Content-Encoding" not in plain.headers
        assert plain.headers["Vary"] == "Accept-Encoding"
        assert json.loads(plain.body)["totals"]["hosts"] == 3
        refused = await fetch(**{"Accept-Encoding": "gzip;q=0, identity"})
        assert "Content-Encoding" not in refused.headers
        assert len(refused.body) > len(answer.body)
