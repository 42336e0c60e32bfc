"""Turns that leave their home keep their KV: a real router (pins in the shared Redis) in front
of real tiny-model ranks on loopback.

Turn 1 of a conversation (150 tokens) runs on rank `home`, which retains 9 full blocks and 6
window blocks (pages of 16); turn 2 resends it with 8 output and 37 new tokens, so a rank
that resumes it reuses 144 tokens.

- Wait bound: another router replica holds every slot of `home` (a reservation in Redis), so
  turn 2 waits, outlives a 0.3 s bound and is placed on `new`. With `migrate_kv` the router
  names the home and `new` pulls its blocks; off, `new` recomputes them. Greedy tokens agree.
- Scale-in: `home` drains and leaves (SIGTERM's path); its retained turns reach the shared disk
  folder both ranks use, and turn 2 on the survivor resumes from there.
"""

from __future__ import annotations

import random
import time
import uuid

import pytest
import redis
from disagg_kit import (
    CONFIG,
    metric,
    reference_tokens,
    router_generate,
    start_rank,
    tokens,
)
from kvfleet.services.router.admission import AdmissionConfig
from kvfleet.services.router.redis_store import RedisStore
from kvfleet.services.router.server import RouterConfig, create_server

REDIS_URL = "redis://127.0.0.1:6379/0"
RESUMED_TOKENS = 9 * 16
SLOTS = CONFIG.max_batch_size


@pytest.fixture
def prefix():
    name = f"test-moves-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(REDIS_URL)
    RedisStore(client, name).clear()
    client.close()


def _router(prefix: str, migrate_kv: bool):
    config = RouterConfig(
        admission=AdmissionConfig(max_wait_seconds=0.3),
        redis_url=REDIS_URL,
        redis_prefix=prefix,
        migrate_kv=migrate_kv,
    )
    server, port = create_server("127.0.0.1:0", config)
    return server, f"127.0.0.1:{port}"


def _turns(seed: int, router: str, conversation: str) -> list[int]:
    """Turn 1 on rank `home` (named); turn 2's prompt."""
    rng = random.Random(seed)
    first = [rng.randrange(256) for _ in range(150)]
    responses = router_generate(router, conversation, first, rank_id="home")
    assert responses[0].rank_id == "home"
    return first + tokens(responses) + [rng.randrange(256) for _ in range(37)]


@pytest.mark.parametrize("migrate_kv", [True, False])
def test_a_turn_past_its_wait_bound_pulls_its_prefix_from_the_home(prefix, migrate_kv):
    """Moving with the KV off, the moved turn recomputes its 144-token prefix; on, it reuses
    the home's blocks and decodes the same tokens."""
    router, address = _router(prefix, migrate_kv)
    ranks = [start_rank("both", address, name) for name in ("home", "new")]
    blocker = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, owner="other-replica")
    try:
        second = _turns(1, address, "c1")
        blocker.renew_lease(600)
        assert blocker.try_admit("home", "blocker", SLOTS, "", 600, time.time())
        responses = router_generate(address, "c1", second)
        blocker.release("home", "blocker")
        assert (responses[0].rank_id, responses[0].placement) == ("new", "fallback")
        cached = responses[-1].chunk.usage.cached_tokens
        assert cached == (RESUMED_TOKENS if migrate_kv else 0)
        moves = router.metrics.registry.get_sample_value("kvfleet_router_kv_moves_total")
        assert moves == (1 if migrate_kv else 0)
        assert tokens(responses) == reference_tokens(second)
        for rank in ranks:
            rank.core.check_integrity()
    finally:
        blocker.client.close()
        for rank in ranks:
            rank.stop(grace=0)
        router.stop(grace=0)


def test_a_drained_ranks_conversation_resumes_on_a_survivor_from_the_disk(prefix, tmp_path):
    """Without the drain's flush to the shared disk the survivor recomputes the whole prefix."""
    router, address = _router(prefix, migrate_kv=True)
    disk = {"disk_tier_dir": str(tmp_path), "disk_kv_pages": 256}
    home, survivor = (start_rank("both", address, name, **disk) for name in ("home", "survivor"))
    try:
        second = _turns(2, address, "c2")
        home.drain_and_stop(30.0)
        assert metric(home, "kvfleet_engine_drain_flushed_blocks_total") == 9 + 6
        responses = router_generate(address, "c2", second)
        assert responses[0].rank_id == "survivor"
        assert responses[-1].chunk.usage.cached_tokens == RESUMED_TOKENS
        assert tokens(responses) == reference_tokens(second)
        survivor.core.check_integrity()
    finally:
        for rank in (home, survivor):
            rank.stop(grace=0)
        router.stop(grace=0)
