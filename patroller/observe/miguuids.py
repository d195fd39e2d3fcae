"""The MIG devices' uuids, from `nvidia-smi -L`: `-q -x` lists a GPU's MIG instances but not
their uuids (`MIG-<uuid>` from R470 on), which is what the kubelet names them by.

Read only when some GPU has MIG enabled with instances, once at discovery and again at each
reading of the inventory watch, through the supervisor's OneShotChild: killed after
`mig_list_timeout` s, its output parsed by nvsmi/listing.py. A run that fails or hangs
degrades, never stops anything: it is logged once (until `-L` answers again), and the
instances keep the uuids the last listing that worked gave them (at discovery: none, so that
a `MIG-<uuid>` id maps to no GPU until `-L` answers).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from patroller.config import Config
from patroller.core.devices import Device, MigInstance
from patroller.observe.nvsmi.listing import parse_list_gpus, with_mig_uuids
from patroller.observe.supervisor import OneShotChild, problem

log = logging.getLogger(__name__)

Key = tuple[str, int | None, int | None, int | None]  # GPU uuid, index, GI, CI


def _key(device: Device, instance: MigInstance) -> Key:
    return (device.uuid, instance.index, instance.gpu_instance_id, instance.compute_instance_id)


class MigUuids:
    """Gives the MIG instances of discovered devices their uuids (see above)."""

    def __init__(self, argv: list[str], env: Mapping[str, str] | None, config: Config) -> None:
        self.query = OneShotChild([*argv, "-L"], env, config.mig_list_timeout, config)
        self.shown = " ".join(self.query.argv)
        self.readings = 0
        self.failures = 0
        self.skipped = 0  # lines of -L that could not be read
        self._failing = False
        self._known: dict[Key, str] = {}  # what the last listing that worked gave

    @staticmethod
    def wanted(devices: Sequence[Device]) -> bool:
        """Whether `-L` is worth running: some GPU present has MIG on and instances."""
        return any(d.mig and d.mig_instances and not d.lost for d in devices)

    async def attach(self, devices: Sequence[Device]) -> list[Device]:
        """The devices with their MIG instances' uuids; never raises for a failing `-L`."""
        if not self.wanted(devices):
            return list(devices)
        self.readings += 1
        answer = await self.query.run()
        if answer.stopped:
            return self._remembered(devices)  # its output is incomplete
        if answer.error is not None or answer.timed_out or answer.status:
            self.failures += 1
            if not self._failing:
                log.warning(
                    "cannot list the MIG devices' uuids: `%s` failed, %s; until it "
                    "answers, a MIG device it never listed maps to no GPU",
                    self.shown,
                    problem(answer, self.query),
                )
            self._failing = True
            return self._remembered(devices)
        if self._failing:
            log.info("`%s` lists the MIG devices' uuids again", self.shown)
            self._failing = False
        listing = parse_list_gpus(answer.output)
        if listing.skipped:
            self.skipped += len(listing.skipped)
            log.debug(
                "`%s`: %d unreadable line(s) skipped, the last: %r",
                self.shown,
                len(listing.skipped),
                listing.skipped[-1][:200],
            )
        found = with_mig_uuids(devices, listing.mig)
        self._known = {_key(d, m): m.uuid for d in found for m in d.mig_instances if m.uuid}
        return found

    def _remembered(self, devices: Sequence[Device]) -> list[Device]:
        """The devices with the uuids the last good listing gave the same instances."""
        return [
            replace(
                d,
                mig_instances=tuple(
                    replace(m, uuid=self._known.get(_key(d, m))) for m in d.mig_instances
                ),
            )
            if d.mig_instances
            else d
            for d in devices
        ]

    async def stop(self, grace: float) -> None:
        """End a run in progress; none starts after."""
        await self.query.stop(grace)
