"""The requests in flight and the stop that cuts them short (http/inflight.py), without a server:
which cancellation a handler answers, and which it lets through."""

import asyncio

import pytest
from helpers import async_test

from patroller.core.errors import Unavailable
from patroller.http.inflight import STOPPING, InFlight, answered_on_stop


class Handler:
    """What answered_on_stop needs of a handler: its in-flight set and its client's state."""

    def __init__(self, client_left: bool = False) -> None:
        self.inflight = InFlight()
        self.client_left = client_left
        self.closed = False
        self.inner: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.entered = asyncio.Event()

    def unanswerable(self) -> bool:
        self.closed = self.client_left
        return self.client_left

    @answered_on_stop
    async def get(self) -> str:
        self.inflight.add()
        self.entered.set()
        await self.inner
        return "answered"


async def started(handler: Handler) -> "asyncio.Task[object]":
    task = asyncio.ensure_future(handler.get())
    await handler.entered.wait()
    return task


@async_test
async def test_a_request_the_stop_cancels_is_answered_503_and_its_task_ends_uncancelled():
    handler = Handler()
    task = await started(handler)
    assert await handler.inflight.drain(0.0) == 1
    assert not task.cancelled()
    with pytest.raises(Unavailable, match=STOPPING):
        task.result()
    assert task.cancelling() == 0  # the stop's cancel was answered, not left pending
    assert handler.inflight.tasks == set()


@async_test
async def test_a_request_whose_client_left_is_ended_with_no_answer_when_the_stop_cancels_it():
    handler = Handler(client_left=True)
    task = await started(handler)
    assert await handler.inflight.drain(0.0) == 1
    assert task.result() is None and handler.closed


@async_test
async def test_a_request_that_ends_within_the_grace_is_not_cut_short():
    handler = Handler()
    task = await started(handler)
    asyncio.get_running_loop().call_soon(handler.inner.set_result, None)
    assert await handler.inflight.drain(5.0) == 0
    assert task.result() == "answered"


@async_test
async def test_a_cancellation_not_made_by_a_stop_goes_on_as_it_came():
    handler = Handler()
    task = await started(handler)
    task.cancel()  # not stopping: someone else's cancel
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


@async_test
async def test_a_cancelled_wait_inside_the_handler_is_not_taken_for_the_stop():
    # Stopping, but what the handler awaited was cancelled, not its own task: not ours to answer
    handler = Handler()
    task = await started(handler)
    handler.inflight.stopping = True
    handler.inner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handler.closed is False
