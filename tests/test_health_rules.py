"""A GPU's health, without I/O: what each era's `-q -x` says of it (real captures, and the
crafted variants of tests/fixtures/nvsmi/health), the Xid catalogue, the health book's episodes
(a condition that clears, ECC counts that rise, an Xid ended by a reset or by root), and the
lease rules' side: an unhealthy GPU granted to nobody, its holder keeping it, a request told
why, the `unhealthy` events and their notices."""

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import FakeClock, lease_manager

from patroller.cli.status import device_notes
from patroller.core.errors import Busy
from patroller.core.health import (
    APPLICATION,
    DEGRADED,
    FINE,
    HEALTHY,
    RESET,
    UNHEALTHY,
    HealthBook,
    Reading,
    problems_of,
    xid_kind,
)
from patroller.core.identity import named_user
from patroller.core.leases import Event
from patroller.notify.messages import notices_of
from patroller.observe.nvsmi.discovery import parse_inventory
from patroller.observe.nvsmi.health import health_reading

FIXTURES = Path(__file__).parent / "fixtures" / "nvsmi"
alice, bob = named_user("alice"), named_user("bob")


def reading_of(path: Path) -> Reading:
    [reading] = parse_inventory(path.read_text()).health.values()
    return reading


@pytest.mark.parametrize(
    "path",
    sorted((FIXTURES / "real").glob("*.xml")) + sorted(FIXTURES.glob("*.xml")),
    ids=lambda p: p.name,
)
def test_every_capture_and_written_fixture_is_of_a_healthy_gpu(path):
    for reading in parse_inventory(path.read_text()).health.values():
        assert problems_of(reading, 0, reading.ecc_uncorrectable) == ()


def test_each_era_prints_its_health_in_its_own_shape_and_n_a_is_unknown():
    real = FIXTURES / "real"
    # R515, Ampere: remapped rows, no page retirement (N/A), sram/dram ECC, throttle reasons
    assert reading_of(real / "telegraf-a10g-r515.xml") == Reading(
        remap_pending=False, remap_failure=False, remapped_uncorrectable=0, ecc_uncorrectable=0
    )
    # R510, Pascal: no row remapper (N/A), pages retired, ECC as single_bit/double_bit
    assert reading_of(real / "netdata-tesla-p100-r510.xml") == Reading(
        retire_pending=False, retired_pages=0, ecc_uncorrectable=0
    )
    # R535: clocks_event_reasons and gpu_reset_status; R570 on: gpu_recovery_action None
    assert reading_of(real / "netdata-rtx-4090-r535.xml").reset_required is False
    assert reading_of(real / "telegraf-rtx-3060-r570.xml") == Reading()  # deprecated, None
    # R418: no remapped_rows element at all, every count N/A
    assert reading_of(real / "telegraf-gtx-1660-ti-r418.xml") == Reading()


@pytest.mark.parametrize(
    "name, codes, slowdowns",
    [
        ("a10g-r515-remap-pending.xml", ["remap_pending", "slowdown"], ("hw_thermal_slowdown",)),
        ("tesla-t4-r515-retire-pending.xml", ["retire_pending"], ()),
        (
            "rtx-4000-ada-r595-recovery.xml",
            ["remap_failure", "recovery_action", "slowdown"],
            ("hw_power_brake_slowdown",),
        ),
        (
            "rtx-4090-r535-reset-required.xml",
            ["reset_required", "slowdown"],
            ("sw_thermal_slowdown",),
        ),
        ("rtx-3060-r570-gpu-lost.xml", ["gpu_lost"], ()),
        ("tesla-t4-r515-retired-two.xml", [], ()),  # pages retired long ago: nothing to do
    ],
)
def test_the_crafted_variants_say_what_is_wrong(name, codes, slowdowns):
    reading = reading_of(FIXTURES / "health" / name)
    assert reading.slowdowns == slowdowns
    assert [p.code for p in problems_of(reading, 3, reading.ecc_uncorrectable)] == codes


def test_the_counts_of_each_era_are_read():
    health = FIXTURES / "health"
    assert reading_of(health / "tesla-t4-r515-retire-pending.xml").ecc_uncorrectable == 3
    assert reading_of(health / "tesla-t4-r515-retired-two.xml").retired_pages == 2
    assert reading_of(health / "p100-r510-double-bit.xml").ecc_uncorrectable == 2
    assert reading_of(health / "a10g-r515-remap-pending.xml").remapped_uncorrectable == 1
    assert reading_of(health / "rtx-4000-ada-r595-recovery.xml").recovery_action == "GPU Reset"
    assert reading_of(health / "rtx-3060-r570-gpu-lost.xml").broken == "GPU is lost"


def test_a_page_pending_either_way_an_era_says_it_is_pending():
    def pending(blacklist, retirement):
        return health_reading(
            ET.fromstring(
                f"<gpu><retired_pages><pending_blacklist>{blacklist}</pending_blacklist>"
                f"<pending_retirement>{retirement}</pending_retirement></retired_pages></gpu>"
            )
        ).retire_pending

    assert pending("Yes", "No") is True and pending("No", "Yes") is True
    assert pending("No", "No") is False and pending("N/A", "N/A") is None
    assert pending("N/A", "No") is False


def test_a_process_named_like_a_fault_does_not_make_its_gpu_unhealthy():
    gpu = ET.fromstring(
        "<gpu><processes><process_info><pid>7</pid><process_name>GPU is lost"
        "</process_name></process_info></processes>"
        "<fan_speed>[GPU requires reset]</fan_speed></gpu>"
    )
    assert health_reading(gpu).broken == "GPU requires reset"  # the driver's field counts
    del gpu[1]
    assert health_reading(gpu).broken is None  # the process's name does not


def test_the_reason_says_what_is_wrong_and_what_to_do():
    [problem] = problems_of(Reading(remap_pending=True), 3, None)
    book = HealthBook()
    health = book.read("GPU-a", 3, Reading(remap_pending=True))
    assert health.state == UNHEALTHY and problem.grave
    assert health.reason == (
        "row remap pending: reset the GPU (`nvidia-smi -r -i 3`) when nothing runs on it"
    )
    assert health.codes == "remap_pending"


def test_a_slowdown_degrades_without_withholding():
    health = HealthBook().read("GPU-a", 0, Reading(slowdowns=("hw_thermal_slowdown",)))
    assert health.state == DEGRADED and health.reason is None
    assert health.problems[0].words == "clocks slowed (hw_thermal_slowdown)"


def test_a_condition_ends_when_a_reading_no_longer_shows_it():
    book = HealthBook()
    assert book.read("GPU-a", 0, Reading(retire_pending=False)) is None  # healthy: no change
    assert book.read("GPU-a", 0, Reading(retire_pending=True)).state == UNHEALTHY
    assert book.read("GPU-a", 0, Reading(retire_pending=True)) is None  # the same: no news
    assert book.read("GPU-a", 0, Reading(retire_pending=False)) == FINE
    assert book.get("GPU-a").state == HEALTHY


def test_uncorrectable_ecc_errors_count_when_they_rise_and_end_with_the_reset():
    book = HealthBook()
    assert book.read("GPU-a", 1, Reading(ecc_uncorrectable=2)) is None  # the count at start
    rose = book.read("GPU-a", 1, Reading(ecc_uncorrectable=5))
    assert [p.words for p in rose.problems] == ["uncorrectable ECC errors rose from 2 to 5"]
    assert book.read("GPU-a", 1, Reading(ecc_uncorrectable=5)) is None  # still risen
    assert book.read("GPU-a", 1, Reading(ecc_uncorrectable=0)) == FINE  # reset: zero again
    assert book.read("GPU-a", 1, Reading(ecc_uncorrectable=1)).state == UNHEALTHY
    assert book.read("GPU-a", 1, Reading()) == FINE  # no longer printed: unknown, not risen


def test_the_xid_catalogue_tells_gpu_faults_from_applications():
    for xid in (48, 63, 64, 74, 79, 92, 94, 95, 119, 120):
        assert xid_kind(xid) == RESET, xid
    for xid in (13, 31, 43, 45):
        assert xid_kind(xid) == APPLICATION, xid
    assert xid_kind(109) is None and xid_kind(1) is None


def test_an_xid_of_the_gpu_lasts_until_it_is_reset_or_root_says_so():
    book = HealthBook()
    book.read("GPU-a", 2, Reading(remap_pending=False))
    health = book.xid("GPU-a", 2, 79, detail="GPU has fallen off the bus.")
    assert health.state == UNHEALTHY and health.codes == "xid_79"
    assert health.reason == (
        "Xid 79: fallen off the bus (GPU has fallen off the bus.): reset "
        "the GPU (`nvidia-smi -r -i 2`) when nothing runs on it; then "
        "`patroller release --healthy 2`"
    )
    assert book.read("GPU-a", 2, Reading(remap_pending=False)) is None  # -q -x can't clear it
    assert book.xid("GPU-a", 2, 79) is None  # told again: the same episode
    assert book.reset("GPU-a") == FINE
    book.xid("GPU-a", 2, 48)
    assert book.declare_healthy("GPU-a") == FINE
    assert book.reset("GPU-b") is None and book.declare_healthy("GPU-b") is None  # unknown


def test_an_applications_xid_is_told_against_its_process_not_the_gpu():
    book = HealthBook(faults_kept=2)
    health = book.xid("GPU-a", 0, 13, pid=4242, name="python3", at=5.0)
    assert health.state == HEALTHY and health.reason is None
    assert [f.to_json() for f in health.faults] == [
        {
            "xid": 13,
            "kind": "application",
            "words": "Xid 13: graphics engine exception",
            "pid": 4242,
            "at": 5.0,
        }
    ]
    book.xid("GPU-a", 0, 109, pid=None)  # not in the catalogue: shown, not held against it
    health = book.xid("GPU-a", 0, 31, pid=4243)
    assert [(f.xid, f.kind) for f in health.faults] == [(109, "unknown"), (31, "application")]


def test_root_excuses_what_a_reading_shows_until_it_is_gone_and_back():
    book = HealthBook()
    book.read("GPU-a", 0, Reading(remap_pending=True, ecc_uncorrectable=0))
    book.read("GPU-a", 0, Reading(remap_pending=True, ecc_uncorrectable=3))
    assert book.get("GPU-a").codes == "remap_pending,ecc_rising"
    assert book.declare_healthy("GPU-a") == FINE
    assert book.read("GPU-a", 0, Reading(remap_pending=True, ecc_uncorrectable=3)) is None
    assert book.read("GPU-a", 0, Reading(remap_pending=False, ecc_uncorrectable=3)) is None
    again = book.read("GPU-a", 0, Reading(remap_pending=True, ecc_uncorrectable=4))
    assert again.codes == "remap_pending,ecc_rising"  # new: told again


def test_an_unhealthy_gpu_is_granted_to_nobody_its_holder_keeps_it_and_a_request_says_why():
    leases = lease_manager(FakeClock())
    told = []
    leases.on_event(told.append)
    [held] = leases.request(bob, {"gpu": 1})
    book = HealthBook()
    health = book.read(held.uuid, held.number, Reading(remap_pending=True))
    leases.withhold(held.uuid, health.reason, "health", health)
    assert leases.holder(held.uuid) == bob
    assert [(e.kind, e.user, e.details["problems"]) for e in told[1:]] == [
        ("unhealthy", "bob", ["remap_pending"])
    ]
    leases.release(bob)
    got = leases.request(alice, {"gpu": 7})
    assert held.uuid not in [d.uuid for d in got]
    with pytest.raises(Busy) as refused:
        leases.request(alice, {"gpu": 1})
    assert refused.value.message == (
        "busy: 1 gpu requested, 0 free; GPU 0 is granted to nobody: row remap pending: reset "
        "the GPU (`nvidia-smi -r -i 0`) when nothing runs on it"
    )
    assert refused.value.data["withheld"] == {"0": health.reason}
    # Silent as well: both reasons, and healthy again leaves the silence.
    leases.withhold(held.uuid, "it printed no statistics")
    assert leases.holds[held.uuid].withheld == f"{health.reason}; it printed no statistics"
    leases.withhold(held.uuid, None, "health", FINE)
    assert leases.holds[held.uuid].withheld == "it printed no statistics"
    assert [e.kind for e in told[-1:]] == ["healthy"]
    granted = []
    leases.wait(alice, {"gpu": 1}, granted.append)
    assert granted == []
    leases.withhold(held.uuid, None)
    assert [d.uuid for d in granted[0]] == [held.uuid]


def test_a_degraded_gpu_is_granted_and_its_health_shown_without_an_event():
    leases = lease_manager(FakeClock())
    told = []
    leases.on_event(told.append)
    uuid = leases.inventory.by_number(0).uuid
    health = HealthBook().read(uuid, 0, Reading(slowdowns=("hw_slowdown",)))
    leases.withhold(uuid, health.reason, "health", health)
    assert leases.holds[uuid].health.state == DEGRADED and leases.holds[uuid].withheld is None
    assert [d.uuid for d in leases.request(alice, {"gpu": 1})] == [uuid] and [
        e.kind for e in told
    ] == ["grant"]


def test_the_unhealthy_notice_says_why_and_what_to_do_once_an_episode():
    gpu = (("GPU-a", 3),)
    [told] = notices_of(
        Event(
            "unhealthy",
            "bob",
            gpu,
            {"reason": "row remap pending: reset the GPU\n(`nvidia-smi -r -i 3`)"},
        ),
        "gpu1",
        1_700_000_000.0,
    )
    assert told.kind == "unhealthy" and told.key == ("unhealthy", "GPU-a")
    assert told.title == "gpu1: GPU 3 is unhealthy" and told.concerns == ("bob",)
    assert told.body.startswith(
        "GPU 3 of gpu1, held by bob, is unhealthy since 2023-11-14 "
        "22:13 UTC: row remap pending: reset the GPU\\n(`nvidia-smi"
    )
    assert "`patroller release --healthy 3`" in told.body and "\n" not in told.body
    [back] = notices_of(Event("healthy", None, gpu, {"was": "x"}), "gpu1", 1_700_000_060.0)
    assert back.ends == ("unhealthy", "GPU-a") and back.title == "gpu1: GPU 3 is healthy again"


def test_patroller_status_says_why_a_gpu_is_withheld_and_whose_fault_an_xid_is():
    book = HealthBook()
    book.read("GPU-a", 2, Reading(slowdowns=("hw_slowdown",)))
    book.xid("GPU-a", 2, 13, pid=77)
    health = book.xid("GPU-a", 2, 109)
    claim = {"withheld": "it printed no statistics", "health": health.to_json()}
    assert device_notes({"number": 2, "group": "gpu"}, {"claim": claim}) == [
        "GPU 2: granted to nobody: it printed no statistics",
        "GPU 2: degraded: clocks slowed (hw_slowdown): check its cooling and power",
        "GPU 2: pid 77: Xid 13: graphics engine exception (a fault of its process)",
        "GPU 2: Xid 109 (an Xid Patroller does not place)",
    ]
