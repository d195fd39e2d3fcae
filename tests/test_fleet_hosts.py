"""Pure: one fleet host as /fleet.json shows it (its state, why it is not up, since when, when
last seen and asked, its free GPUs only while up), and the words for each thing asking a host
can raise, as the fleet page and the log say them."""

import errno

from tornado.iostream import StreamClosedError

from patroller import answers
from patroller.config import Config
from patroller.http.fleet import FAILED, REFUSED, SILENT, Fleet, Host, NotPatroller, cut
from patroller.http.fleetlink import Cut, Silent

GPUS = [{"free": True}, {"free": False}, {"free": True}]


def test_a_host_not_yet_asked_then_up_then_down_is_shown_as_it_was_heard():
    host = Host("gpu1:8080", "http://gpu1:8080", since=0.0)
    assert host.to_json() == {
        "host": "gpu1:8080",
        "url": "http://gpu1:8080",
        "state": "asking",
        "error": None,
        "since": "1970-01-01T00:00:00.000+00:00",
        "last_seen": None,
        "checked": None,
        "free": None,
        "gpus": [],
    }
    host.answered(GPUS, now=10.5)
    shown = host.to_json()
    assert (shown["state"], shown["free"], shown["gpus"]) == ("up", 2, GPUS)
    assert (
        shown["since"]
        == shown["last_seen"]
        == shown["checked"]
        == ("1970-01-01T00:00:10.500+00:00")
    )
    host.answered(GPUS[1:2], now=20.0)  # up still: since it first answered
    assert (host.to_json()["since"], host.to_json()["free"]) == (
        "1970-01-01T00:00:10.500+00:00",
        0,
    )
    host.failed(SILENT, "no answer within 3s", asked=30.0, now=33.25)
    assert host.to_json() == {
        "host": "gpu1:8080",
        "url": "http://gpu1:8080",
        "state": "not answering",
        "error": "no answer within 3s",
        "since": "1970-01-01T00:00:30.000+00:00",
        "last_seen": "1970-01-01T00:00:20.000+00:00",
        "checked": "1970-01-01T00:00:33.250+00:00",
        "free": None,
        "gpus": [],
    }


def test_a_host_that_never_answered_is_down_since_its_first_asking():
    host = Host("gpu2:8080", "http://gpu2:8080", since=0.0)
    host.failed(REFUSED, "connection refused", asked=5.0, now=5.5)
    assert (host.since, host.last_seen, host.checked) == (5.0, None, 5.5)


def test_each_failure_of_an_asking_is_said_in_its_own_words():
    fleet = Fleet(Config())
    assert fleet.trouble(Silent("no connection within 1s")) == (SILENT, "no connection within 1s")
    assert fleet.trouble(answers.BadAnswer("status.gpus is not a list")) == (
        FAILED,
        "bad answer: status.gpus is not a list",
    )
    assert fleet.trouble(NotPatroller("/status did not answer JSON")) == (
        FAILED,
        "bad answer: /status did not answer JSON: is it a Patroller daemon?",
    )
    for closed in (Cut([]), StreamClosedError()):
        assert fleet.trouble(closed) == (FAILED, "the connection closed before the answer ended")
    unreachable = OSError(errno.EHOSTUNREACH, "No route to host")
    assert fleet.trouble(unreachable) == (FAILED, "No route to host")
    assert fleet.trouble(OSError("resolver: no such host")) == (FAILED, "resolver: no such host")
    assert fleet.trouble(OSError()) == (FAILED, "OSError")
    assert fleet.trouble(TimeoutError()) == (FAILED, "TimeoutError")
    assert fleet.trouble(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) == (
        REFUSED,
        "connection refused",
    )
    assert fleet.trouble(RuntimeError("it broke")) == (FAILED, "it broke")
    assert fleet.trouble(RuntimeError()) == (FAILED, "RuntimeError")


def test_a_length_is_read_from_any_line_of_the_head_and_whole():
    start = "HTTP/1.1 200 OK\r\n"
    assert cut("/status", [start, "Content-Length: 9999\r\n", "\r\n"], 100) == (
        "/status is 9999 bytes, more than 100"
    )
    assert cut("/status", [start, "Content-Length: 100\r\n", "\r\n"], 100) is None  # broke off
    assert cut("/status", [start, "Content-Length: 12:34\r\n", "\r\n"], 100) == (
        "/status has a Content-Length that is not a number"
    )
