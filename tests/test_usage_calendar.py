"""/usage with a range past the calendar, and a request that fails every time it is sent: a 400
naming the field for the one, and one traceback a minute in the log at most for the other."""

import logging

import pytest
from helpers import async_test, running
from test_openapi import answer_schema, undocumented

from patroller.http import query


@async_test
async def test_a_range_past_the_calendar_is_a_400_naming_its_field_and_logs_nothing(
    tmp_path, caplog
):
    async with running(state_dir=str(tmp_path / "state"), usage_interval=0.2) as h:
        for path, field in (
            ("/usage?since=1000000d", "since"),
            ("/usage?since=1e30d", "since"),
            ("/usage?since=0001-01-01T00:00:00%2B14:00", "since"),
            ("/usage?since=0001-01-01&tz=%2B05:00", "since"),
            ("/usage?since=1000000d&by=day,user&tz=Europe/Paris", "since"),
        ):
            for _ in range(20):  # as the attack did: again and again
                code, body = await h.call(path)
                assert code == 400 and body["field"] == field, (path, code, body)
                assert "calendar" in body["error"]
            assert list(undocumented(body, answer_schema("/usage", "get", 400))) == []
        assert (await h.call("/usage?since=7d"))[0] == 200  # a range within it is answered
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.errors_expected
@async_test
async def test_a_request_that_fails_each_time_logs_one_traceback_a_minute(
    tmp_path, caplog, monkeypatch
):
    def broken(args, now):
        raise RuntimeError("a fault no request should reach")

    monkeypatch.setattr(query, "parse_usage", broken)
    async with running(state_dir=str(tmp_path / "state"), usage_interval=0.2) as h:
        for _ in range(50):
            code, body = await h.call("/usage")
            assert code == 500 and "Traceback" not in str(body)
        h.api.tracebacks.clock = lambda: float("inf")  # a minute later, and far beyond
        assert (await h.call("/usage"))[0] == 500
    failed = [r for r in caplog.records if r.exc_info is not None]
    assert len(failed) == 2, [r.getMessage() for r in failed]
    assert "answered 500" in failed[0].getMessage()
    assert "49 more failed meanwhile, not logged" in failed[1].getMessage()
