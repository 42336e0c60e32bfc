"""The fleet's OpenAI front carries many streams at once: turns waiting at the router for a
slot must not hold up the chunks of the turn that runs (nor the reverse)."""

from __future__ import annotations

import asyncio
import time

import httpx
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig

# More waiting turns than any thread pool the front could have parked them in (asyncio's
# default executor has at most 32 threads).
WAITING = 40
CHUNKS_WHILE_WAITING = 5


def wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.01)


def body(prompt: list[int], max_tokens: int) -> dict:
    return {"model": "kvfleet", "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "min_tokens": max_tokens}  # fmt: skip


async def one_token(http: httpx.AsyncClient, first: int) -> None:
    """A one-token turn, streamed or not (it waits for the slot until the test cancels it)."""
    request = body(list(range(first, first + 40)), 1)
    if first % 2:
        await http.post("/completions", json={**request, "stream": False})
        return
    async with http.stream("POST", "/completions", json=request):
        pass


async def long_turn_beside_waiting_turns(fleet: EmbeddedFleet) -> int:
    """A turn that would run for minutes holds the only slot; once every other turn waits
    for it, a few more of its chunks must still arrive. Then every client leaves."""
    queue = fleet.router.runtime.queue
    async with httpx.AsyncClient(base_url=fleet.http_base_url, timeout=120) as http:
        chunks, waiting = 0, []
        card = (await http.get("/models")).json()["data"][0]
        longest = card["max_model_len"] - 40  # every token the context leaves
        request = http.stream("POST", "/completions", json=body(list(range(1, 40)), longest))
        async with request as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if not waiting:  # the long turn streams: now the others come
                    waiting = [
                        asyncio.create_task(one_token(http, 100 + i)) for i in range(WAITING)
                    ]
                    await asyncio.to_thread(wait_until, lambda: len(queue) >= WAITING)
                    continue
                chunks += 1
                assert len(queue) >= WAITING  # they still wait: the long turn runs on
                if chunks == CHUNKS_WHILE_WAITING:
                    break
        for turn in waiting:
            turn.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return chunks


def test_a_running_stream_flows_while_many_turns_wait_for_its_slot() -> None:
    """If this fails, the front parks a thread per waiting turn: once they fill its pool the
    running turn's chunks are not read until it ends, however long it runs."""
    # One rank with one slot: every other turn waits at the router for the running one, which
    # would take minutes (a decode step of ~0.2 s on the slowed simulated accelerator).
    engine = EngineConfig(compute_backend="sim", sim_time_scale=100.0, max_batch_size=1)
    fleet = EmbeddedFleet(FleetConfig(engine, num_ranks=1, redis_url=None)).start(timeout=60.0)
    try:
        chunks = asyncio.run(long_turn_beside_waiting_turns(fleet))
        # The clients left, streaming or not: the router forgets their waiting turns (they
        # would take the slot for nobody) and the rank its running one.
        wait_until(lambda: len(fleet.router.runtime.queue) == 0)
        wait_until(lambda: fleet.ranks[0].core.load().running == 0)
    finally:
        fleet.stop()
    assert chunks == CHUNKS_WHILE_WAITING


async def leave_a_long_unstreamed_turn(fleet: EmbeddedFleet) -> None:
    """Ask for a long answer without streaming; hang up once the rank is decoding it."""
    async with httpx.AsyncClient(base_url=fleet.http_base_url, timeout=120) as http:
        card = (await http.get("/models")).json()["data"][0]
        request = {**body(list(range(1, 40)), card["max_model_len"] - 40), "stream": False}
        turn = asyncio.create_task(http.post("/completions", json=request))
        core = fleet.ranks[0].core
        await asyncio.to_thread(wait_until, lambda: core.metrics.itl._sum.get() > 0)
        turn.cancel()
        await asyncio.gather(turn, return_exceptions=True)


def test_a_client_that_hangs_up_on_an_unstreamed_turn_frees_its_slot() -> None:
    """If this fails, an answer nobody waits for any more runs to its last token."""
    engine = EngineConfig(compute_backend="sim", sim_time_scale=100.0, max_batch_size=1)
    fleet = EmbeddedFleet(FleetConfig(engine, num_ranks=1, redis_url=None)).start(timeout=60.0)
    try:
        asyncio.run(leave_a_long_unstreamed_turn(fleet))
        wait_until(lambda: fleet.ranks[0].core.load().running == 0)
    finally:
        fleet.stop()
