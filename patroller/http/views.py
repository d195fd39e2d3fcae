"""What the API shows: the body of /devices, serialized once and served many times (that of
/status is statusview.py's), and the read models of the lease manager's state (claims, the
queue, usage per user, holds per device) that /status, /queue, /users, the metrics and the web
page serve, and the devices as the answers of /request, /wait, /renew and /release list them.

The read models read the lease manager (its holds, its queue, the devices set aside for a
starving waiter); the manager never reads them.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Protocol

from patroller.core.devices import Device, Inventory
from patroller.core.identity import Identity
from patroller.core.jobs import Allocation, Job
from patroller.core.leases import Hold, LeaseManager
from patroller.core.leases.limits import counted_uid
from patroller.core.pods import Pod, PodAllocation, pod_id
from patroller.http.encoding import dumps
from patroller.observe.idle import IdleWatch
from patroller.observe.stats import iso_time
from patroller.services import Services


class StatusBody(Protocol):
    """What the page and the counters read of /status's view (statusview.StatusView, which
    builds on the read models here)."""

    builds: int
    parts_built: int

    def data(self) -> dict[str, Any]: ...


def topology_view(leases: LeaseManager, inventory: Inventory, uuid: str) -> dict[str, Any] | None:
    """How a device is linked to the others, as `topo -m` says (None: not known): its NUMA node
    and CPU affinity, the link to each other device by number, its NVLink peers' numbers."""
    topology, device = leases.topology, inventory.get(uuid)
    if not topology or device is None or uuid not in topology.links:
        return None
    numbers = {d.uuid: d.number for d in inventory.present()}
    links = {
        str(numbers[peer]): word for peer, word in topology.links[uuid].items() if peer in numbers
    }
    return {
        "numa": topology.numa.get(uuid),
        "cpus": topology.cpus.get(uuid),
        "links": dict(sorted(links.items(), key=lambda kv: int(kv[0]))),
        "nvlink": sorted(int(n) for n, word in links.items() if word.startswith("NV")),
    }


class DevicesView:
    """The /devices body, built again when the inventory changes (`invalidate`), and its ETag:
    a hash of the body, which /devices answers carry as `ETag` and /status answers as
    `X-Devices-ETag`, so that a fleet daemon asks /devices again only when it changed."""

    def __init__(self, inventory: Inventory, leases: LeaseManager | None = None) -> None:
        self.inventory = inventory
        self.leases = leases  # for the topology, where known
        self._build()

    def _build(self) -> None:
        self._body = dumps(self.data())
        self.etag = f'"{hashlib.blake2b(self._body, digest_size=8).hexdigest()}"'
        self.etag_line = b"ETag: %s\r\n" % self.etag.encode("ascii")  # the fast lane's
        self.tag_line = b"X-Devices-ETag: %s\r\n" % self.etag.encode("ascii")

    def data(self) -> dict[str, Any]:
        """/devices as data."""
        if self.leases is None:
            return {d.uuid: d.info() for d in self.inventory}
        leases = self.leases
        return {
            d.uuid: {**d.info(), "topology": topology_view(leases, self.inventory, d.uuid)}
            for d in self.inventory
        }

    def invalidate(self) -> None:
        """The inventory changed."""
        self._build()

    def body(self) -> bytes:
        return self._body


def page_snapshot(services: Services, status: StatusBody, devices: DevicesView) -> dict[str, Any]:
    """Everything the web page shows, for its live feed."""
    return {
        "time": iso_time(time.time()),
        "mode": services.mode,
        "status": status.data(),
        "devices": devices.data(),
        "queue": queue_view(services.leases),
        "users": users_view(services.leases, services.idle),
        "events": services.audit.since(0.0, 10),
        "history": services.stats.history(),
        "interval": services.config.history_every,
    }


def counters(services: Services, status: StatusBody) -> dict[str, Any]:
    """The daemon's own counters (/metrics.json): what it costs, how its parts fare."""
    return {
        "uptime": round(time.monotonic() - services.started, 3),
        "devices": len(services.inventory),
        "waiting": len(services.leases.waiters),
        "status_builds": status.builds,
        "status_parts_built": status.parts_built,
        "proc_reads": services.identifier.proc_reads,
        "docker_calls": services.identifier.docker_calls,
        "caller_lookups": services.callers.lookups,
        "caller_descriptors_read": services.callers.descriptors_read,
        "monitors": {m.name: m.metrics().to_json() for m in services.monitors},
        "lease_book": services.book.metrics() if services.book is not None else None,
        "usage": services.usage.metrics() if services.usage is not None else None,
        "notifications": services.notifier.metrics() if services.notifier is not None else None,
        "held_for_processes": services.lifelines.metrics(),
    }


def users_view(leases: LeaseManager, idle: IdleWatch | None) -> dict[str, Any]:
    """/users: per user, GPUs held, held with nothing running, used without asking, idle,
    requests waiting, and the limit that applies."""
    counted = usage(leases)
    waiting = waiting_by_user(leases)
    users: dict[str, Any] = {}
    accounts = accounts_of(leases)
    for user in sorted(set(counted) | set(waiting)):
        counts = counted.get(user, dict.fromkeys(USAGE_KEYS, 0))
        held = leases.held_by(user)
        count, longest = waiting.get(user, (0, 0.0))
        users[user] = {
            **counts,
            "devices": [d.number for d in held],
            "idle": sum(1 for d in held if idle is not None and idle.idle_for(d.uuid) is not None),
            "waiting": count,
            "waited_max": round(longest, 3),
            "limit": leases.policy.limit_of(user),
            "accounts": accounts.get(user, []),
            # the Slurm jobs whose processes hold devices (a job's process as holder)
            "jobs": sorted(
                {
                    dict(h.holder.job)["id"]
                    for d in held
                    for h in [leases.holds[d.uuid]]
                    if h.holder and h.holder.job
                }
            ),
            # the Kubernetes pods whose processes hold devices, as namespace/name
            "pods": sorted(
                {pod for d in held for pod in [pod_id(leases.holds[d.uuid].holder)] if pod}
            ),
        }
    return users


def accounts_of(leases: LeaseManager) -> dict[str, list[dict[str, Any]]]:
    """Per user: the host accounts their holds count under as well (core/leases/limits.py),
    each with every device it holds (whoever the holder) and its limit."""
    policy, holds = leases.policy, leases.holds
    present = [d for d in leases.inventory if not d.lost]
    by_uid: dict[int, tuple[str, list[int]]] = {}
    users: dict[str, list[int]] = {}
    for device in present:
        holder = holds[device.uuid].holder
        uid = counted_uid(holder, policy) if holder is not None else None
        if holder is None or uid is None:
            continue
        name, numbers = by_uid.setdefault(uid, (holder.account or f"uid:{uid}", []))
        numbers.append(device.number)
        if uid not in users.setdefault(holder.user, []):
            users[holder.user].append(uid)
    return {
        user: [
            {
                "account": by_uid[uid][0],
                "uid": uid,
                "held": len(by_uid[uid][1]),
                "devices": by_uid[uid][1],
                "limit": policy.limit_of(by_uid[uid][0]),
            }
            for uid in uids
        ]
        for user, uids in users.items()
    }


# -- the read models of the lease manager ---------------------------------------------------------


def claim_view(hold: Hold, now: float) -> dict[str, Any]:
    """The claim part of /status for one device (`set_aside_for` is filled in by `claims`)."""
    return {
        **claim_static(hold),
        "process_detail": [
            {
                "pid": pid,
                "user": owner.user,
                "command": hold.commands.get(pid),
                "trespass": trespasses(hold, owner),
            }
            for pid, owner in hold.processes.items()
        ],
        "age": round(now - hold.since, 3),
        "expires": hold.expires(now),
    }


def trespasses(hold: Hold, owner: Identity) -> bool:
    """Whether a process of `owner` trespasses on the device, as /users and the audit record
    say: the device is held and the process is not the holder's (on a device a Slurm job or a
    pod holds, not in it, whoever's it is); a process whose owner is still being found is
    nobody's yet."""
    return hold.holder is not None and not owner.identifying and not hold.belongs(owner)


def claim_static(hold: Hold) -> dict[str, Any]:
    """The claim of one device but its processes' detail and what moves with the clock."""
    return {
        "state": hold.state,
        "user": hold.holder.to_json() if hold.holder else None,
        "users": [u.to_json() for u in hold.users()],
        "processes": list(hold.processes),
        "held_for_pid": hold.held_for.pid if hold.held_for is not None else None,
        "hold": hold.how if hold.holder is not None else None,
        "asked": hold.asked,
        "withheld": hold.withheld,
        "health": hold.health.to_json(),
        "jobs": (
            [job_view(job) for job in hold.allocation.jobs]
            if isinstance(hold.allocation, Allocation)
            else None
        ),
        "pods": (
            [pod_view(pod) for pod in hold.allocation.pods]
            if isinstance(hold.allocation, PodAllocation)
            else None
        ),
        "set_aside_for": None,
    }


def job_view(job: Job) -> dict[str, Any]:
    """One Slurm job a device is allocated to, as the job map says it."""
    return {
        "id": job.id,
        "user": job.user,
        "uid": job.uid,
        "account": job.account,
        "partition": job.partition,
    }


def pod_view(pod: Pod) -> dict[str, Any]:
    """One Kubernetes pod a device is assigned to, as the kubelet lists it."""
    return {"namespace": pod.namespace, "name": pod.name, "containers": list(pod.containers)}


def claims(leases: LeaseManager) -> dict[str, dict[str, Any]]:
    """The claim part of /status for every device, with the devices set aside for whom."""
    now = leases.clock()
    shown = {uuid: claim_view(hold, now) for uuid, hold in leases.holds.items()}
    waiter, aside = leases.set_aside()
    for uuid in aside:
        shown[uuid]["set_aside_for"] = waiter.user.user if waiter is not None else None
    return shown


def free_counts(leases: LeaseManager) -> dict[str, int]:
    """How many devices of each group are free now (as a Busy answer says)."""
    return {group: len(devices) for group, devices in leases.free().items()}


def device_json(devices: list[Device]) -> list[dict[str, Any]]:
    """Devices as /release lists them."""
    return [{"uuid": d.uuid, "group": d.group, "info": d.info()} for d in devices]


def grant_json(devices: list[Device], leases: LeaseManager) -> list[dict[str, Any]]:
    """Devices as /request, /wait and /renew list them: with how each is held (`hold`,
    `expires`, `held_for_pid`)."""
    return [
        {"uuid": d.uuid, "group": d.group, "info": d.info(), **leases.hold_of(d.uuid)}
        for d in devices
    ]


def queue_view(leases: LeaseManager) -> list[dict[str, Any]]:
    """The waiting requests in arrival order, as /queue lists them."""
    now = leases.clock()
    return [
        {
            "position": n,
            "user": w.user.user,
            "wants": dict(w.wants),
            "waited": round(now - w.since, 3),
            "hold": "process" if w.held_for is not None else "lease",
            "pid": w.held_for.pid if w.held_for is not None else None,
            "link": w.link,
        }
        for n, w in enumerate(leases.waiters.in_order(), 1)
    ]


USAGE_KEYS = ("held", "reserved_unused", "unreserved", "over_limit", "trespassing")


def usage(leases: LeaseManager) -> dict[str, dict[str, int]]:
    """Per user: devices held (`held`), held with nothing running (`reserved_unused`), used
    without having asked for them (`unreserved`: their processes on a device another user
    holds, or on one they took by computing on it rather than by a request, or, on a device
    a scheduler allocated, outside its jobs or pods: those asked the scheduler), and taken by
    computing beyond a limit (`over_limit`: a trespass), and those they trespass on
    (`trespassing`: their process on a device another user holds, or, on a device a Slurm
    job holds, a process not in the job, theirs or not)."""
    out: dict[str, dict[str, int]] = {}

    def add(user: str, key: str) -> None:
        counts = out.setdefault(user, dict.fromkeys(USAGE_KEYS, 0))
        counts[key] += 1

    for hold in leases.holds.values():
        if hold.lost:
            continue
        if hold.holder is not None:
            add(hold.holder.user, "held")
            if not hold.processes:
                add(hold.holder.user, "reserved_unused")
            if hold.over_limit:
                add(hold.holder.user, "over_limit")
        outsiders = {o.user for o in hold.processes.values() if not hold.belongs(o)}
        if hold.allocation is not None:  # its jobs' (or pods') own processes asked Slurm
            unasked = outsiders
        else:
            unasked = {
                o.user
                for o in hold.processes.values()
                if hold.holder is None or o.user != hold.holder.user or not hold.asked
            }
        for user in unasked:
            add(user, "unreserved")
        if hold.holder is not None:
            for user in outsiders:
                add(user, "trespassing")
    return out


def waiting_by_user(leases: LeaseManager) -> dict[str, tuple[int, float]]:
    """Per user: (requests waiting, seconds the longest has waited)."""
    now = leases.clock()
    out: dict[str, tuple[int, float]] = {}
    for waiter in leases.waiters.in_order():
        count, longest = out.get(waiter.user.user, (0, 0.0))
        out[waiter.user.user] = (count + 1, max(longest, now - waiter.since))
    return out


def device_holds(leases: LeaseManager) -> dict[str, dict[str, Any]]:
    """Per device: what the metrics show of its hold (state, holder, age, lease left, and
    each process's owner and command)."""
    now = leases.clock()
    return {
        uuid: {
            "state": hold.state,
            "holder": hold.holder,
            "age": now - hold.since,
            "expires": hold.expires(now),
            "processes": [
                (pid, owner, hold.commands.get(pid)) for pid, owner in hold.processes.items()
            ],
        }
        for uuid, hold in leases.holds.items()
    }
