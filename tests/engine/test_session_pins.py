"""Through a router front with two ranks, a conversation named only by a harness's session
header, and one named by nothing at all, keep their rank turn after turn (pinned hits)."""

from __future__ import annotations

import time

import httpx
import pytest
from engine_testkit import TEST_CONFIG
from kvfleet.services.engine.api.session_identity import PrefixParts
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig

CONFIG = TEST_CONFIG.with_changes(reuse_policy="per_conversation")
SYSTEM = "You are a terse coding agent."


@pytest.fixture(scope="module")
def fleet():
    fleet = EmbeddedFleet(FleetConfig(CONFIG, num_ranks=2)).start()
    yield fleet
    fleet.stop()


def served_prompts(fleet: EmbeddedFleet) -> list[float]:
    return [rank.core.metrics.prompt_tokens_total._value.get() for rank in fleet.ranks]


def three_turns(fleet: EmbeddedFleet, opening: str, headers: dict[str, str]) -> list[int]:
    """Three chat turns; returns the cached tokens of each and asserts one rank served all."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": opening}]
    cached, ranks = [], set()
    pinned = fleet.router.metrics.pinned_hits._value.get()
    with httpx.Client(base_url=fleet.http_base_url, timeout=60) as http:
        for turn in range(3):
            before = served_prompts(fleet)
            body = {"model": "kvfleet", "messages": messages, "max_tokens": 4, "temperature": 0}
            answer = http.post("/chat/completions", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            reply = answer.json()
            after = served_prompts(fleet)
            ranks |= {i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a > b}
            cached.append(reply["usage"]["prompt_tokens_details"]["cached_tokens"])
            messages += [
                {"role": "assistant", "content": reply["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"turn {turn + 2}: go on with the next step"},
            ]
    assert len(ranks) == 1, f"the conversation moved between ranks {ranks}"
    assert fleet.router.metrics.pinned_hits._value.get() - pinned == 2
    return cached


FIX = "Fix the parser bug in the tokenizer module, please."
RENAME = "Rename every helper in the scheduler to a clearer name."
RENAME_ID = PrefixParts(None, [SYSTEM], RENAME, "|").identity()  # no tools, user or salt


@pytest.mark.parametrize(
    ("opening", "headers", "conversation"),
    [
        (FIX, {"x-claude-code-session-id": "s1"}, "s1"),
        (RENAME, {}, RENAME_ID),  # named by nothing: the prefix identity
    ],
)
def test_an_unkeyed_conversation_keeps_its_rank_and_reuses_its_turns(
    fleet, opening, headers, conversation
):
    """Without identity each turn is a new conversation: placed anew, nothing retained."""
    cached = three_turns(fleet, opening, headers)
    assert cached[2] > cached[1] > cached[0]  # the opening may be cached by an earlier case
    assert conversation in fleet.router.runtime.store.get_pins([conversation], time.time())
