"""Stop waiting for a request's outputs once its HTTP client has gone.

A handler awaits the first output (so bad input is a 4xx, not a broken stream) and, without
streaming, every output; a turn can wait minutes for a slot at the router. Nothing there reads
the connection, so a client that hung up would keep its turn queued or running for nobody.
Each wait here races the connection: on `http.disconnect` the work is cancelled, which closes
the output stream (its `finally` cancels the engine or router call and frees the slot).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from starlette.requests import Request

from ..request.engine_request import SampleOutput

T = TypeVar("T")


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass  # a body chunk the handler already read; the next message is the disconnect


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or ClientGone (with `work` cancelled) if the client leaves first."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
    if task.cancelled() or not task.done():
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise ClientGone
    return task.result()


async def first_output(
    request: Request, stream: AsyncIterator[SampleOutput]
) -> SampleOutput | None:
    """The stream's first output (None if it ends at once), unless the client leaves."""
    return await unless_gone(request, anext(stream, None))


async def all_outputs(
    request: Request, first: SampleOutput | None, stream: AsyncIterator[SampleOutput]
) -> list[SampleOutput]:
    """`first` and the rest of the stream, unless the client leaves."""

    async def rest() -> list[SampleOutput]:
        return [output async for output in stream]

    return ([first] if first is not None else []) + await unless_gone(request, rest())
