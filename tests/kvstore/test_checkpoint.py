"""The context-end checkpoint, driven through the normal prefill and context-end calls."""

import pytest
from kv_factories import make_manager, run_turn, tokens
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
from kvfleet.kvstore.policies import AllReusable, PerConversation

BLOCK, WINDOW, REPLAY, PROMPT = 64, 128, 256, 4096
CHECKPOINT = (PROMPT - REPLAY - 512) // BLOCK * BLOCK  # 3328
LIFE_CYCLES = [FullLifeCycle("full"), WindowLifeCycle("swa", WINDOW, replay_tokens=REPLAY)]


def manager_for(policy=None, checkpoint=True):
    return make_manager(
        LIFE_CYCLES,
        pages=256,
        block_size=BLOCK,
        policy=policy or PerConversation(2),
        checkpoint=checkpoint,
    )


@pytest.mark.parametrize("rewritten_blocks", [1, 4, 8])
def test_rewritten_tail_reuses_up_to_the_checkpoint(rewritten_blocks):
    """Without the checkpoint, a turn that rewrites its last blocks would reuse nothing."""
    manager = manager_for()
    first = tokens(1, PROMPT)
    run_turn(manager, "t1", first, "c", chunk=512)
    kept = PROMPT - rewritten_blocks * BLOCK
    manager.add_request("t2", first[:kept] + tokens(2, rewritten_blocks * BLOCK), "c")
    assert manager.match("t2").num_reusable_tokens == CHECKPOINT
    manager.finish_request("t2")
    manager.check_integrity()


def test_resent_prompt_reuses_up_to_the_checkpoint():
    """A resend cannot use the prompt-end window (R stops it), so it must find the checkpoint."""
    manager = manager_for()
    first = tokens(1, PROMPT)
    run_turn(manager, "t1", first, "c", chunk=1000)
    manager.add_request("t2", first, "c")
    assert manager.match("t2").num_reusable_tokens == CHECKPOINT
    manager.finish_request("t2")
    manager.check_integrity()


def test_appending_turn_reuses_up_to_the_prompt_end():
    """A turn that appends at least R tokens must resume at the previous prompt's end."""
    manager = manager_for()
    first = tokens(1, PROMPT)
    run_turn(manager, "t1", first, "c", chunk=512)
    manager.add_request("t2", first + tokens(2, 512), "c")
    assert manager.match("t2").num_reusable_tokens == PROMPT
    manager.finish_request("t2")
    manager.check_integrity()


def test_no_checkpoint_when_turned_off():
    """The switch must really switch: a rewritten tail then reuses nothing."""
    manager = manager_for(checkpoint=False)
    first = tokens(1, PROMPT)
    run_turn(manager, "t1", first, "c", chunk=512)
    manager.add_request("t2", first[:-BLOCK] + tokens(2, BLOCK), "c")
    assert manager.match("t2").num_reusable_tokens == 0
    manager.finish_request("t2")
    manager.check_integrity()


def test_no_checkpoint_under_all_reusable():
    """all_reusable commits every block already; a checkpoint would only double-count retention."""
    manager = manager_for(policy=AllReusable())
    first = tokens(1, PROMPT)
    manager.add_request("t1", first, "c")
    manager.admit("t1", PROMPT)
    assert manager.progress("t1").checkpoint_tokens is None
    manager.finish_request("t1")
    manager.check_integrity()


def test_no_checkpoint_when_the_reused_prefix_is_past_it():
    """Blocks before the reused prefix come from cache; committing them again is a no-op plan."""
    manager = manager_for()
    first = tokens(1, PROMPT)
    run_turn(manager, "t1", first, "c", chunk=512)
    second = first + tokens(2, 512)
    manager.add_request("t2", second, "c")
    manager.admit("t2", 512)
    progress = manager.progress("t2")
    assert progress.num_reused_tokens == PROMPT
    assert progress.checkpoint_tokens is None
    manager.finish_request("t2")
    manager.check_integrity()
