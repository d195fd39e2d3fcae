"""A fleet view hears no more than any user of a host that hides its users: a daemon with
--fleet and without --hide-users asks, over loopback and so as the host's root, a host with
--hide-users where another user holds a GPU. Its /fleet.json, which anyone may read, names that
holder only by the pseudonym the host shows everyone, on the first asking (Tornado) and on the
next ones (the fast lane, on the connection kept open); root asking the host itself still reads
every name."""

import asyncio
import json

from helpers import async_test, gpu_running, need_root, running
from test_hide_users import DAEMON, NOBODY, PSEUDONYM, ask_as, scenario  # noqa: F401 (a fixture)

from patroller.identify.resolver import host_identity


async def heard(fleet, uuid, asked):
    """The GPU `uuid` in the fleet daemon's /fleet.json, once it has asked the host's /status
    `asked` times or more and the host answered."""
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        assert asyncio.get_running_loop().time() < deadline, "the host was not asked in time"
        body = await fleet.ok("/fleet.json")
        [host] = body["hosts"]
        if host["state"] == "up" and fleet.api.fleet.asked["/status"] >= asked:
            return body, next(gpu for gpu in host["gpus"] if gpu["uuid"] == uuid)
        await asyncio.sleep(0.05)


@async_test
async def test_a_fleet_daemon_that_shows_names_hears_only_the_hidden_view(scenario):
    need_root("the holder is another uid, and the fleet daemon asks as the host's root")
    holder = host_identity(DAEMON).user
    async with gpu_running(scenario, lease=300, hide_users=True) as host:
        [[code, [grant]]] = await ask_as(DAEMON, host, "/request?gpu=1")
        assert code == 200
        uuid = grant["uuid"]
        root_sees = (await host.ok("/status"))[uuid]["claim"]["user"]  # root, a plain request
        assert root_sees["user"] == holder and root_sees["uid"] == DAEMON
        [[_, others_see]] = await ask_as(NOBODY, host, "/status")
        pseudonym = others_see[uuid]["claim"]["user"]["user"]
        assert PSEUDONYM.match(pseudonym)
        async with running(fleet=(f"127.0.0.1:{host.port}",), fleet_interval=0.1) as fleet:
            for asked in (1, 4):  # the first asking, then later ones on the kept connection
                body, gpu = await heard(fleet, uuid, asked)
                assert gpu["user"]["user"] == pseudonym, gpu
                assert [gpu["user"][k] for k in ("email", "account", "uid", "container")] == [
                    None
                ] * 4, gpu
                assert [u["user"] for u in gpu["users"]] in ([], [pseudonym]), gpu
                assert f'"{holder}"' not in json.dumps(body), body
        assert (await host.ok("/status"))[uuid]["claim"]["user"]["user"] == holder  # as ever
