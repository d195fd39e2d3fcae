""" "Free" is one rule written twice: the daemon's own (core/leases/serving.py `free_devices`,
over its holds) and another host's (answers.py `free`, over that host's /devices and /status
answers, for the fleet views and the client side, which import nothing of the daemon). The two
are held to each other here: each device of a daemon in every state is free by one exactly
where it is free by the other, read through the daemon's own views."""

from __future__ import annotations

import json
from dataclasses import replace

from helpers import FakeClock, lease_manager

from patroller import answers
from patroller.core.devices import Inventory
from patroller.core.identity import named_user
from patroller.core.jobs import Allocation, Job
from patroller.http.statusview import StatusView
from patroller.http.views import DevicesView
from patroller.observe.stats import StatsStore
from patroller.observe.testmode import synthetic_inventory


def test_a_device_is_free_to_another_host_exactly_where_the_daemon_would_grant_it():
    clock = FakeClock()
    gpus = synthetic_inventory(7).devices
    # one device of another group: free to a request for it, never counted as a free GPU
    inventory = Inventory([*gpus[:6], replace(gpus[6], group="fpga")])
    leases = lease_manager(clock, inventory)
    stats = StatsStore(inventory, stale_after=3, history_every=5, history_points=120, clock=clock)
    free, reserved, silent, unhealthy, allocated, lost, fpga = inventory.devices
    leases.withhold(silent.uuid, "it printed no statistics")
    leases.withhold(unhealthy.uuid, "Xid 79: fallen off the bus", "health")
    leases.allocate(allocated.uuid, Allocation((Job(id="77"),)))
    inventory.update([d for d in inventory.devices if d is not lost])
    leases.devices_changed()
    leases.request(named_user("bob"), {"gpu": 2})  # the two GPUs left: `free` and `reserved`
    leases.release(named_user("bob"), free.uuid)

    devices = DevicesView(inventory, leases).data()
    status = json.loads(StatusView(inventory, leases, stats, None, 0.1, clock=clock).body())
    granted = leases.free()
    shown = {
        (group, d.uuid): answers.free(devices[d.uuid], status[d.uuid], group)
        for group in ("gpu", "fpga")
        for d in inventory.devices
    }
    rule = {
        (group, d.uuid): d in granted.get(group, [])
        for group in ("gpu", "fpga")
        for d in inventory.devices
    }
    assert shown == rule
    # and each state is there: the rule is not met by every device being busy, or free
    assert {uuid for (group, uuid), yes in rule.items() if yes} == {free.uuid, fpga.uuid}
    assert {status[d.uuid]["claim"]["state"] for d in inventory.devices} >= {
        "free",
        "reserved",
        "allocated",
        "lost",
    }
