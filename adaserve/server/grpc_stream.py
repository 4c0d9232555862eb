"""How a `ModelStreamInfer` call is answered: every request runs as it arrives, and its answer is written when it
is done, in the order requests finish (a client matches them by `id`), with at most `STREAM_WINDOW` read ahead of
the answers the client has taken.

One loop for both frontends: the servicer answers each request itself (`InferenceServicer.ModelStreamInfer`), the
gRPC frontend's process relays each to the engine (`server/grpc_frontend.py`). It imports neither.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

#: Requests of one `ModelStreamInfer` call read and not yet answered to the client: past it the call reads no more
#: until an answer is sent, so a client that never reads holds a bounded amount of the server's memory (unbounded,
#: 1.5 KB an answer piled up: 115 to 374 MB in 60 s).
STREAM_WINDOW = 64


async def stream_answers(requests: AsyncIterable[Any], answer: Callable[[Any], Awaitable[Any]]) -> AsyncIterator[Any]:
    """The answers to `requests`, each `answer(request)` as it finishes. An `answer` that raises ends the stream
    with its error (the servicer's answer a request's failure instead; a relay fails only when the whole call
    does); so does a failed read, once the requests read before it are answered."""
    answers: asyncio.Queue[Any] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()
    room = asyncio.Semaphore(STREAM_WINDOW)  # taken by each request read, given back as its answer is sent
    end = object()

    async def run(request: Any) -> None:
        try:
            answers.put_nowait(await answer(request))
        except Exception as exc:
            answers.put_nowait(exc)

    async def read() -> None:
        try:
            async for request in requests:
                await room.acquire()  # past the window, read no more: the client's sends wait (flow control)
                task = asyncio.create_task(run(request))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.wait(set(running))
        finally:
            answers.put_nowait(end)  # the end of the answers, also when reading failed

    reader = asyncio.create_task(read())
    try:
        while (response := await answers.get()) is not end:
            if isinstance(response, Exception):
                raise response
            yield response  # returns once gRPC has taken it, as far as the client's flow control lets it
            room.release()
        await reader  # a failed read ends the call with its error
    finally:
        reader.cancel()  # the client went away: what has not started is taken back (engine.infer)
        for task in running:
            task.cancel()
