"""A per-request cache salt enters the block hash: different salts never share cached blocks,
the same salt does; over the HTTP body field and through the router's gRPC field."""

from __future__ import annotations

import openai
import pytest
from engine_testkit import TEST_CONFIG, final, greedy, make_core, run_call
from kvfleet.services.engine.request.engine_request import GenerateCall
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig

PER_REQUEST = TEST_CONFIG.with_changes(reuse_policy="per_request")
PROMPT = tuple(range(5, 105))


@pytest.fixture
def core():
    core = make_core(PER_REQUEST, storage="salt")
    yield core
    core.check_integrity()
    core.stop()


def cached(core, request_id: str, salt: str) -> int:
    call = GenerateCall(request_id, PROMPT, greedy(2), cache_salt=salt)
    return final(run_call(core, call)).usage.cached_tokens


def test_different_salts_never_share_blocks_and_the_same_salt_does(core):
    """Without the salt in the hash, a guess of another tenant's prompt shows its cached
    tokens (and its timing)."""
    assert cached(core, "a1", "tenant-a") == 0
    assert cached(core, "b1", "tenant-b") == 0
    assert cached(core, "u1", "") == 0
    assert cached(core, "a2", "tenant-a") == 96
    assert cached(core, "b2", "tenant-b") == 96
    assert cached(core, "u2", "") == 96


def test_salted_outputs_equal_unsalted_ones(core):
    """The salt keys the cache only; it must never change what is generated."""
    plain = run_call(core, GenerateCall("p", PROMPT, greedy(6)))
    salted = run_call(core, GenerateCall("s", PROMPT, greedy(6), cache_salt="x"))
    assert [o.token_ids for o in plain] == [o.token_ids for o in salted]


@pytest.fixture(scope="module")
def fleet_client():
    fleet = EmbeddedFleet(FleetConfig(PER_REQUEST, num_ranks=1, redis_url=None)).start()
    with openai.OpenAI(base_url=fleet.http_base_url, api_key="x", max_retries=0) as client:
        yield client
    fleet.stop()


def test_the_salt_reaches_the_engine_through_the_router(fleet_client):
    """A salt dropped by the HTTP front or the router would share blocks across tenants."""

    def cached_tokens(salt: str) -> int:
        answer = fleet_client.completions.create(
            model="tiny", prompt=list(PROMPT), max_tokens=2, temperature=0,
            extra_body={"cache_salt": salt},
        )  # fmt: skip
        return answer.usage.prompt_tokens_details.cached_tokens

    assert cached_tokens("tenant-a") == 0
    assert cached_tokens("tenant-b") == 0
    assert cached_tokens("tenant-a") == 96
