"""GET /doctor: the doctor's checks (patroller/doctor) of what this daemon meets on its host,
for the host's root alone, as the kernel identified the caller (`is_admin`: a name given with
user= counts for nothing). The checks run off the event loop: nvidia-smi's commands as
supervised children, the rest in the executor; one examination at a time (api.doctor)."""

from __future__ import annotations

from patroller.core.errors import NotYours
from patroller.core.leases import is_admin
from patroller.http.handlers import Handler

ROOT_ONLY = (
    "GET /doctor is for the host's root only (as the kernel identifies the caller: "
    "over the unix socket, or from this host); run `patroller doctor` as root instead"
)


class DoctorHandler(Handler):
    async def get(self) -> None:
        caller = await self.caller(None)
        if not is_admin(caller):
            raise NotYours(ROOT_ONLY, needs="root")
        assert self.api.doctor is not None
        results = await self.api.doctor.results()
        self.send([result.json() for result in results])
