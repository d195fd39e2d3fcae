"""Each user's own destinations, set by real second users (useradd) with `patroller notify`
over the daemon's unix socket, where the kernel says who calls: each reaches and changes her
own alone, the URLs' secrets are never shown back, a trespass reaches the trespasser and the
holder each in the words --hide-users lets her read, the host's default reaches a user with
none, and what users set survives a restart in a file of root's alone."""

import json
import os
import stat
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest
from helpers import ScenarioFile, ServerProcess, python_for
from receivers import Hooks, wait_for

SECRET = "b0b-s3cret"


def as_user(user, where, *words, ok=True):
    """`patroller <words>` run by `user` against the daemon's socket: (status, out, err)."""
    done = subprocess.run(
        [
            python_for(user.uid),
            "-m",
            "patroller.cli",
            *words,
            "--server",
            f"unix://{where}/api.sock",
        ],
        cwd=where,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
    )
    if ok:
        assert done.returncode == 0, (words, done.stdout, done.stderr)
    return done.returncode, done.stdout, done.stderr


def listed(user, where):
    return json.loads(as_user(user, where, "notify", "list", "--json")[1])


def test_users_set_their_own_and_a_trespass_reaches_both_in_their_own_words(
    users, reachable, tmp_path
):
    alice, bob = users
    state = tmp_path / "state"
    scenario = ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}])
    args = (
        "--nvidia-smi",
        scenario.command,
        "--socket",
        f"{reachable}/api.sock",
        "--state-dir",
        str(state),
        "--hide-users",
    )
    with Hooks() as hers, Hooks() as his:
        server = ServerProcess(*args).start()
        sleeper = None
        try:
            said = as_user(alice, reachable, "notify", "add", hers.url())[1]
            assert said.startswith("added as number 1\nnotifications for " + alice.name)
            as_user(bob, reachable, "notify", "add", his.url(SECRET))
            # Each sees her own, the secret starred; neither sees the other's.
            mine = listed(alice, reachable)
            assert mine["user"] == alice.name and len(mine["destinations"]) == 1
            assert str(his.port) not in json.dumps(mine)
            shown = listed(bob, reachable)["destinations"][0]["url"]
            assert shown.startswith(f"json://patroller:****@127.0.0.1:{his.port}/hook")
            table = as_user(bob, reachable, "notify", "list")[1]
            assert SECRET not in table and "****" in table
            # Alice's "remove 2" is hers to make: she has no second; bob keeps his.
            code, _, err = as_user(alice, reachable, "notify", "remove", "2", ok=False)
            assert code != 0 and "you have no destination 2 (you have 1" in err
            assert len(listed(bob, reachable)["destinations"]) == 1
            # A user names no service that writes on the host.
            code, _, err = as_user(bob, reachable, "notify", "add", "syslog://", ok=False)
            assert code != 0 and "syslog://... is not a service users may name here" in err
            # Alice holds GPU 0; bob's process runs on it.
            as_user(alice, reachable, "reserve", "-n", "1", "--hold", "1h")
            sleeper = subprocess.Popen(
                ["sleep", "120"], user=bob.uid, group=bob.gid, extra_groups=[]
            )
            scenario.write(processes=[{"pid": sleeper.pid, "gpu": 0, "name": "python"}])
            wait_for(lambda: hers.bodies and his.bodies, what="both told of the trespass")
            as_user(bob, reachable, "notify", "test")
            wait_for(lambda: len(his.bodies) == 2, what="bob's test notice")
            assert listed(bob, reachable)["destinations"][0]["last"] == "sent"
        finally:
            if sleeper is not None:
                sleeper.kill()
                sleeper.wait()
            scenario.write(processes=[])
            assert server.stop() == 0, server.log
        first_log = server.log
        # What users set survives a restart, in a file of root's alone.
        assert stat.S_IMODE(os.stat(state / "notify.json").st_mode) == 0o600
        server = ServerProcess(*args).start()
        try:
            assert len(listed(alice, reachable)["destinations"]) == 1
        finally:
            server.stop()
    [to_her], [to_him, test] = hers.bodies, his.bodies
    assert to_her["title"].endswith(": trespass on GPU 0 by another user")
    assert "another user runs process" in to_her["message"]
    assert f"which is held by {alice.name}." in to_her["message"]
    assert bob.name not in json.dumps(to_her)
    assert to_him["title"].endswith(f": trespass on GPU 0 by {bob.name}")
    assert "which is held by another user." in to_him["message"]
    assert alice.name not in json.dumps(to_him)
    assert test["title"].endswith(": a test from Patroller")
    assert SECRET not in first_log + server.log


def test_the_hosts_default_reaches_a_user_with_none_and_she_may_mute_a_kind(tmp_path):
    """--notify-user-default, its {user} filled in (quoted: a name is one part of the URL);
    a kind muted reaches her no more; in test mode, callers are named by user=."""
    with Hooks() as hooks:
        template = f"json://127.0.0.1:{hooks.port}/" + "{user}"
        server = ServerProcess("--test", "--notify-user-default", template).start()
        try:

            def post(path, form=None):
                request = urllib.request.Request(
                    server.url + path, data=urllib.parse.urlencode(form or {}).encode()
                )
                with urllib.request.urlopen(request, timeout=20) as answer:
                    return json.loads(answer.read())

            assert post("/notify/test?user=carol")["sent_to"] == 1
            with pytest.raises(urllib.error.HTTPError) as refused:  # a query may be logged
                post("/notify/add?user=carol&url=json%3A%2F%2Fh%2Fp", {})
            assert (
                refused.value.code == 400
                and "never in the query" in json.loads(refused.value.read())["error"]
            )
            wait_for(lambda: len(hooks.bodies) == 1)
            assert post("/notify/mute?user=carol", {"kind": "test"})["muted"] == ["test"]
            with pytest.raises(urllib.error.HTTPError) as refused:
                post("/notify/test?user=carol")
            assert "you muted test notices" in json.loads(refused.value.read())["error"]
            listing = post("/notify/unmute?user=carol", {"kind": "test"})
            assert listing["muted"] == [] and listing["default"] is True
        finally:
            server.stop()
    assert hooks.paths == ["/carol"]
