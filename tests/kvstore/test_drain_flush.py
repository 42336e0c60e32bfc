"""A draining rank writes its retained turns' blocks to the shared disk, keeping them on device.

Each turn "a" is 4 blocks of BLOCK tokens under per_conversation; at its context end it retains
what a resume at its prompt end needs: full blocks 0..3, window blocks 2..3 (window of two
blocks) and the state snapshot after block 3, i.e. 4 + 2 + 1 = 7 blocks.
"""

from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.life_cycles import FullLifeCycle, StateLifeCycle, WindowLifeCycle
from kvfleet.kvstore.policies import PerConversation
from tier_factories import BLOCK, make_tiered, prompt_of, serve

LIFE_CYCLES = (
    FullLifeCycle("full"),
    WindowLifeCycle("swa", window_tokens=2 * BLOCK),
    StateLifeCycle("ssm", every_tokens=0),
)
RETAINED_PER_TURN = {"full": 4, "swa": 2, "ssm": 1}
# Turn 2 of conversation "a": turn 1's prompt and one more block; it can reuse all of turn 1.
TURN_TWO = prompt_of(1) + prompt_of(9, BLOCK)


def _rank(disk_dir: str = "tmp", disk_pages: int = 64, device_pages: int = 16):
    """A rank under per_conversation(2) with no host tier: blocks reach disk only by a flush."""
    return make_tiered(
        LIFE_CYCLES,
        device_pages=device_pages,
        host_pages=0,
        disk_pages=disk_pages,
        disk_dir=disk_dir,
        policy=PerConversation(max_num_turns=2),
    )


def _files(manager) -> dict[str, int]:
    """Block files per life cycle in the manager's disk folder."""
    root = manager.tiers.disk.files.root
    return {name: len(list((root / name).rglob("*.kvb"))) for name in manager.life_cycles}


def _close(*managers) -> None:
    for manager in managers:
        manager.check_integrity()
        manager.tiers.close()


def test_flush_writes_each_retained_block_once():
    """A drain that missed a retained block, or wrote one twice, would lose or waste a resume."""
    rank = _rank()
    serve(rank, "a1", prompt_of(1), conversation_id="a")
    assert rank.num_retained_off_disk() == 7
    assert rank.flush_retained_to_disk() == 7
    assert _files(rank) == RETAINED_PER_TURN
    assert rank.num_retained_off_disk() == 0
    assert rank.flush_retained_to_disk() == 0
    assert rank.tiers.metrics["disk"].pages_in == 7
    _close(rank)


def test_flushed_blocks_stay_on_the_device_and_retained():
    """The draining rank still serves its pinned turns: a flush must not evict or release."""
    rank = _rank()
    serve(rank, "a1", prompt_of(1), conversation_id="a")
    retained = rank.retained_turns("a")
    rank.flush_retained_to_disk()
    assert rank.retained_turns("a") == retained
    rank.add_request("probe", TURN_TWO)
    assert rank.match("probe").locations == {
        "full": ("device",) * 4,
        "swa": ("", "", "device", "device"),
        "ssm": ("", "", "", "device"),
    }
    rank.finish_request("probe")
    assert serve(rank, "a2", TURN_TWO, conversation_id="a") == 4 * BLOCK
    assert rank.tiers.metrics["disk"].hits == 0
    _close(rank)


def test_a_fresh_rank_on_the_same_disk_resumes_the_flushed_prefix():
    """Without the flush the conversation's next turn on another rank would recompute it all."""
    draining = _rank()
    serve(draining, "a1", prompt_of(1), conversation_id="a")
    draining.flush_retained_to_disk()
    other = _rank(disk_dir=str(draining.tiers.disk.files.root))
    other.add_request("probe", TURN_TWO)
    assert other.match("probe").locations == {
        "full": ("disk",) * 4,
        "swa": ("", "", "disk", "disk"),
        "ssm": ("", "", "", "disk"),
    }
    other.finish_request("probe")
    # serve() checks that every reused page holds its block's exact bytes.
    assert serve(other, "a2", TURN_TWO, conversation_id="a") == 4 * BLOCK
    assert other.tiers.metrics["disk"].hits == 7
    _close(draining, other)


def test_without_a_flush_a_fresh_rank_reuses_nothing():
    """The control: retained blocks reach the shared disk only through the flush."""
    draining = _rank()
    serve(draining, "a1", prompt_of(1), conversation_id="a")
    other = _rank(disk_dir=str(draining.tiers.disk.files.root))
    assert serve(other, "a2", TURN_TWO, conversation_id="a") == 0
    _close(draining, other)


def test_flush_skips_blocks_already_on_disk():
    """Rewriting shared-prefix blocks would cost a drain disk bandwidth for nothing."""
    rank = _rank()
    serve(rank, "a1", prompt_of(1), conversation_id="a")
    rank.flush_retained_to_disk()
    # "b" shares a's first two blocks: only its full blocks 2..3, windows and snapshot are new.
    serve(rank, "b1", prompt_of(1)[: 2 * BLOCK] + prompt_of(2)[: 2 * BLOCK], conversation_id="b")
    assert rank.num_retained_off_disk("b") == 2 + 2 + 1
    assert rank.flush_retained_to_disk() == 5
    _close(rank)


def test_flush_of_one_conversation_leaves_the_others():
    """A context end while draining flushes its own conversation, not the whole rank again."""
    rank = _rank()
    serve(rank, "a1", prompt_of(1), conversation_id="a")
    serve(rank, "b1", prompt_of(2), conversation_id="b")
    assert rank.flush_retained_to_disk("a") == 7
    assert rank.num_retained_off_disk("b") == 7
    assert rank.num_retained_off_disk() == 7
    assert rank.flush_retained_to_disk("unknown") == 0
    _close(rank)


def test_flush_writes_the_newest_turn_prefix_first_within_capacity():
    """Past the disk capacity a flush must keep a resumable prefix, not evict its own writes."""
    rank = _rank(disk_pages=3)
    serve(rank, "a1", prompt_of(1), conversation_id="a")
    assert rank.flush_retained_to_disk() == 3 + 2 + 1
    hashes = block_hashes(prompt_of(1), BLOCK)
    assert rank.tiers.disk.index.hashes("full") == hashes[:3]
    assert _files(rank) == {"full": 3, "swa": 2, "ssm": 1}
    _close(rank)


def test_flush_without_a_disk_tier_writes_nothing():
    """A rank with no shared disk must drain without error (its prefixes are simply lost)."""
    rank = _rank(disk_dir=None)
    serve(rank, "a1", prompt_of(1), conversation_id="a")
    assert rank.num_retained_off_disk() == 0
    assert rank.flush_retained_to_disk() == 0
    _close(rank)
