"""Which resume point a moved turn's received blocks complete (`complete_blocks`).

Full attention and a window of 64 tokens (4 blocks of 16), checkpoints 32 tokens before a
prompt's end. A resume at 9 blocks (144 tokens) keeps full blocks 0..8, the endpoint window
5..8 and the checkpoint window 3..6 (checkpoint at 112 = 7 blocks).
"""

from __future__ import annotations

from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
from kvfleet.kvstore.policies import PerConversation
from kvfleet.services.disagg.prefix_pull import complete_blocks

LIFE_CYCLES = (FullLifeCycle("full"), WindowLifeCycle("window", 64))
CONFIG = KVStoreConfig(
    block_size=16,
    life_cycles=LIFE_CYCLES,
    pool_pages={"full": 32, "window": 32},
    reuse_policy=PerConversation(max_num_turns=2),
    checkpoint=True,
    checkpoint_margin_tokens=32,
)
BY_NAME = {lc.name: lc for lc in LIFE_CYCLES}


def test_every_block_a_resume_keeps_arrived():
    """The home's whole retained turn completes the resume at its end."""
    received = {"full": set(range(9)), "window": set(range(3, 9))}
    assert complete_blocks(BY_NAME, CONFIG, received, held=0) == 9


def test_a_resume_whose_checkpoint_window_did_not_come_is_not_taken():
    """Taken, its checkpoint pages would be committed without their bytes."""
    received = {"full": set(range(9)), "window": set(range(5, 9))}
    assert complete_blocks(BY_NAME, CONFIG, received, held=0) == 0


def test_blocks_the_receiver_holds_are_not_needed():
    """Past 4 held blocks, full 4..8 and window 4..8 complete the resume at 9 blocks."""
    received = {"full": set(range(4, 9)), "window": set(range(4, 9))}
    assert complete_blocks(BY_NAME, CONFIG, received, held=4) == 9


def test_a_gap_in_the_full_blocks_stops_the_resume_before_it():
    """Full attention reads every block: with block 6 missing it resumes at 6 blocks (its
    window 2..5 is held or arrived; no checkpoint past the held 64 tokens)."""
    received = {"full": {4, 5, 7, 8}, "window": set(range(4, 9))}
    assert complete_blocks(BY_NAME, CONFIG, received, held=4) == 6
