"""The processes' figures (observe/figures.py): merged when read, in the order they came."""

from patroller.observe.figures import ProcessFigures, has_figure

GPU, OTHER = "GPU-a", "GPU-b"
DASHES = {"sm": None, "mem": None, "fb": None}  # pmon's `-` in every cell


def test_a_figure_not_known_in_an_interval_keeps_the_last_one_however_many_wait():
    figures = ProcessFigures(backlog=10)
    figures.add(GPU, {7: {"sm": 40, "mem": 12, "fb": None}})
    figures.add(GPU, {7: {"sm": None, "mem": 5, "fb": 900}})
    figures.add(GPU, {7: DASHES})
    figures.add(GPU, {7: {"sm": 30, "mem": None, "fb": None}})
    assert figures.waiting(GPU) == 4  # nothing merged yet: none was read
    assert figures.get(GPU, 7) == {"sm": 30, "mem": 5, "fb": 900}
    assert figures.waiting(GPU) == 0
    assert figures.get(GPU, 8) == {} and figures.get(OTHER, 7) == {}


def test_what_is_shown_changes_with_a_new_process_or_a_figure_not_with_dashes():
    figures = ProcessFigures()
    assert figures.add(GPU, {7: DASHES})  # new, even without a figure
    assert not figures.add(GPU, {7: DASHES})  # nothing new
    assert figures.add(GPU, {7: {"sm": None, "mem": 1, "fb": None}})  # one figure
    assert figures.add(GPU, {7: DASHES, 8: DASHES})  # another process
    assert not figures.add(GPU, {8: DASHES})  # fewer, none new, no figure
    assert figures.add(OTHER, {7: DASHES})  # the same pid on another device is another
    # a sender that counted the figures as its rows came says so, and is taken at its word
    assert figures.add(GPU, {8: DASHES}, figured=True)
    assert not figures.add(GPU, {8: {"sm": 1, "mem": 1, "fb": 1}}, figured=False)
    assert figures.add(GPU, {9: DASHES}, figured=False)  # new all the same


def test_a_process_that_ended_is_not_brought_back_by_an_interval_before_its_end():
    figures = ProcessFigures(backlog=10)
    figures.add(GPU, {7: {"sm": 40, "mem": 1, "fb": 2}, 8: {"sm": 1, "mem": 1, "fb": 1}})
    assert figures.end(GPU, 7)
    assert not figures.end(GPU, 7) and not figures.end(GPU, 99) and not figures.end(OTHER, 8)
    assert figures.get(GPU, 7) == {}
    assert figures.get(GPU, 8) == {"sm": 1, "mem": 1, "fb": 1}
    # a pid used again after its end starts afresh, with nothing of the one before
    figures.add(GPU, {7: {"sm": 40, "mem": 1, "fb": 2}})
    figures.end(GPU, 7)
    figures.add(GPU, {7: {"sm": None, "mem": 3, "fb": None}})
    assert figures.get(GPU, 7) == {"sm": None, "mem": 3, "fb": None}


def test_an_end_after_the_merge_forgets_the_process_at_once():
    figures = ProcessFigures()
    figures.add(GPU, {7: {"sm": 40, "mem": 1, "fb": 2}})
    assert figures.get(GPU, 7)["sm"] == 40  # merged
    assert figures.end(GPU, 7)
    assert figures.waiting(GPU) == 0 and figures.get(GPU, 7) == {}
    assert figures.add(GPU, {7: DASHES})  # new again


def test_a_device_never_read_keeps_fewer_than_the_backlog_waiting():
    figures = ProcessFigures(backlog=3)
    for sm in range(7):
        figures.add(GPU, {7: {"sm": sm, "mem": None, "fb": None}})
        assert figures.waiting(GPU) < 3
    assert figures.get(GPU, 7)["sm"] == 6


def test_has_figure():
    assert not has_figure({}) and not has_figure({1: DASHES, 2: {}})
    assert has_figure({1: DASHES, 2: {"sm": None, "mem": 0}})  # 0 is a figure


def _interval(count: int, sm: int) -> dict:
    return {pid: {"sm": sm, "mem": pid % 7, "fb": None} for pid in range(count)}


def _merged_plainly(*items) -> dict:
    """What a read merges, all at once, from the same items (an interval, or a pid ended)."""
    figures = ProcessFigures(backlog=100)
    for item in items:
        figures.add(GPU, item) if isinstance(item, dict) else figures.end(GPU, item)
    return {pid: figures.get(GPU, pid) for pid in range(5000)}


def test_a_merge_of_thousands_goes_a_step_of_processes_at_a_time_and_ends_the_same():
    """5,000 processes over two intervals and an end: 100 processes merged between two
    yields (the loop serves between), and then the same figures as a merge all at once."""
    figures = ProcessFigures(backlog=100)
    figures.add(GPU, _interval(5000, 10))
    figures.end(GPU, 3)
    figures.add(GPU, _interval(5000, 20))
    steps = 0
    for _ in figures.merging(GPU, step=100):
        steps += 1
        assert figures.waiting(GPU) >= 1  # not done: a read would merge the rest now
    assert steps == 100 and figures.waiting(GPU) == 0
    expected = _merged_plainly(_interval(5000, 10), 3, _interval(5000, 20))
    assert {pid: figures.get(GPU, pid) for pid in range(5000)} == expected


def test_a_read_or_news_in_the_middle_of_a_merge_still_reads_right():
    """A read halfway merges the rest at once (the merge in steps stops); an interval or an
    end that comes halfway is merged after the one in progress, in order."""
    figures = ProcessFigures(backlog=100)
    figures.add(GPU, _interval(5000, 10))
    merging = figures.merging(GPU, step=100)
    next(merging)
    figures.add(GPU, _interval(5000, 20))
    figures.end(GPU, 4)
    next(merging)
    assert figures.get(GPU, 4999) == {"sm": 20, "mem": 4999 % 7, "fb": None}
    assert figures.get(GPU, 4) == {}
    assert list(merging) == []  # it stopped: the read merged it all
    assert figures.waiting(GPU) == 0
    figures.add(GPU, _interval(5000, 30))
    merging = figures.merging(GPU, step=1000)
    next(merging)
    figures.end(GPU, 5)
    assert sum(1 for _ in merging) == 4
    expected = _merged_plainly(_interval(5000, 10), _interval(5000, 20), 4, _interval(5000, 30), 5)
    assert {pid: figures.get(GPU, pid) for pid in range(5000)} == expected
