"""The lease commands' endpoints: /request, /wait (a long poll), /release and /renew. Each
identifies its caller, makes one command of the lease rules, and answers with what was granted
or given back; a grant whose answer cannot be written is given back."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tornado.ioloop import IOLoop
from tornado.iostream import StreamClosedError

from patroller import durations
from patroller.core.devices import Device
from patroller.core.errors import BadRequest, NoCallerProcess, Unavailable
from patroller.core.identity import Identity, ProcessRef
from patroller.core.leases import Waiter
from patroller.http import query
from patroller.http.handlers import Handler
from patroller.http.hiding import viewer_of
from patroller.http.views import device_json, grant_json
from patroller.identify.connection import stream_of

log = logging.getLogger(__name__)


class Reserving(Handler):
    """What the commands that grant share: the policy's longest hold, the process a grant is
    held for, and a grant answered (or given back when it cannot be)."""

    def check_duration(self, duration: float | None) -> None:
        """Refuse a reservation longer than the host's policy allows."""
        longest = self.leases.policy.max_hold
        if duration is not None and duration > longest:
            raise BadRequest(
                f"hold: {durations.describe(duration)} is longer than the "
                f"{durations.describe(longest)} one may ask for on this host",
                max_hold=longest,
            )

    async def held_for(self, hold: str) -> ProcessRef | None:
        """The process a hold=process grant is held for (after `caller`); None for a lease."""
        if hold != "process":
            return None
        return await self.services.callers.process(self.request)

    async def grant(self, caller: Identity, devices: list[Device]) -> None:
        """Answer with a grant; if the answer could not be written (the client left after it
        was last asked: a unix caller's closed socket refuses the write), give it back."""
        kept = self.kept(caller, devices)
        stream = stream_of(self.request.connection)
        try:
            await self.send(grant_json(kept, self.leases))
            lost = stream is None or (stream.closed() and stream.error is not None)
        except StreamClosedError:  # closed before the write
            lost = True
        if lost:
            log.debug(
                "%s %s: the answer could not be written; the grant is given back",
                self.request.method,
                self.request.path,
            )
            for device in kept:
                self.leases.release(caller, device.uuid, "the client left before the answer")

    def kept(self, caller: Identity, devices: list[Device]) -> list[Device]:
        """The devices just granted, if the lease book could keep the grant; else they are
        given back and the request is refused (503): a grant the book does not hold would not
        survive a restart."""
        book = self.services.book
        refusal = book.refusal() if book is not None else None
        if refusal is None:
            return devices
        for device in devices:
            self.leases.release(caller, device.uuid, "the lease book could not be written")
        raise Unavailable(refusal)


class RequestHandler(Reserving):
    async def get(self) -> None:
        ask = query.parse_ask(self.args(), wait=False)
        caller = await self.caller(ask.user)
        held_for = await self.held_for(ask.hold)
        self.check_duration(ask.duration)
        if self.unanswerable():
            return
        await self.grant(
            caller, self.leases.request(caller, ask.wants, held_for, ask.duration, ask.link)
        )

    post = get  # so that a client need not change state with a GET; the form joins the query


class WaitHandler(Reserving):
    """Long-poll: answered when the lease manager grants, on timeout, or never if the client
    leaves.

    A waiter exists only while its client is connected: one that leaves while it is being
    identified is never queued, and a grant that finds it gone is given straight back.
    """

    waiter: Waiter | None = None
    outcome: asyncio.Future[list[Device] | None] | None = None  # None: the client left

    async def get(self) -> None:
        ask = query.parse_ask(self.args(), wait=True)
        caller = await self.caller(ask.user)
        held_for = await self.held_for(ask.hold)
        self.check_duration(ask.duration)
        if self.unanswerable():  # it left while we looked it up: queue nothing for nobody
            return
        self.outcome = asyncio.get_running_loop().create_future()
        self.waiter = self.leases.wait(
            caller, ask.wants, self._end_wait, self._fail, held_for, ask.duration, ask.link
        )
        timer = None
        if ask.timeout is not None and not self.outcome.done():
            timer = IOLoop.current().call_later(ask.timeout, self._timed_out, ask.wants)
        try:
            devices = await self.outcome
        finally:
            if timer is not None:
                IOLoop.current().remove_timeout(timer)
        if devices is None:
            return
        if self.unanswerable():
            for device in devices:  # nobody to tell: give them straight back
                self.leases.release(caller, device.uuid)
            return
        await self.grant(caller, devices)

    post = get  # as /request: GET, the seed's contract, or POST

    def _end_wait(self, devices: list[Device] | None) -> None:
        if self.outcome is not None and not self.outcome.done():
            self.outcome.set_result(devices)

    def _fail(self, error: Exception) -> None:
        if self.outcome is not None and not self.outcome.done():
            self.outcome.set_exception(error)

    def _timed_out(self, wants: dict[str, int]) -> None:
        if self.waiter is not None and self.leases.cancel(self.waiter):
            self._fail(self.leases.busy(wants))

    def on_connection_close(self) -> None:
        if self.waiter is not None and self.leases.cancel(self.waiter):
            log.debug("a waiting client left")
            self._end_wait(None)


class ReleaseHandler(Reserving):
    """Give back one device (uuid=), or all the caller's but those held for another process
    that lives (`kept`, saying why: that process's job runs on them)."""

    async def _release(self) -> None:
        ask = query.parse_release(self.args())
        caller = await self.caller(ask.user)
        process = await self.calling_process() if ask.uuid is None else None
        if self.unanswerable():
            return
        if ask.healthy and ask.uuid is not None:
            self.send(self.healthy(caller, ask.uuid))
            return
        holder = self.leases.holder(ask.uuid) if ask.uuid is not None else None
        now, later = self.leases.release(caller, ask.uuid, ask.reason, process)
        kept = (
            []
            if ask.uuid is not None
            else [
                d
                for d in self.leases.held_by(caller.user)
                if self.leases.holds[d.uuid].held_for not in (None, process)
            ]
        )
        why = "held while its process runs: released by that process, by uuid, or when it ends"
        self.send(
            {
                "released": device_json(now),
                "after_exit": device_json(later),
                "kept": [{**g, "why": why} for g in grant_json(kept, self.leases)],
                # whose reservation it was, when the host's root released another user's
                "holder": self.named(holder.user, caller)
                if holder and not holder.same_user(caller) and (now or later)
                else None,
            }
        )

    def healthy(self, caller: Identity, uuid: str) -> dict[str, Any]:
        """The host's root says the device is healthy: its Xids end, what -q -x shows now is
        excused (core/health.py); it is granted again unless something else withholds it."""
        self.leases.check_admin(caller, uuid, "say a GPU is healthy")
        watch = self.services.health
        health = watch.declare_healthy(uuid, caller.user) if watch is not None else None
        return {
            "healthy": uuid,
            "health": health.to_json() if health else None,
            "withheld": self.leases.holds[uuid].withheld,
        }

    def named(self, user: str, caller: Identity) -> str | None:
        """`user` as the caller may see them (--hide-users)."""
        hidden = self.api.hiding
        return hidden.name(user, viewer_of(caller)) if hidden is not None else user

    async def calling_process(self) -> ProcessRef | None:
        """The process asking, when the kernel can say (a unix or loopback caller), else None."""
        try:
            return await self.services.callers.process(self.request)
        except NoCallerProcess:
            return None

    get = post = _release


class RenewHandler(Reserving):
    """Restart the lease of the caller's reservations: a client that keeps a lease alive."""

    async def _renew(self) -> None:
        ask = query.parse_release(self.args(), endpoint="/renew")
        caller = await self.caller(ask.user)
        if self.unanswerable():
            return
        self.send({"renewed": grant_json(self.leases.renew(caller, ask.uuid), self.leases)})

    get = post = _renew
