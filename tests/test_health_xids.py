"""The health book's Xids at their edges (core/health.py): one without the kernel's detail,
two of the GPU at once, a fault's time and process, and the GPU's number in what to do."""

from patroller.core.health import UNHEALTHY, Fault, HealthBook, Reading, xid_problem


def test_an_xid_without_detail_says_only_its_words():
    problem = xid_problem(79, 3)
    assert problem.words == "Xid 79: fallen off the bus"
    book = HealthBook()
    health = book.xid("GPU-a", 3, 79)
    assert health.state == UNHEALTHY
    assert health.reason == (
        "Xid 79: fallen off the bus: reset the GPU (`nvidia-smi -r -i 3`) when nothing runs "
        "on it; then `patroller release --healthy 3`"
    )


def test_two_xids_of_the_gpu_are_both_held_against_it_each_with_its_first_detail():
    book = HealthBook()
    book.xid("GPU-a", 1, 79, detail="first")
    assert book.xid("GPU-a", 1, 79, detail="again") is None
    health = book.xid("GPU-a", 1, 48)
    assert health.codes == "xid_79,xid_48"
    assert [p.words for p in health.problems] == [
        "Xid 79: fallen off the bus (first)",
        "Xid 48: double-bit ECC error",
    ]


def test_a_processs_fault_keeps_its_time_and_process_at_zero_unless_told():
    book = HealthBook()
    health = book.xid("GPU-a", 0, 13, pid=7, name="python3")
    assert health.faults == (Fault(13, "Xid 13: graphics engine exception", 7, "python3", 0.0),)
    assert health.to_json()["faults"][0]["at"] == 0.0


def test_an_xid_numbers_the_gpu_in_what_its_reading_says_to_do():
    book = HealthBook()
    book.read("GPU-a", 5, Reading(remap_pending=True))
    health = book.xid("GPU-a", 5, 13, pid=7)
    assert [p.action for p in health.problems] == [
        "reset the GPU (`nvidia-smi -r -i 5`) when nothing runs on it"
    ]
