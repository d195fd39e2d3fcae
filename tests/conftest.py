"""Shared fixtures: every test fails if the daemon logged an error while it ran."""
import logging

import pytest


@pytest.fixture(autouse=True)
def no_errors_logged(caplog, request):
    """A 500, an uncaught exception or a failing callback is a bug even if the test passed."""
    yield
    if request.node.get_closest_marker("errors_expected"):
        return
    errors = [r for r in caplog.get_records("call") + caplog.get_records("teardown")
              if r.levelno >= logging.ERROR]
    assert not errors, "errors logged: " + "; ".join(r.getMessage() for r in errors)


def pytest_configure(config):
    config.addinivalue_line("markers", "errors_expected: the test provokes logged errors on purpose")
