"""A client's cache TTL reaches the rank that retains its turn: Anthropic `cache_control.ttl`
and OpenAI `prompt_cache_retention` through the router front (the real SDKs), the router's
gRPC and the engine's; a TTL past a day is refused by name."""

from __future__ import annotations

import time

import anthropic
import grpc
import openai
import pytest
from engine_testkit import TEST_CONFIG
from kvfleet.proto import common_pb2, router_pb2, router_pb2_grpc
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig

CONFIG = TEST_CONFIG.with_changes(reuse_policy="per_conversation")
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def fleet():
    fleet = EmbeddedFleet(FleetConfig(CONFIG, num_ranks=1)).start()
    yield fleet
    fleet.stop()


def seconds_kept(fleet: EmbeddedFleet, conversation: str) -> float | None:
    """How much longer the rank keeps the conversation's turns from release (None: no TTL)."""
    (rank,) = fleet.ranks
    until = rank.core.scheduler.retained.kept_until(conversation)
    return None if until is None else until - time.monotonic()


@pytest.mark.parametrize(("ttl", "seconds"), [("1h", 3600), ("5m", 300), (None, None)])
def test_an_anthropic_breakpoint_ttl_keeps_the_turn_that_long(fleet, ttl, seconds):
    client = anthropic.Anthropic(
        base_url=fleet.http_base_url.removesuffix("/v1"), api_key="any", max_retries=0
    )
    mark = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    system = [{"type": "text", "text": "You are a terse coding agent. " * 3, "cache_control": mark}]
    conversation = f"ttl-{ttl}"
    client.messages.create(
        model="kvfleet",
        system=system if ttl else system[0]["text"],
        messages=[{"role": "user", "content": "Fix the parser bug, please."}],
        max_tokens=2,
        extra_body=GREEDY,
        extra_headers={"x-claude-code-session-id": conversation},
    )
    kept = seconds_kept(fleet, conversation)
    if seconds is None:
        assert kept is None
    else:
        assert seconds - 120 < kept <= seconds  # set at the context end, moments ago


@pytest.mark.parametrize(("retention", "seconds"), [("24h", 86400), ("in_memory", 300)])
def test_openai_prompt_cache_retention_keeps_the_turn_that_long(fleet, retention, seconds):
    client = openai.OpenAI(base_url=fleet.http_base_url, api_key="any", max_retries=0)
    conversation = f"retention-{retention}"
    client.chat.completions.create(
        model="kvfleet",
        messages=[{"role": "user", "content": "Rename the helpers, please. " * 3}],
        max_tokens=2,
        temperature=0,
        prompt_cache_key=conversation,
        extra_body={"prompt_cache_retention": retention},
    )
    kept = seconds_kept(fleet, conversation)
    assert kept is not None and seconds - 120 < kept <= seconds


def test_a_ttl_past_a_day_is_invalid_argument_naming_the_field(fleet):
    with grpc.insecure_channel(fleet.router_address) as channel:
        request = router_pb2.GenerateRequest(
            prompt_token_ids=common_pb2.TokenIds(ids=list(range(40))),
            max_tokens=1,
            retention_seconds=86401,
        )
        with pytest.raises(grpc.RpcError) as error:
            list(router_pb2_grpc.RouterStub(channel).Generate(request, timeout=30))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "retention_seconds" in error.value.details()
