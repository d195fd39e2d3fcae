"""--hide-users: other callers see a holder as a stable pseudonym; the holder and the host's root
see names. The key on disk; then real daemons, in test mode (callers name themselves with
user=) and on the simulator with callers of real uids, identified by the kernel."""

import asyncio
import json
import logging
import os
import re
import stat
import subprocess
import urllib.request

import pytest
from helpers import (
    ScenarioFile,
    ServerProcess,
    async_test,
    gpu_running,
    need_root,
    python_for,
    running,
    until,
)
from kubelet import Kubelet, gpu_pod
from test_live import Reader
from test_trust_callers import HOST, entering, namespaces  # noqa: F401 (a fixture)

from patroller.identify.resolver import host_identity
from patroller.state.pseudonyms import KEY_FILE, Pseudonyms

PSEUDONYM = re.compile(r"user-[0-9a-f]{12}\Z")
NOBODY, DAEMON = 65534, 1  # two host accounts other than root


def hidden(identity, pseudonym):
    """Whether `identity` (as /status shows it) is `pseudonym` and says nothing else of whom."""
    return (
        identity["user"] == pseudonym
        and PSEUDONYM.match(pseudonym)
        and [identity[k] for k in ("email", "account", "uid", "container", "job")] == [None] * 5
        and identity["info"] == {}
    )


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


def test_the_key_is_the_hmac_of_the_name_and_a_made_key_is_logged(tmp_path, caplog):
    import hashlib
    import hmac
    import logging

    with caplog.at_level(logging.INFO, logger="patroller.state.pseudonyms"):
        made = Pseudonyms(str(tmp_path), 16)
        made.open()
    path = tmp_path / KEY_FILE
    assert [r.getMessage() for r in caplog.records] == [f"made the pseudonyms' key {path}"]
    assert sorted(os.listdir(tmp_path)) == [KEY_FILE]  # no KEY_FILE.new left behind
    key = bytes.fromhex(path.read_text())
    for name in ("alice", "caf\u00e9", "bad\udcffbytes"):  # a name from undecodable bytes too
        digest = hmac.new(key, name.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()
        assert made.of(name) == "user-" + digest[: len(made.of(name)) - len("user-")]
        assert made.of(name) == made.of(name)


def test_a_key_left_half_written_is_replaced_and_one_readable_by_others_made_private(
    tmp_path, caplog
):
    import logging

    (tmp_path / (KEY_FILE + ".new")).write_text("half")  # a start died before the rename
    first = Pseudonyms(str(tmp_path), 16)
    first.open()
    assert sorted(os.listdir(tmp_path)) == [KEY_FILE]
    os.chmod(tmp_path / KEY_FILE, 0o644)
    again = Pseudonyms(str(tmp_path), 16)
    again.open()
    assert again.of("alice") == first.of("alice")
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    os.chmod(tmp_path / KEY_FILE, 0o400)  # private already: left as it is
    Pseudonyms(str(tmp_path), 16).open()
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o400
    (tmp_path / KEY_FILE).write_text("not a key\n")
    with caplog.at_level(logging.WARNING, logger="patroller.state.pseudonyms"):
        Pseudonyms(str(tmp_path), 16).open()
    assert [r.getMessage() for r in caplog.records] == [
        f"the pseudonyms' key {tmp_path / KEY_FILE} holds no key (10 bytes): a new one replaces "
        "it, and every pseudonym changes"
    ]


def test_a_key_that_is_no_file_or_cannot_be_written_is_one_clear_error(tmp_path):
    from patroller.state.pseudonyms import PseudonymError

    os.mkdir(tmp_path / KEY_FILE)
    with pytest.raises(PseudonymError) as error:
        Pseudonyms(str(tmp_path), 16).open()
    assert str(error.value) == (
        f"the pseudonyms' key {tmp_path / KEY_FILE} is not a regular "
        "file: remove it, and a new key is made"
    )
    os.rmdir(tmp_path / KEY_FILE)
    os.symlink("elsewhere", tmp_path / KEY_FILE)  # a link is never followed
    with pytest.raises(PseudonymError) as error:
        Pseudonyms(str(tmp_path), 16).open()
    assert str(error.value) == (
        f"cannot read the pseudonyms' key {tmp_path / KEY_FILE}: Too many levels of symbolic links"
    )
    os.unlink(tmp_path / KEY_FILE)
    os.mkdir(tmp_path / (KEY_FILE + ".new"))  # what the key is written to cannot be removed
    with pytest.raises(PseudonymError) as error:
        Pseudonyms(str(tmp_path), 16).open()
    assert str(error.value) == (
        f"cannot write the pseudonyms' key {tmp_path / KEY_FILE}: Is a directory"
    )


def test_a_key_open_to_others_on_a_read_only_filesystem_is_refused_saying_why(tmp_path):
    """A key others may read is made private as it is read; where it cannot be (a read-only
    filesystem), the daemon refuses it with the filesystem's word, rather than use a key that
    lets others turn pseudonyms back into names."""
    from test_state_lock import read_only

    from patroller.state.pseudonyms import PseudonymError

    made = tmp_path / "made"
    made.mkdir(mode=0o700)
    Pseudonyms(str(made), 16).open()
    os.chmod(made / KEY_FILE, 0o644)
    with read_only(made, tmp_path / "ro") as where, pytest.raises(PseudonymError) as error:
        Pseudonyms(where, 16).open(read_only=True)
    assert str(error.value) == (
        f"cannot read the pseudonyms' key {where}/{KEY_FILE}: Read-only file system"
    )


def test_no_key_on_a_read_only_filesystem_is_a_key_for_this_run_said(tmp_path, caplog):
    from test_state_lock import read_only

    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    with (
        read_only(empty, tmp_path / "ro") as where,
        caplog.at_level(logging.WARNING, logger="patroller.state.pseudonyms"),
    ):
        pseudonyms = Pseudonyms(where, 16)
        pseudonyms.open(read_only=True)
    assert pseudonyms.of("alice").startswith("user-") and not os.listdir(empty)
    assert caplog.messages == [
        f"no pseudonyms' key {where}/{KEY_FILE}, and its directory is read-only: a key for this "
        "run alone, so every pseudonym changes at the next start"
    ]


def test_pseudonyms_before_open_are_a_bug_said_plainly():
    with pytest.raises(RuntimeError) as error:
        Pseudonyms(None, 16).of("alice")
    assert str(error.value) == "Pseudonyms.open() was not called"


# -- test mode: callers name themselves --------------------------------------------------------


async def holders(h):
    """alice and bob hold a device each; carol waits for every device (`served` lets them go
    and answers whether carol was then served)."""
    [a] = await h.ok("/request?gpu=1&user=alice@example.org")
    [b] = await h.ok("/request?gpu=1&user=bob")
    waiting = asyncio.ensure_future(h.call("/wait?gpu=8&timeout=30&user=carol"))
    await until(lambda: len(h.services.leases.waiters) == 1)

    async def served():
        await h.ok("/release?user=alice@example.org")
        await h.ok("/release?user=bob")
        return (await waiting)[0] == 200

    return a["uuid"], b["uuid"], served


async def metrics(h):
    response = await h.http.fetch(h.url + "/metrics")
    return response.body.decode()


def user_labels(text):
    return set(re.findall(r'\buser="([^"]*)"', text))


@async_test
async def test_others_see_a_holder_as_a_pseudonym_and_the_holder_sees_their_name():
    async with running(hide_users=True, lease=60) as h:
        a, b, served = await holders(h)
        # bob: his own name, alice's pseudonym, everywhere and every time
        status = await h.ok("/status?user=bob")
        alice = status[a]["claim"]["user"]["user"]
        assert hidden(status[a]["claim"]["user"], alice)
        assert [hidden(u, alice) for u in status[a]["claim"]["users"]] == [True]
        assert status[b]["claim"]["user"]["user"] == "bob"
        assert (await h.ok("/status?user=bob"))[a]["claim"]["user"]["user"] == alice
        users = await h.ok("/users?user=bob")
        assert set(users) == {alice, "bob", (await h.ok("/queue?user=bob"))[0]["user"]}
        assert users[alice]["devices"] == [0] and users["bob"]["devices"] == [1]
        history = await h.ok("/history?user=bob")
        assert [e["user"] for e in history if e["event"] == "grant"] == [alice, "bob"]
        # alice: her own name, bob's pseudonym, which is not hers
        mine = await h.ok("/status?user=alice@example.org")
        assert mine[a]["claim"]["user"]["email"] == "alice@example.org"
        bob = mine[b]["claim"]["user"]["user"]
        assert hidden(mine[b]["claim"]["user"], bob) and bob != alice
        assert set(await h.ok("/users?user=alice@example.org")) >= {"alice@example.org", bob}
        # carol waits: she sees herself in the queue, the others see her pseudonym
        [queued] = await h.ok("/queue?user=carol")
        assert queued["user"] == "carol"
        carol = (await h.ok("/queue"))[0]["user"]
        assert PSEUDONYM.match(carol) and len({alice, bob, carol}) == 3
        # a caller naming nobody (test-user) sees pseudonyms only; so does a scraper
        plain = await h.ok("/status")
        assert hidden(plain[a]["claim"]["user"], alice) and hidden(plain[b]["claim"]["user"], bob)
        text = await metrics(h)
        assert {alice, bob, carol} <= user_labels(text)
        assert "alice" not in text and '"bob"' not in text and "carol" not in text
        assert await served()


@async_test
async def test_without_the_flag_everyone_sees_every_name():
    async with running(lease=60) as h:
        a, b, served = await holders(h)
        status = await h.ok("/status?user=bob")
        assert status[a]["claim"]["user"]["email"] == "alice@example.org"
        assert set(await h.ok("/users")) == {"alice@example.org", "bob", "carol"}
        assert (await h.ok("/queue"))[0]["user"] == "carol"
        assert {"alice@example.org", "bob", "carol"} <= user_labels(await metrics(h))
        assert h.api.hiding is None
        assert await served()


@async_test
async def test_each_page_of_the_live_stream_shows_its_own_callers_names():
    async with running(hide_users=True, lease=60) as h:
        pages = {
            who: Reader(h, f"/events?user={who}" if who else "/events")
            for who in ("alice@example.org", "bob", None)
        }
        await until(lambda: all(page.snapshots for page in pages.values()))
        [grant] = await h.ok("/request?gpu=1&user=alice@example.org")
        uuid = grant["uuid"]

        def holder(who):
            snapshots = pages[who].snapshots
            claim = snapshots[-1]["status"][uuid]["claim"]
            return claim["user"]["user"] if claim["user"] else None

        await until(lambda: all(holder(who) for who in pages), timeout=5)
        assert holder("alice@example.org") == "alice@example.org"
        alice = holder("bob")
        assert PSEUDONYM.match(alice) and holder(None) == alice
        for who, name in (("alice@example.org", "alice@example.org"), ("bob", alice)):
            last = pages[who].snapshots[-1]
            assert set(last["users"]) == {name}
            assert last["events"][-1]["user"] == name
        assert "alice" not in json.dumps(pages["bob"].snapshots[-1])
        assert alice == (await h.ok("/status?user=bob"))[uuid]["claim"]["user"]["user"]


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=20) as answer:
        return json.loads(answer.read())


def test_a_pseudonym_is_the_same_after_a_restart_on_the_same_state_directory(tmp_path):
    def start(directory):
        return ServerProcess(
            "--test", "--hide-users", "--lease", "300", env={"PATROLLER_STATE_DIR": directory}
        ).start()

    def seen_by_bob(server, uuid):
        return get(server.url, "/status?user=bob")[uuid]["claim"]["user"]["user"]

    kept = str(tmp_path / "state")
    server = start(kept)
    try:
        [grant] = get(server.url, "/request?gpu=1&user=alice@example.org")
        alice = seen_by_bob(server, grant["uuid"])
    finally:
        assert server.stop() == 0
    assert stat.S_IMODE(os.stat(os.path.join(kept, KEY_FILE)).st_mode) == 0o600
    server = start(kept)  # the book gives alice her device back
    try:
        assert seen_by_bob(server, grant["uuid"]) == alice
        assert alice in get(server.url, "/users?user=bob")
    finally:
        assert server.stop() == 0
    for directory in (str(tmp_path / "another"), ""):  # another key; a key for the run alone
        server = start(directory)
        try:
            [grant] = get(server.url, "/request?gpu=1&user=alice@example.org")
            assert PSEUDONYM.match(seen_by_bob(server, grant["uuid"]))
            assert seen_by_bob(server, grant["uuid"]) != alice
        finally:
            assert server.stop() == 0


# -- callers of real uids, identified by the kernel ---------------------------------------------

ASK = r"""
import http.client, json, sys
host, port, *paths = sys.argv[1:]
connection = http.client.HTTPConnection(host, int(port), timeout=20)
answers, lane = [], []
for n, path in enumerate(paths):  # one connection: a second plain /status is the fast lane's
    connection.request("GET", path)
    answer = connection.getresponse()
    if answer.getheader("Date") is None:  # Tornado's answers have one, the fast lane's not
        lane.append(n)
    if path == "/events":  # its first snapshot; the stream stays open, so it comes last
        line = answer.readline()
        while not line.startswith(b"data: "):
            line = answer.readline()
        answers.append([answer.status, json.loads(line[6:])])
        break
    answers.append([answer.status, json.loads(answer.read())])
print(json.dumps({"answers": answers, "lane": lane}))
"""


class Answers(list):
    """[status, body] of each request asked, and `lane`: the positions of those the fast lane
    answered."""

    def __init__(self, answers, lane):
        super().__init__(answers)
        self.lane = lane


def ask(url, *paths, uid=None, namespace=None):
    """[status, body] of each path, asked on one connection as `uid` (default: ours), from the
    network namespace `namespace` (default: ours)."""
    host, port = url[len("http://") :].rsplit(":", 1)
    if namespace is not None:
        who = dict(preexec_fn=entering(namespace, uid))  # it joins it, then becomes uid
    else:
        who = {} if uid is None else dict(user=uid, group=uid, extra_groups=[])
    done = subprocess.run(
        [python_for(uid if uid is not None else os.getuid()), "-c", ASK, host, port, *paths],
        capture_output=True,
        text=True,
        timeout=60,
        **who,
    )
    assert done.returncode == 0, done.stderr
    told = json.loads(done.stdout)
    return Answers(told["answers"], told["lane"])


async def ask_as(uid, h, *paths):
    """`ask` off the loop the daemon runs on."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, lambda: ask(h.url, *paths, uid=uid))


@pytest.fixture
def scenario(tmp_path):
    return ScenarioFile(str(tmp_path / "scenario.json"), devices=[{}, {}, {}])


@async_test
async def test_each_user_sees_their_own_name_others_a_pseudonym_root_every_name(scenario):
    need_root("the callers run as other uids, and root is the host's administrator")
    nobody, daemon = host_identity(NOBODY).user, host_identity(DAEMON).user
    async with gpu_running(scenario, lease=300, hide_users=True) as h:
        [[code, [theirs]]] = await ask_as(DAEMON, h, "/request?gpu=1")
        assert code == 200
        paths = ("/request?gpu=1", "/status", "/status", "/users", "/history", "/events")
        answers = await ask_as(NOBODY, h, *paths)
        [[code, [mine]], *seen] = answers
        assert code == 200 and answers.lane == [2]  # the second /status: its caller was known
        first, again, users, history, page = (body for _, body in seen)
        # nobody: their own name (from Tornado, then from the fast lane) ...
        for status in (first, again, page["status"]):
            assert status[mine["uuid"]]["claim"]["user"]["user"] == nobody
            assert status[mine["uuid"]]["claim"]["user"]["uid"] == NOBODY
        # ... and daemon's pseudonym, the same everywhere
        other = first[theirs["uuid"]]["claim"]["user"]["user"]
        for status in (first, again, page["status"]):
            assert hidden(status[theirs["uuid"]]["claim"]["user"], other)
        assert set(users) == set(page["users"]) == {nobody, other}
        assert [(a["account"], a["uid"]) for a in users[other]["accounts"]] == [(other, None)]
        assert users[nobody]["accounts"][0]["uid"] == NOBODY
        assert [e["user"] for e in history if e["event"] == "grant"] == [other, nobody]
        # daemon sees the other way round, and two users have two pseudonyms
        answers = await ask_as(DAEMON, h, "/status", "/status", "/events")
        [[_, status], [_, again], [_, page]] = answers
        assert answers.lane == [1]
        them = status[mine["uuid"]]["claim"]["user"]["user"]
        assert them != other and PSEUDONYM.match(them)
        for shown in (status, again, page["status"]):
            assert hidden(shown[mine["uuid"]]["claim"]["user"], them)
            assert shown[theirs["uuid"]]["claim"]["user"]["user"] == daemon
        # root sees every name; a scrape is nobody's: pseudonyms only
        status = await h.ok("/status")
        assert status[mine["uuid"]]["claim"]["user"]["user"] == nobody
        assert status[theirs["uuid"]]["claim"]["user"]["user"] == daemon
        assert set(await h.ok("/users")) == {nobody, daemon}
        text = await metrics(h)
        assert user_labels(text) >= {them, other}
        assert f'user="{nobody}"' not in text and f'user="{daemon}"' not in text
        # root's release of another's device names its holder, to root
        released = await h.ok(f"/release?uuid={mine['uuid']}&reason=test")
        assert released["holder"] == nobody


def test_a_caller_who_cannot_be_identified_sees_no_name(namespaces, scenario, tmp_path):
    # root, calling from another network namespace: not identified, so not root either
    server = ServerProcess(
        "--nvidia-smi",
        scenario.command,
        "--address",
        HOST,
        "--hide-users",
        "--docker-host",
        f"unix://{tmp_path}/docker.sock",
        "--lease",
        "300",
        env={"PATROLLER_STATE_DIR": str(tmp_path / "state")},
        preexec_fn=entering(namespaces[0]),
    ).start()
    try:
        nobody = host_identity(NOBODY).user
        [[code, [grant]], [_, status]] = ask(
            server.url, "/request?gpu=1", "/status", uid=NOBODY, namespace=namespaces[0]
        )
        assert code == 200 and status[grant["uuid"]]["claim"]["user"]["user"] == nobody
        answers = ask(
            server.url, "/status", "/status", "/users", "/events", namespace=namespaces[1]
        )
        [[_, status], [_, again], [_, users], [_, page]] = answers
        assert answers.lane == [1]  # known to be unidentified: the fast lane's pseudonyms
        pseudonym = status[grant["uuid"]]["claim"]["user"]["user"]
        for shown in (status, again, page["status"]):
            assert hidden(shown[grant["uuid"]]["claim"]["user"], pseudonym)
        assert set(users) == {pseudonym}
        assert nobody not in json.dumps([status, again, users, page])
    finally:
        server.stop()


@async_test
async def test_a_slurm_jobs_id_is_hidden_with_its_user(tmp_path):
    """A job id names its user to anyone who runs squeue: others see the job's GPU as
    allocated, with neither the job's user nor its id."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("4242 uid=1001 user=carol account=physics partition=gpu\n")
    async with running(hide_users=True, slurm_job_map=str(jobs), job_map_every=0.05) as h:
        uuid = h.uuids()[0]
        await until(lambda: h.services.leases.state(uuid) == "allocated")
        theirs = (await h.ok("/status?user=bob"))[uuid]["claim"]
        carol = theirs["user"]["user"]
        assert hidden(theirs["user"], carol) and theirs["state"] == "allocated"
        assert theirs["jobs"] == [
            {"id": None, "user": carol, "uid": None, "account": None, "partition": "gpu"}
        ]
        allocated = [e for e in await h.ok("/history?user=bob") if e["event"] == "allocated"]
        assert allocated[0]["user"] == carol and allocated[0]["jobs"] is None
        mine = (await h.ok("/status?user=carol"))[uuid]["claim"]
        assert mine["jobs"][0]["id"] == "4242" and mine["user"]["job"]["id"] == "4242"
        allocated = [e for e in await h.ok("/history?user=carol") if e["event"] == "allocated"]
        assert allocated[0]["jobs"] == ["4242"]
        assert "4242" not in json.dumps(await h.ok("/status?user=bob"))
        assert "4242" not in json.dumps(await h.ok("/history?user=bob"))


# -- refusals: /release of a device a Slurm job or a pod holds ---------------------------------

SLURM = "it is released when the job ends (scancel)"
KUBERNETES = "it is released when the pod ends (kubectl delete pod)"
# (what the GPU is allocated to, who asks to release it, the 403's body as they see it). The
# job's id and the pod's name name their user (squeue, kubectl): they go with the user.
REFUSALS = [
    ("job", "carol", "allocated to Slurm job 4242: " + SLURM, {"jobs": ["4242"]}),
    ("job", "bob", "allocated to a Slurm job: " + SLURM, {"jobs": None}),
    # one job of two is theirs: the other's id is not (root alone sees both)
    ("jobs", "dave", "allocated to Slurm jobs: " + SLURM, {"jobs": None}),
    ("jobs", "carol", "allocated to Slurm jobs: " + SLURM, {"jobs": None}),
    (
        "pod",
        "namespace:ml",
        "allocated to Kubernetes pod ml/train-0: " + KUBERNETES,
        {"pods": ["ml/train-0"]},
    ),
    ("pod", "bob", "allocated to a Kubernetes pod: " + KUBERNETES, {"pods": None}),
]
NAMES = ("4242", "4343", "4344", "carol", "dave", "train-0", "ml/")


@pytest.fixture
def allocations(tmp_path):
    """Settings for a daemon whose GPU 0 is carol's Slurm job 4242, GPU 1 dave's job 4343 and
    carol's 4344, GPU 2 the pod ml/train-0 (a real kubelet's pod-resources)."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "0").write_text("4242 uid=1001 user=carol account=physics partition=gpu\n")
    (jobs / "1").write_text("4343 uid=1002 user=dave\n4344 uid=1001 user=carol\n")
    kubelet = Kubelet(str(tmp_path / "kubelet.sock")).start()
    try:
        yield (
            kubelet,
            dict(
                slurm_job_map=str(jobs),
                job_map_every=0.05,
                kubelet_socket=kubelet.path,
                kubelet_every=0.05,
            ),
        )
    finally:
        kubelet.stop()


async def allocated(h, kubelet):
    """The uuids of the GPUs allocated to the job, the jobs and the pod, once they are."""
    uuids = h.uuids()
    kubelet.pods = [gpu_pod("ml", "train-0", uuids[2], container="trainer")]
    await until(lambda: all(h.services.leases.state(u) == "allocated" for u in uuids[:3]))
    return {"job": uuids[0], "jobs": uuids[1], "pod": uuids[2]}


@async_test
async def test_a_refusal_names_a_job_or_pod_only_to_whom_it_may(allocations):
    kubelet, settings = allocations
    async with running(hide_users=True, **settings) as h:
        uuid = await allocated(h, kubelet)
        for what, who, message, data in REFUSALS:
            status, body = await h.call(f"/release?uuid={uuid[what]}&user={who}", "POST", b"")
            assert (status, body) == (
                403,
                {"error": f"device {uuid[what]} is {message}", "uuid": uuid[what], **data},
            ), (what, who)
            if None in data.values():
                assert not any(name in json.dumps(body) for name in NAMES), body
    async with running(**settings) as h:  # without the flag, everyone is told everything
        uuid = await allocated(h, kubelet)
        status, body = await h.call(f"/release?uuid={uuid['jobs']}&user=bob", "POST", b"")
        assert status == 403 and body["jobs"] == ["4343", "4344"]
        assert "Slurm jobs 4343, 4344" in body["error"]


@async_test
async def test_root_is_told_which_job_and_another_uid_is_not(allocations, scenario):
    need_root("the caller runs as another uid, and root is the host's administrator")
    kubelet, settings = allocations
    told = {
        "job": ("jobs", ["4242"]),
        "jobs": ("jobs", ["4343", "4344"]),
        "pod": ("pods", ["ml/train-0"]),
    }
    async with gpu_running(scenario, hide_users=True, **settings) as h:
        uuid = await allocated(h, kubelet)
        for what, (key, ids) in told.items():
            path = f"/release?uuid={uuid[what]}"
            status, mine = await h.call(path)  # root, the host's administrator
            assert status == 403 and mine[key] == ids
            [[status, theirs]] = await ask_as(NOBODY, h, path)
            assert status == 403 and theirs[key] is None
            assert not any(name in json.dumps(theirs) for name in NAMES), theirs


# -- the fleet view: what this daemon heard, hidden again for its callers ------------------------


@async_test
async def test_the_fleet_view_hides_the_names_a_host_showed_this_daemon(scenario):
    """Over loopback the fleet daemon is a local process, the host's root where it runs as
    root, or the holder's own account; the host answers its polls with the view of nobody in
    particular all the same (tests/test_fleet_hidden.py), and /fleet.json hides again what a
    host (an older one) may have shown it, as its callers may see it (before: to everyone, as
    heard)."""
    async with gpu_running(scenario, lease=300, hide_users=True) as host:
        [grant] = await host.ok("/request?gpu=1")  # held by this process's account
        ours = host.services.leases.holder(grant["uuid"]).user
        async with running(
            hide_users=True, fleet=(f"127.0.0.1:{host.port}",), fleet_interval=0.1
        ) as fleet:

            async def holder(asker):
                [heard] = (await fleet.ok(f"/fleet.json?user={asker}"))["hosts"]
                if heard["state"] != "up":
                    return None
                return next(gpu["user"] for gpu in heard["gpus"] if gpu["uuid"] == grant["uuid"])

            deadline = asyncio.get_running_loop().time() + 20
            while await holder("bob") is None:
                assert asyncio.get_running_loop().time() < deadline, "the host never answered"
                await asyncio.sleep(0.05)
            seen = await holder("bob")
            assert PSEUDONYM.match(seen["user"]) and seen["user"] != ours
            assert [seen[k] for k in ("email", "account", "uid", "container")] == [None] * 4
            # the holder too: the host showed the fleet daemon no name to give back
            assert PSEUDONYM.match((await holder(ours))["user"])


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o610, 0o660], ids=oct)
def test_a_key_its_group_or_others_may_touch_is_made_private_and_kept(tmp_path, mode):
    """The group counts as others: a key its group may read lets them turn pseudonyms back
    into names, as much as one every user may read."""
    first = Pseudonyms(str(tmp_path), 16)
    first.open()
    os.chmod(tmp_path / KEY_FILE, mode)
    again = Pseudonyms(str(tmp_path), 16)
    again.open()
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600, oct(mode)
    assert again.of("alice") == first.of("alice")  # the same key, kept


def test_a_key_its_group_may_read_on_a_read_only_filesystem_is_refused(tmp_path):
    from test_state_lock import read_only

    from patroller.state.pseudonyms import PseudonymError

    made = tmp_path / "made"
    made.mkdir(mode=0o700)
    Pseudonyms(str(made), 16).open()
    os.chmod(made / KEY_FILE, 0o640)
    with read_only(made, tmp_path / "ro") as where, pytest.raises(PseudonymError) as error:
        Pseudonyms(where, 16).open(read_only=True)
    assert "Read-only file system" in str(error.value)
