"""A fleet host's GPUs as /fleet.json lists them (http/fleet.gpus_of: what each shows, in which
order), and an answer over --fleet-max-bytes named by its path, asked in the test process of a
real HTTP server on a loopback port (tests/test_fleet_lying.py asks through a daemon)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import liars
from helpers import async_test, until
from test_fleet_answers import DEVICES, STATUS, UUID

from patroller.config import Config
from patroller.http.fleet import FAILED, Fleet, gpus_of


def device(number: int, **changed: Any) -> dict[str, Any]:
    return {**DEVICES[UUID], "number": number, "minor_number": number, **changed}


def test_the_gpus_in_group_then_number_order_a_lost_one_last_and_which_are_withheld():
    devices = {
        "GPU-two": device(2),
        "GPU-lost": device(0, lost=True),
        "GPU-one": device(1),
        "GPU-fpga": device(5, group="fpga"),
    }
    status = {uuid: copy.deepcopy(STATUS[UUID]) for uuid in devices}
    status["GPU-one"]["claim"].update(state="free", user=None, users=[], withheld="no stats")
    gpus = gpus_of(status, devices)
    assert [(gpu["uuid"], gpu["group"], gpu["number"]) for gpu in gpus] == [
        ("GPU-fpga", "fpga", 5),
        ("GPU-one", "gpu", 1),
        ("GPU-two", "gpu", 2),
        ("GPU-lost", "gpu", 0),
    ]
    assert [gpu["state"] for gpu in gpus] == ["reserved", "free", "reserved", "lost"]
    assert [gpu["withheld"] for gpu in gpus] == [False, True, False, False]


@async_test
async def test_an_answer_over_the_bound_is_named_by_its_path():
    body = json.dumps({f"{n:07d}": {} for n in range(200)}).encode()  # over 1 KiB
    server = liars.LyingServer({"/status": body}).start()
    fleet = Fleet(replace(Config(), fleet=(server.host,), fleet_max_bytes=1024))
    fleet.start()  # its one host asked at once (and again every interval): not asked here too,
    try:  # which would race the poller on the host's one connection
        [host] = fleet.hosts
        await until(lambda: host.state == FAILED)
        assert (host.state, host.error) == (
            FAILED,
            f"bad answer: /status is {len(body)} bytes, more than 1024 (--fleet-max-bytes)",
        )
    finally:
        await fleet.stop(1.0)
        server.stop()
