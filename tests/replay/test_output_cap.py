"""`--max-tokens`: outputs capped after the context filter, prompts untouched."""

from __future__ import annotations

from kvfleet.services.replay.model import Conversation, SubAgentSpawn, Turn
from kvfleet.services.replay.readers import cap_output_tokens, first_turns


def turn(index: int, output_tokens: int) -> Turn:
    return Turn(index, 0.0, 0.0, 128, output_tokens, (1, 2), "ns", 64)


def test_cap_reaches_sub_agents_and_keeps_prompts():
    """A cap that missed sub-agents would leave their long decodes in a bounded run."""
    child = Conversation("s/agent", "f", (turn(0, 500),))
    parent = Conversation("s", "f", (turn(0, 10), SubAgentSpawn(((1.0, child),)), turn(1, 900)))
    [capped] = cap_output_tokens([parent], 64)
    first, spawn, last = capped.steps
    assert (first.output_tokens, last.output_tokens) == (10, 64)
    assert spawn.children[0][1].steps[0].output_tokens == 64
    assert (first.input_tokens, first.hash_ids) == (128, (1, 2))


def test_first_turns_cut_parents_and_sub_agents():
    """Without the cut, one long session sets a bounded run's length while the others are done."""

    child = Conversation("s/agent", "f", (turn(0, 5), turn(1, 5), turn(2, 5)))
    parent = Conversation(
        "s", "f", (turn(0, 1), SubAgentSpawn(((1.0, child),)), turn(1, 1), turn(2, 1))
    )
    [cut] = first_turns([parent], 2)
    assert [type(step).__name__ for step in cut.steps] == ["Turn", "SubAgentSpawn", "Turn"]
    assert len(cut.steps[1].children[0][1].steps) == 2
