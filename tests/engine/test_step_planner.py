"""The shared step rule (`StepPlanner`, `RetainedConversations`) through the engine's Scheduler.

The simulator's rank runs the same rule (`services/replay/sim_rank.py`); its regression digest
and pressure tests cover the simulator side.
"""

import time

from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import PerConversation, PerRequest
from kvfleet.services.core.retained_order import RetainedConversations
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.core.scheduler import Scheduler
from kvfleet.services.engine.request.engine_request import GenerateCall
from kvfleet.services.engine.request.sequence import Sequence

BLOCK = 4
USABLE_PAGES = 8


def make_manager(policy=None, clock=time.monotonic) -> KVCacheManager:
    """One full-attention pool of 8 usable pages of 4 tokens (plus the null page), on `clock`."""
    config = KVStoreConfig(
        block_size=BLOCK,
        life_cycles=(FullLifeCycle("full"),),
        pool_pages={"full": USABLE_PAGES + 1},
        reuse_policy=policy or PerRequest(),
        checkpoint=False,
    )
    manager = KVCacheManager(config, lambda event: None, clock=clock)
    assert manager.pools["full"].num_usable == USABLE_PAGES
    return manager


def make_sequence(
    name: str, first_token: int, length: int, conversation=None, retention_seconds=0
) -> Sequence:
    """A sequence whose prompt is `length` consecutive token ids from `first_token`."""
    prompt = tuple(range(first_token, first_token + length))
    call = GenerateCall(
        name, prompt, SamplingParams(), conversation, retention_seconds=retention_seconds
    )
    return Sequence(f"{name}#0", call, 0, call.sampling, None, 0.0)


def add_sequences(scheduler: Scheduler, *lengths: tuple[str, int]) -> list[Sequence]:
    """Queue one sequence per (name, prompt length), with prompts that share no block."""
    sequences = [
        make_sequence(name, 100 * index, length) for index, (name, length) in enumerate(lengths)
    ]
    for sequence in sequences:
        scheduler.add(sequence)
    return sequences


def run_chunks(scheduler: Scheduler, chunks) -> None:
    """What the engine core does after a step: commit, end contexts, sample one token each."""
    for chunk in chunks:
        sequence = chunk.sequence
        scheduler.manager.commit(sequence.key, chunk.start + chunk.count)
        if chunk.samples:
            if not sequence.context_done:
                scheduler.context_ended(sequence)
            sequence.output.append(7)


def test_admission_is_first_come_first_served():
    """A later small request must not overtake a head that does not fit (starvation)."""
    scheduler = Scheduler(make_manager(), max_batch_size=4, token_budget=64)
    _, blocked, small = add_sequences(scheduler, ("big", 24), ("blocked", 16), ("small", 4))
    chunks = scheduler.schedule()
    assert [(c.sequence.key, c.start, c.count) for c in chunks] == [("big#0", 0, 24)]
    assert list(scheduler.waiting) == [blocked, small]
    scheduler.manager.check_integrity()


def test_pressure_releases_the_oldest_retained_conversation_before_preempting():
    """Preempting while retained turns hold pages would recompute work the LRU could give."""
    scheduler = Scheduler(make_manager(PerConversation(max_num_turns=1)), 4, 64)
    old, newer = make_sequence("old", 0, 8, "c-old"), make_sequence("newer", 100, 8, "c-new")
    for sequence in (old, newer):
        scheduler.add(sequence)
        run_chunks(scheduler, scheduler.schedule())
        scheduler.remove(sequence)
    assert list(scheduler.retained) == ["c-old", "c-new"]
    assert scheduler.retained_pages() == 4
    grower = make_sequence("grower", 200, 24)
    scheduler.add(grower)
    chunks = scheduler.schedule()
    assert [(c.sequence.key, c.count) for c in chunks] == [("grower#0", 24)]
    assert (scheduler.retained.released, scheduler.preemptions) == (1, 0)
    assert list(scheduler.retained) == ["c-new"]
    scheduler.manager.check_integrity()


def test_pressure_preempts_the_newest_running_sequence_with_its_output():
    """A wrong victim or a lost output would break recompute-by-preemption."""
    scheduler = Scheduler(make_manager(), max_batch_size=4, token_budget=64)
    oldest, middle, newest = add_sequences(scheduler, ("oldest", 12), ("middle", 8), ("newest", 12))
    run_chunks(scheduler, scheduler.schedule())
    chunks = scheduler.schedule()
    assert [(c.sequence.key, c.start, c.count) for c in chunks] == [
        ("oldest#0", 12, 1),
        ("middle#0", 8, 1),
    ]
    assert scheduler.preemptions == 1
    assert scheduler.running == [oldest, middle]
    assert list(scheduler.waiting) == [newest]
    assert (newest.kv_prompt_len, newest.admitted, newest.retain) == (13, False, False)
    scheduler.manager.check_integrity()


def test_a_sequence_planned_this_step_is_never_preempted():
    """Preempting a planned sequence would free pages its chunk is about to use."""
    scheduler = Scheduler(make_manager(), max_batch_size=4, token_budget=64)
    planned, short = add_sequences(scheduler, ("planned", 15), ("short", 16))
    run_chunks(scheduler, scheduler.schedule())
    chunks = scheduler.schedule()
    assert [c.sequence.key for c in chunks] == ["planned#0"]
    assert scheduler.preemptions == 0
    assert scheduler.running == [planned, short]
    scheduler.manager.check_integrity()


def test_a_returning_conversation_moves_to_the_back_of_the_release_order():
    """Releasing a conversation that just came back would throw away its freshest prefix."""
    manager = make_manager(PerConversation(max_num_turns=2))
    retained = RetainedConversations(manager)
    prompts = {"a": (0, 8), "b": (100, 8)}
    for turn, conversation in enumerate(("a", "b", "a")):
        first, length = prompts[conversation]
        key = f"{conversation}-{turn}"
        prompt = list(range(first, first + length + turn))
        manager.add_request(key, prompt, conversation)
        manager.admit(key, len(prompt) - manager.match(key).num_reusable_tokens)
        manager.commit(key, len(prompt))
        retained.context_ended(key, conversation)
        manager.finish_request(key)
    assert list(retained) == ["b", "a"]
    assert retained.release_until(lambda: retained.released == 1)
    assert list(retained) == ["a"]
    manager.check_integrity()


def test_a_conversation_with_a_request_on_the_rank_is_released_last():
    """On a saturated rank the returning conversation is the one whose context ended longest
    ago: releasing it first hands the prefix its waiting turn is about to reuse to eviction
    (per_conversation then reused less than plain LRU on the load shape)."""
    manager = make_manager(PerConversation(max_num_turns=2))
    waiting = ["a"]
    retained = RetainedConversations(manager, lambda: waiting)
    for conversation, first in (("a", 0), ("b", 100), ("c", 200)):
        prompt = list(range(first, first + 8))
        manager.add_request(conversation, prompt, conversation)
        manager.admit(conversation, len(prompt))
        manager.commit(conversation, len(prompt))
        retained.context_ended(conversation, conversation)
        manager.finish_request(conversation)
    assert list(retained) == ["a", "b", "c"]
    assert retained.release_until(lambda: retained.released == 2)
    assert list(retained) == ["a"] and manager.retained_turns("a")
    waiting.clear()
    assert retained.release_until(lambda: retained.released == 3)
    assert not list(retained)
    manager.check_integrity()


def test_pressure_takes_every_branch_record_before_any_turn():
    """A branch record serves a reset; a turn serves the conversation's next turn: releasing
    the oldest conversation first would trade the likely reuse for the unlikely one."""
    config = KVStoreConfig(
        block_size=BLOCK,
        life_cycles=(FullLifeCycle("full"), WindowLifeCycle("win", 8)),
        pool_pages={"full": 64, "win": 64},
        reuse_policy=PerConversation(max_num_turns=2, keep_branch_points=1),
        checkpoint=False,
        checkpoint_margin_tokens=4,
    )
    manager = KVCacheManager(config, lambda event: None)
    retained = RetainedConversations(manager)
    for conversation, first in (("old", 0), ("new", 100)):
        prompt = list(range(first, first + 40))
        manager.add_request(conversation, prompt, conversation, branch_hints=(16,))
        manager.admit(conversation, len(prompt))
        manager.commit(conversation, len(prompt))
        retained.context_ended(conversation, conversation)
        manager.finish_request(conversation)

    def branch_records() -> int:
        return sum(r.branch_tokens is not None for c in retained for r in manager.retained_turns(c))

    assert branch_records() == 2
    assert retained.release_until(lambda: branch_records() == 0)
    assert retained.released == 0 and list(retained) == ["old", "new"]
    assert all(manager.retained_turns(c) for c in ("old", "new"))
    manager.check_integrity()


def run_turn(scheduler: Scheduler, sequence: Sequence) -> None:
    """Serve one sequence's prompt and a token, then let it go (its turn stays retained)."""
    scheduler.add(sequence)
    chunks = scheduler.plan_step()
    assert [chunk.sequence for chunk in chunks] == [sequence]
    run_chunks(scheduler, chunks)
    scheduler.remove(sequence)


def reusable_tokens(manager: KVCacheManager, prompt: list[int]) -> int:
    """How much of `prompt` the cache would serve now (the probe leaves nothing behind)."""
    manager.add_request("probe", prompt, None)
    try:
        return manager.match("probe").num_reusable_tokens
    finally:
        manager.finish_request("probe")


def test_a_cache_ttl_keeps_a_conversation_past_a_squeeze_and_releases_it_after():
    """A client's cache TTL (Anthropic `cache_control.ttl`, OpenAI `prompt_cache_retention`)
    keeps its conversation's turns past memory pressure that releases older-TTL-less ones
    first; refreshed by the next turn; once it runs out the conversation goes by age again."""
    now = [0.0]
    manager = make_manager(PerConversation(max_num_turns=1), clock=lambda: now[0])
    scheduler = Scheduler(manager, max_batch_size=4, token_budget=64)
    run_turn(scheduler, make_sequence("kept-1", 0, 8, "kept", retention_seconds=300))
    now[0] = 200.0  # its next turn refreshes the TTL to 500 s
    run_turn(scheduler, make_sequence("kept-2", 0, 9, "kept", retention_seconds=300))
    run_turn(scheduler, make_sequence("plain", 100, 8, "plain"))  # newer, but no TTL
    now[0] = 450.0
    run_turn(scheduler, make_sequence("squeeze-1", 200, 24))  # 6 pages: one must go
    assert manager.retained_turns("kept") and not manager.retained_turns("plain")
    assert reusable_tokens(manager, list(range(0, 12))) == 8  # still served from the cache
    now[0] = 501.0  # the TTL ran out: the next squeeze releases it like any other
    run_turn(scheduler, make_sequence("squeeze-2", 300, 32))  # every page
    assert not manager.retained_turns("kept")
    assert scheduler.retained.released == 2 and scheduler.retained.released_early == 0
    manager.check_integrity()


def test_a_cache_ttl_gives_way_when_nothing_else_can_make_room():
    """Inside its TTL a conversation is released last, yet released: a request on the rank
    must never wait for ever behind an idle cache."""
    manager = make_manager(PerConversation(max_num_turns=1), clock=lambda: 0.0)
    scheduler = Scheduler(manager, max_batch_size=4, token_budget=64)
    run_turn(scheduler, make_sequence("kept", 0, 8, "kept", retention_seconds=3600))
    run_turn(scheduler, make_sequence("plain", 100, 8, "plain"))
    run_turn(scheduler, make_sequence("squeeze", 200, 32))  # every page
    assert not manager.retained_turns("kept") and not manager.retained_turns("plain")
    assert scheduler.retained.released == 2 and scheduler.retained.released_early == 1
    manager.check_integrity()


class OneByOne(Scheduler):
    """The scheduler without its whole-batch decode plan."""

    def _grow_all(self, budget):
        return None


class Counted(Scheduler):
    """The scheduler recording, per step, whether its whole-batch decode plan answered."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.shortcut_steps: list[bool] = []

    def _grow_all(self, budget):
        chunks = super()._grow_all(budget)
        self.shortcut_steps.append(chunks is not None)
        return chunks


def plan_run(kind, steps: int):
    """Each step's chunks, and whether the step was a whole-batch decode by the one-by-one
    rule, for a 20-token prompt prefilled in chunks (budget 8) beside two decoding sequences,
    under page pressure (8 pages of 4 tokens), one sequence finishing midway."""
    scheduler = kind(make_manager(), max_batch_size=4, token_budget=8)
    sequences = add_sequences(scheduler, ("a", 5), ("b", 3), ("long", 20))
    manager = scheduler.manager
    plan, decode_steps = [], []
    for step in range(steps):
        running = list(scheduler.running)
        left = [s.num_tokens - manager.progress(s.key).num_computed_tokens for s in running]
        preemptions = scheduler.preemptions
        chunks = scheduler.schedule()
        plan.append([(c.sequence.key, c.start, c.new_tokens, dict(c.page_ids)) for c in chunks])
        counts = {c.sequence.key: c.count for c in chunks}
        # The shortcut's case: every running sequence has one token left and gets it without
        # a preemption (so they all fit together).
        decode_steps.append(
            bool(running)
            and all(n == 1 for n in left)
            and scheduler.preemptions == preemptions
            and all(counts.get(s.key) == 1 for s in running)
        )
        run_chunks(scheduler, chunks)
        if step == 9:
            scheduler.remove(sequences[1])
    return scheduler, plan, decode_steps


def test_whole_batch_decode_plans_what_one_by_one_plans():
    """Same steps, chunks, pages and preemptions with and without the one-call decode plan,
    through a chunked prefill beside decodes, page pressure and a finished sequence; and the
    plan is taken in exactly the steps where every running sequence decodes and fits (a
    shortcut that never answers would plan the same, only slower)."""
    general, general_plan, decode_steps = plan_run(OneByOne, 24)
    fast, fast_plan, _ = plan_run(Counted, 24)
    assert fast_plan == general_plan
    assert fast.preemptions == general.preemptions > 0  # the pressure path ran too

    def continued_prefill_beside_decodes(step) -> bool:
        sizes = {key: (start, len(new)) for key, start, new, _ in step}
        start, count = sizes.get("long#0", (0, 0))
        return start > 0 and count > 1 and any(n == 1 for _, n in sizes.values())

    assert any(map(continued_prefill_beside_decodes, general_plan))
    assert fast.shortcut_steps == decode_steps
    assert 3 <= sum(decode_steps) < len(decode_steps)
