"""GET /whoami: the caller as the daemon takes them, the very identity /request holds devices
for (what `patroller status --mine` keeps the GPUs of): in test mode whom user= names, on a GPU
host the account the kernel says, under --hide-users every field of one's own identity, and for
a caller the daemon cannot identify, 403 as /request would answer."""

import asyncio

from helpers import ServerProcess, async_test, gpu_running, need_root, running
from test_hide_users import NOBODY, ask, scenario  # noqa: F401 (a fixture)
from test_trust_callers import HOST, entering, namespaces  # noqa: F401 (a fixture)

from patroller.identify.resolver import host_identity


@async_test
async def test_in_test_mode_whom_user_names_else_the_test_user():
    async with running(lease=30) as h:
        assert (await h.ok("/whoami"))["user"] == "test-user"
        me = await h.ok("/whoami?user=alice@example.org")
        [grant] = await h.ok("/request?gpu=1&user=alice@example.org")
        holder = (await h.ok("/status"))[grant["uuid"]]["claim"]["user"]
        assert me == holder and me["source"] == "test"
        code, body = await h.call("/whoami?user=")
        assert code == 400 and "user" in body["error"], body
        head = await h.http.fetch(h.url + "/whoami", method="HEAD", raise_error=False)
        assert head.code == 200 and int(head.headers["Content-Length"]) > 0 and not head.body
        assert (await h.call("/whoami", "POST", b""))[0] == 405


@async_test
async def test_under_hide_users_a_caller_sees_all_of_their_own_identity(scenario):
    need_root("the caller runs as nobody, identified by the kernel")
    nobody = host_identity(NOBODY)
    async with gpu_running(scenario, lease=300, hide_users=True) as h:
        loop = asyncio.get_running_loop()
        [[code, me], [_, [grant]], [_, status]] = await loop.run_in_executor(
            None, lambda: ask(h.url, "/whoami", "/request?gpu=1", "/status", uid=NOBODY)
        )
        assert code == 200 and me["user"] == nobody.user
        assert (me["account"], me["uid"]) == (nobody.account, NOBODY)  # nothing hidden
        assert status[grant["uuid"]]["claim"]["user"] == me  # whom /request held it for
        [[_, root]] = await loop.run_in_executor(None, lambda: ask(h.url, "/whoami"))
        assert root["user"] == "root" and root["uid"] == 0


def test_a_caller_who_cannot_be_identified_is_refused_as_request_would(
    namespaces, scenario, tmp_path
):
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--address",
        HOST,
        "--docker-host",
        f"unix://{tmp_path}/docker.sock",
        preexec_fn=entering(namespaces[0]),
    ).start()
    try:
        [[code, body], [request_code, refused]] = ask(
            server.url, "/whoami", "/request?gpu=1", namespace=namespaces[1]
        )
        assert (code, request_code) == (403, 403), (body, refused)
        assert body["error"].startswith("cannot identify a caller at "), body
    finally:
        server.stop()
