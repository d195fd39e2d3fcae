"""A device withheld and given back (core/leases/withholding.py `apply`), as the log and the
audit record tell it: unhealthy with why, healthy again with what it was and who said so, each
cause's reason kept until it ends, and whether anything shown changed."""

import logging

from patroller.core.devices import Device
from patroller.core.health import FINE, HealthBook
from patroller.core.identity import named_user
from patroller.core.leases.holds import Hold, Notices
from patroller.core.leases.withholding import apply

GPU = Device(uuid="GPU-7", number=7)


def followed():
    notices, events = Notices(), []
    notices.on_event(events.append)
    return notices, events


def test_an_unhealthy_device_is_logged_and_told_then_healthy_again_as_root_said(caplog):
    caplog.set_level(logging.WARNING, logger="patroller.core.leases.withholding")
    hold = Hold(since=0.0, uuid="GPU-7", holder=named_user("alice"))
    notices, events = followed()
    sick = HealthBook().xid("GPU-7", 7, 79)
    assert apply(hold, None, "health", sick, GPU, notices) is True
    assert caplog.messages == [f"GPU GPU-7 is unhealthy, granted to nobody: {sick.reason}"]
    assert [(e.kind, e.user, e.devices) for e in events] == [
        ("unhealthy", "alice", (("GPU-7", 7),))
    ]
    assert events[0].details == {"reason": sick.reason, "problems": ["xid_79"]}
    caplog.clear()
    assert apply(hold, None, "health", FINE, GPU, notices, by="root") is True
    assert caplog.messages == [f"GPU GPU-7 is healthy again (was: {sick.reason}), as root said"]
    assert events[1].kind == "healthy" and events[1].user == "alice"
    assert events[1].details == {"was": sick.reason, "by": "root"}
    caplog.clear()
    apply(hold, None, "health", sick, GPU, notices)
    apply(hold, None, "health", FINE, GPU, notices)
    assert caplog.messages[-1] == f"GPU GPU-7 is healthy again (was: {sick.reason})"
    assert events[-1].details == {"was": sick.reason}
    assert apply(hold, None, "health", FINE, GPU, notices) is False  # nothing new


def test_each_cause_is_kept_until_it_ends_and_a_change_says_so():
    hold = Hold(since=0.0, uuid="GPU-7")
    notices, events = followed()
    assert apply(hold, "it is silent", "silent", None, GPU, notices) is True
    assert apply(hold, "it is hot", "health", None, GPU, notices) is True
    assert hold.withheld == "it is silent; it is hot"
    assert apply(hold, "it is hot", "health", None, GPU, notices) is False
    assert apply(hold, None, "silent", None, GPU, notices) is True
    assert hold.withheld == "it is hot"
    assert apply(hold, None, "silent", None, GPU, notices) is False  # ended already
    assert apply(hold, None, "health", None, GPU, notices) is True
    assert hold.withheld is None and hold.withholds == {}
    assert events == []  # a cause alone tells no event


def test_a_free_device_turning_unhealthy_is_told_with_no_holder():
    notices, events = followed()
    sick = HealthBook().xid("GPU-7", 7, 48)
    assert apply(Hold(since=0.0, uuid="GPU-7"), None, "health", sick, GPU, notices) is True
    assert [(e.kind, e.user) for e in events] == [("unhealthy", None)]
