"""--hide-users: which user names each caller may see, and the answers as each caller sees them.

A user's name is shown to that user (the same user as the lease rules' `same_user` compares:
by `user`) and to the host's root as the kernel identified it (`is_admin`). Everyone else, a
caller that cannot be identified, and the scrapers of /metrics (nobody in particular) see the
user's pseudonym (state/pseudonyms.py) instead, and nothing else that names them: an
identity's e-mail, account, uid, container, info labels and Slurm job are left out (null, or
empty), a user's host accounts in /users are pseudonyms with no uid, and their jobs are not
listed; a refusal says that a device is allocated to a Slurm job or a pod, not which one, and
how many devices other identities hold under the caller's host account, not which
(errors.Private). `unknown` (a process nobody can be found for) names no one and is shown as it
is. Who may see which name is `Viewer.sees` (core/identity.py). Another daemon's fleet view
polling this one (`fleet_poll`) sees what nobody in particular sees, even as root: it shows all
its own callers what it hears. /fleet.json's holders, which a host (an older one) may have shown
this daemon by name, are hidden again as its caller may see them, and the labels of /metrics
are the pseudonyms alone (`metric_labels`).

The read models build their data as before, names and all (the audit record and the log keep
them); what each caller sees is derived from that data here, as late as possible, by pure
functions of the data and a `Redaction` (tests/test_hiding_rules.py holds them as one table).
One build of the data is serialized once per way of seeing it: with every name (root: the
views' own body), with pseudonyms only (everyone the data names nothing of: most pollers share
it), and once for each user it names who asks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from patroller.core.errors import PatrollerError
from patroller.core.identity import NAMELESS, Identity, Viewer
from patroller.core.leases import is_admin
from patroller.core.pods import pod_id
from patroller.http.encoding import dumps
from patroller.http.statusview import StatusView
from patroller.identify.connection import Accepted, ConnectionFacts
from patroller.state.pseudonyms import Pseudonyms

Data = Any  # a read model's data: JSON's dicts, lists and scalars
EVENT_NAMES = ("user", "by", "holder", "recipient")  # the fields of an audit event that name
# users ("recipient": a notification's, when it is a user's; "admin" is no user's name)
NOBODY = Viewer()
EVERYTHING = Viewer(everything=True)  # without --hide-users, everyone
# In the User-Agent of every poll of a fleet view (fleet.py), as every version of it has sent.
FLEET_AGENT = "(fleet view)"


def viewer_of(identity: Identity | None) -> Viewer:
    """The viewer a caller is: None for one that could not be identified."""
    if identity is None:
        return NOBODY
    return Viewer(identity.user, is_admin(identity))


def fleet_poll(headers: Mapping[str, str]) -> bool:
    """Whether another daemon's fleet view asks. It shows what it hears to all of its own
    callers, whom this host does not know (and without --hide-users, by name): it hears what
    nobody in particular may see here, even where it runs as this host's root. Anyone may send
    this agent, and so see less, never more."""
    return FLEET_AGENT in headers.get("User-Agent", "")


class Redaction:
    """One viewer's pass over some data: each name they may not see becomes its pseudonym, and
    is noted in `hidden` (so a pass for nobody notes every name the data holds)."""

    def __init__(self, viewer: Viewer, pseudonyms: Pseudonyms) -> None:
        self.viewer = viewer
        self.pseudonyms = pseudonyms
        self.hidden: set[str] = set()

    def name(self, user: str | None) -> str | None:
        if user is None or self.viewer.sees(user):
            return user
        self.hidden.add(user)
        return self.pseudonyms.of(user)

    def identity(self, data: dict[str, Any] | None) -> dict[str, Any] | None:
        """An identity (Identity.to_json) as the viewer sees it: its pseudonym, where it came
        from, and nothing else; every other field null, a field added later included."""
        if data is None or self.viewer.sees(data.get("user")):
            return data
        shown: dict[str, Any] = {key: None for key in data}
        shown.update(
            user=self.name(data.get("user")),
            source=data.get("source"),
            info={},
            degraded=data.get("degraded", False),
        )
        return shown


# -- each read model, as a viewer sees it (the data given is never changed) --------------------


def status(data: dict[str, Any], seen_by: Redaction) -> dict[str, Any]:
    """/status (StatusView.data)."""
    return {
        uuid: {**entry, "claim": claim(entry["claim"], seen_by)} for uuid, entry in data.items()
    }


def claim(data: dict[str, Any], seen_by: Redaction) -> dict[str, Any]:
    holder = (data.get("user") or {}).get("user")
    return {
        **data,
        "user": seen_by.identity(data.get("user")),
        "users": [seen_by.identity(u) for u in data.get("users", [])],
        "process_detail": [
            {**p, "user": seen_by.name(p.get("user"))} for p in data.get("process_detail", [])
        ],
        "set_aside_for": seen_by.name(data.get("set_aside_for")),
        "jobs": (
            None
            if data.get("jobs") is None
            else [job_seen(job, holder, seen_by) for job in data["jobs"]]
        ),
        "pods": (
            None
            if data.get("pods") is None
            else [pod_seen(pod, holder, seen_by) for pod in data["pods"]]
        ),
    }


def job_seen(job: dict[str, Any], holder: str | None, seen_by: Redaction) -> dict[str, Any]:
    """A Slurm job a device is allocated to (views.job_view): its user, or the holder's when
    the job map does not name one, decides; hidden, its id goes too (squeue names its user)."""
    user = job.get("user") or holder
    if seen_by.viewer.sees(user):
        return job
    return {**job, "id": None, "user": seen_by.name(job.get("user")), "uid": None, "account": None}


def pod_seen(pod: dict[str, Any], holder: str | None, seen_by: Redaction) -> dict[str, Any]:
    """A Kubernetes pod a device is assigned to (views.pod_view): the holder's (the kubelet
    names no user); hidden, its namespace, name and containers go (they name their team)."""
    if seen_by.viewer.sees(holder):
        return pod
    return {**pod, "namespace": None, "name": None, "containers": []}


def queue(data: list[dict[str, Any]], seen_by: Redaction) -> list[dict[str, Any]]:
    """/queue (views.queue_view)."""
    return [{**waiter, "user": seen_by.name(waiter.get("user"))} for waiter in data]


def users(data: dict[str, Any], seen_by: Redaction) -> dict[str, Any]:
    """/users (views.users_view): another user's accounts are their pseudonyms, with no uid,
    and their Slurm jobs and Kubernetes pods are not listed (a job's id names its user to
    squeue, a pod's name to kubectl)."""
    shown: dict[str, Any] = {}
    for user, entry in data.items():
        if seen_by.viewer.sees(user):
            shown[user] = entry
            continue
        shown[str(seen_by.name(user))] = {
            **entry,
            "jobs": [],
            "pods": [],
            "accounts": [
                {**a, "account": seen_by.pseudonyms.of(a["account"]), "uid": None}
                for a in entry.get("accounts", [])
            ],
        }
    return shown


def events(data: list[dict[str, Any]], seen_by: Redaction) -> list[dict[str, Any]]:
    """/history (the audit record's events): the users they name, and the account of an
    over-limit trespass, which is its user's."""
    shown = []
    for event in data:
        seen = dict(event)
        for key in EVENT_NAMES:
            if event.get(key) is not None:
                seen[key] = seen_by.name(event[key])
        if event.get("account") is not None and not seen_by.viewer.sees(event.get("user")):
            seen["account"] = seen_by.pseudonyms.of(event["account"])
        # Slurm job ids name their users to squeue (and pods their team): a trespasser's own
        # job (pod) is theirs; the jobs (pods) a device is allocated to are the holder's
        # (trespass) or the event's user's (allocated, deallocated); whose a preempting
        # allocation is, the event does not say.
        for own, listed in (("job", "jobs"), ("pod", "pods")):
            if event.get(own) is not None and not seen_by.viewer.sees(event.get("user")):
                seen[own] = None
            if event.get(listed) is not None:
                owner = {
                    "trespass": event.get("holder"),
                    "allocated": event.get("user"),
                    "deallocated": event.get("user"),
                }.get(str(event.get("event")))
                viewer = seen_by.viewer
                if not (viewer.everything or owner is not None and viewer.sees(owner)):
                    seen[listed] = None
        shown.append(seen)
    return shown


def refusal(error: PatrollerError, viewer: Viewer) -> dict[str, Any]:
    """A refusal's body (errors.PatrollerError): what it says of users the viewer may not see
    (their Slurm jobs, pods, devices) is said without it, in its message as in its data."""
    private = error.private
    if private is not None and not all(viewer.sees(user) for user in private.users):
        return {"error": private.message, **private.data}
    return {"error": error.message, **error.data}


def snapshot(data: dict[str, Any], seen_by: Redaction) -> dict[str, Any]:
    """The web page's live feed (views.page_snapshot)."""
    return {
        **data,
        "status": status(data["status"], seen_by),
        "queue": queue(data["queue"], seen_by),
        "users": users(data["users"], seen_by),
        "events": events(data["events"], seen_by),
    }


def fleet(data: dict[str, Any], seen_by: Redaction) -> dict[str, Any]:
    """/fleet.json (fleet.Fleet.data): each host's GPUs as that host showed them to this daemon,
    which may have seen every name (its own host's root, over loopback); so each holder and
    user is hidden again, as this daemon's callers may see them (a pseudonym a host gave
    becomes another: its own key is not this daemon's)."""
    return {
        **data,
        "hosts": [
            {
                **host,
                "gpus": [
                    {
                        **gpu,
                        "user": seen_by.identity(gpu.get("user")),
                        "users": [seen_by.identity(u) for u in gpu.get("users") or []],
                    }
                    for gpu in host.get("gpus") or []
                ],
            }
            for host in data.get("hosts", [])
        ],
    }


def metric_labels(identity: Identity | None, label: Callable[[str], str] | None) -> dict[str, str]:
    """The labels /metrics gives a holder or a process's owner: `user`, `container` and `job`
    and `pod` (a Slurm job's id, a Kubernetes pod's namespace/name). A scraper is nobody in
    particular: with --hide-users (`label`, Hiding.label) the user is its pseudonym and the
    others are empty, as they would name the user."""
    if identity is None:
        return {"user": "", "container": "", "job": "", "pod": ""}
    if label is not None:
        return {"user": label(identity.user), "container": "", "job": "", "pod": ""}
    container = (identity.container[1] or identity.container[0]) if identity.container else ""
    return {
        "user": identity.user,
        "container": container,
        "job": dict(identity.job).get("id", "") if identity.job else "",
        "pod": pod_id(identity) or "",
    }


Render = Callable[[Data, Redaction], Data]


class Shown:
    """One build of some data, serialized once for each way of seeing it (see the module)."""

    def __init__(
        self, data: Data, render: Render, pseudonyms: Pseudonyms, everything: bytes | None = None
    ) -> None:
        self.data = data
        self.render = render
        self.pseudonyms = pseudonyms
        self._everything = everything  # the data with every name, when already serialized
        anonymous = Redaction(NOBODY, pseudonyms)
        self._anonymous = dumps(render(data, anonymous))
        self.names = anonymous.hidden  # every name in the data (a pass for nobody hides all)
        self._own: dict[str, bytes] = {}  # user -> the data as that user sees it

    def body(self, viewer: Viewer) -> bytes:
        if viewer.everything:
            if self._everything is None:
                self._everything = dumps(self.data)
            return self._everything
        if viewer.user not in self.names:  # nothing of theirs in it
            return self._anonymous
        own = self._own.get(viewer.user)
        if own is None:
            own = self._own[viewer.user] = dumps(
                self.render(self.data, Redaction(viewer, self.pseudonyms))
            )
        return own


class Hiding:
    """The HTTP layer's side of --hide-users: the callers' views of /status (cached with the
    views' body), of the other read models and of the live feed, the labels of the metrics,
    and who asks on each connection, for the fast lane."""

    def __init__(self, pseudonyms: Pseudonyms, status_view: StatusView) -> None:
        self.pseudonyms = pseudonyms
        self.status_view = status_view
        self._status: Shown | None = None  # /status as each viewer sees it ...
        self._status_of: bytes | None = None  # ... for this build of the views' body

    def status_body(self, viewer: Viewer) -> bytes:
        """/status as `viewer` sees it, at most as old as the views' own body."""
        body = self.status_view.body()
        if viewer.everything:
            return body
        if self._status is None or self._status_of is not body:
            self._status = Shown(self.status_view.latest(), status, self.pseudonyms, body)
            self._status_of = body
        return self._status.body(viewer)

    def lane_status(self, connection: Accepted | None) -> bytes | None:
        """The fast lane's /status: for a connection whose caller is known; None sends the
        request to the handler, which identifies the caller (and remembers them)."""
        viewer = connection.facts.viewer if connection is not None else None
        return self.status_body(viewer) if viewer is not None else None

    @staticmethod
    def remember(known: ConnectionFacts | None, viewer: Viewer) -> None:
        """Who asked on a connection (a plain request: no user= of test mode): one
        connection, one caller."""
        if known is not None:
            known.viewer = viewer

    def show(self, render: Render, data: Data, viewer: Viewer) -> Data:
        """Some data as `viewer` sees it."""
        return data if viewer.everything else render(data, Redaction(viewer, self.pseudonyms))

    def name(self, user: str | None, viewer: Viewer) -> str | None:
        return Redaction(viewer, self.pseudonyms).name(user)

    def feed(self, data: Data) -> Shown:
        """One snapshot of the live feed, for every page."""
        return Shown(data, snapshot, self.pseudonyms)

    def label(self, user: str) -> str:
        """A user as the metrics' labels name them: nobody scrapes as anyone."""
        return user if user in NAMELESS else self.pseudonyms.of(user)
