"""Why a turn reused less than the oracle: a tracer over a simulated fleet's kvstores.

It wraps (on the instances of one `SimTarget`, never the classes) each rank's manager calls,
pools and host index, and remembers per (rank, life cycle, block) where the block last went:
committed, made evictable (by which call: a request's end, a conversation released under
memory pressure, a turn falling out of its retained turns, a window sliding out, a prefetch or
pull hold given back), dropped by
a drop plan, evicted from GPU to host, evicted from host. At a request's first admission it
finds the prefix the oracle would reuse (blocks seen in any earlier prompt, capped like the
match is), and when the rank's match is shorter it names the first block that stops it and
that block's last fate there: the loss's reason.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from kvfleet.kvstore import retention
from kvfleet.services.replay.sim_target import SimTarget

NO_REUSE = 0.02  # the measures' "no reuse": under 2 % of the prompt

# The kvstore call that made a page evictable (or dropped it), by the manager call in flight.
_OPS: list[str] = []


def _push(op: str):
    def wrap(call):
        def run(*args, **kwargs):
            _OPS.append(op)
            try:
                return call(*args, **kwargs)
            finally:
                _OPS.pop()

        return run

    return wrap


def _op() -> str:
    return _OPS[-1] if _OPS else "other"


_drop_turn = retention.drop_turn


@dataclass
class Loss:
    """One request's shortfall against the oracle."""

    conversation_id: str
    turn_index: int
    prompt_tokens: int
    reused_tokens: int
    oracle_tokens: int  # capped like the match (what the rank could at best reuse)
    uncapped_tokens: int
    reason: str
    previous_prompt_tokens: int  # the conversation's previous turn (0 for its first)


@dataclass
class LossTracer:
    """Attach to a target before its replay; `losses` holds one entry per admitted request."""

    target: SimTarget
    losses: list[Loss] = field(default_factory=list)
    _seen: set[int] = field(default_factory=set)
    _committed: dict[tuple[str, str], set[int]] = field(default_factory=lambda: defaultdict(set))
    _anywhere: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    _made_evictable: dict[tuple[str, str, int], str] = field(default_factory=dict)
    _fate: dict[tuple[str, str, int], str] = field(default_factory=dict)
    _admitted: set[str] = field(default_factory=set)
    _turns: Counter = field(default_factory=Counter)
    _last_rank: dict[str, str] = field(default_factory=dict)
    _last_prompt: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        # NOTE: a module function the retention helpers call by name: labels pages a turn
        # gives back when it falls out of its conversation's retained turns.
        retention.drop_turn = _push("fell out of retained turns")(_drop_turn)
        for rank_id, rank in self.target.fleet.ranks.items():
            self._wrap_rank(rank_id, rank)

    def close(self) -> None:
        retention.drop_turn = _drop_turn

    # -- wrapping ----------------------------------------------------------------------------

    def _wrap_rank(self, rank_id: str, rank: Any) -> None:
        manager = rank.manager
        manager.release_conversation = _push("released under pressure")(
            manager.release_conversation
        )
        manager.release_branch_records = _push("branch records released")(
            manager.release_branch_records
        )
        finish = manager.finish_request

        def finish_request(request_id: str) -> None:
            hold = request_id.startswith(("hold-", "import-"))  # sim_holds.py's ids
            _push("hold given back" if hold else "request end")(finish)(request_id)

        manager.finish_request = finish_request
        manager.commit = _push("slid out")(manager.commit)
        admit = manager.admit

        def first_admit(request_id: str, num_new_tokens: int):
            if request_id not in self._admitted:
                self._admitted.add(request_id)
                self._explain(rank_id, manager, request_id)
            return admit(request_id, num_new_tokens)

        manager.admit = first_admit
        for name, pool in manager.pools.items():
            self._wrap_pool(rank_id, name, pool, manager)
        host = manager.tiers.host
        insert = host.insert

        def host_insert(life_cycle: str, block_hash: int):
            slot, evicted = insert(life_cycle, block_hash)
            for old_hash, _ in evicted:
                key = (rank_id, life_cycle, old_hash)
                if manager.pools[life_cycle].lookup(old_hash) is None:
                    how = self._made_evictable.get(key, "?")
                    self._fate[key] = f"evicted GPU and host (evictable at {how})"
            if slot is None:
                key = (rank_id, life_cycle, block_hash)
                self._fate[key] = "evicted GPU, host full of pinned blocks"
            return slot, evicted

        host.insert = host_insert

    def _wrap_pool(self, rank_id: str, name: str, pool: Any, manager: Any) -> None:
        commit, release, drop, on_evict = pool.commit, pool.release, pool.drop, pool._on_evict

        def traced_commit(page: int, block_hash: int) -> bool:
            done = commit(page, block_hash)
            if done:
                self._committed[(rank_id, name)].add(block_hash)
                self._anywhere[name].add(block_hash)
                self._fate.pop((rank_id, name, block_hash), None)
            return done

        def traced_release(page: int) -> None:
            release(page)
            if pool.is_evictable(page):
                self._made_evictable[(rank_id, name, pool.page_hash(page))] = _op()

        def traced_drop(page: int) -> None:
            block_hash = pool.page_hash(page)
            drop(page)
            if manager.tiers.host.lookup(name, block_hash) is None:
                self._fate[(rank_id, name, block_hash)] = f"dropped ({_op()})"

        def traced_evict(page: int, block_hash: int) -> None:
            on_evict(page, block_hash)
            if not manager.tiers.host.capacity.get(name):
                how = self._made_evictable.get((rank_id, name, block_hash), "?")
                self._fate[(rank_id, name, block_hash)] = f"evicted GPU, no host (at {how})"

        pool.commit, pool.release, pool.drop, pool._on_evict = (
            traced_commit,
            traced_release,
            traced_drop,
            traced_evict,
        )

    # -- the explanation ---------------------------------------------------------------------

    def _explain(self, rank_id: str, manager: Any, request_id: str) -> None:
        state = manager._state(request_id)
        conversation = state.conversation_id or ""
        hashes = state.sequence.hashes
        block_size = manager.config.block_size
        seen = [h in self._seen for h in hashes]
        oracle = seen.index(False) if False in seen else len(hashes)
        cap = max(0, state.prompt_len - max(1, manager.config.max_replay_tokens)) // block_size
        k = min(oracle, cap)
        reused = manager.match(request_id).num_reusable_blocks
        turn = self._turns[conversation]
        self._turns[conversation] += 1
        reason = "" if reused >= k else self._why(rank_id, manager, hashes, k, conversation, turn)
        tokens = (reused * block_size, k * block_size, oracle * block_size)
        previous = self._last_prompt[conversation]
        self.losses.append(Loss(conversation, turn, state.prompt_len, *tokens, reason, previous))
        self._last_prompt[conversation] = state.prompt_len
        self._seen.update(hashes)
        self._last_rank[conversation] = rank_id

    def _why(self, rank_id, manager, hashes, k, conversation: str, turn: int) -> str:
        host = manager.tiers.host

        def found(name: str, block_hash: int) -> bool:
            pool = manager.pools[name]
            return pool.lookup(block_hash) is not None or host.lookup(name, block_hash) is not None

        culprit = None
        for life_cycle in manager.config.life_cycles:
            if not (life_cycle.reusable and life_cycle.required):
                continue
            blocks = life_cycle.resume_blocks(k, manager.config.block_size)
            missing = next((i for i in blocks if not found(life_cycle.name, hashes[i])), None)
            if missing is not None:
                culprit = (life_cycle.name, missing)
                break
        if culprit is None:
            return "found at the oracle's point (match stops earlier)"
        name, index = culprit
        block_hash = hashes[index]
        where = f"{name} block"
        if block_hash not in self._committed[(rank_id, name)]:
            if block_hash in self._anywhere[name]:
                if turn == 0:
                    kind = "sub-agent" if is_sub_agent(conversation) else "conversation"
                    return f"routed away: new {kind}, prefix on another rank"
                if self._last_rank.get(conversation) != rank_id:
                    return "routed away: turn left its previous rank"
                return "routed away: prefix of another conversation's rank"
            if manager.pools[name] is not None and name != "full":
                return f"never committed: {where} (no window kept at that point)"
            return f"never committed: {where} (still being computed)"
        return f"{where}: " + self._fate.get((rank_id, name, block_hash), "fate unknown")


def later_no_reuse(loss: Loss) -> bool:
    return loss.turn_index >= 1 and loss.reused_tokens < NO_REUSE * loss.prompt_tokens


def is_sub_agent(conversation_id: str) -> bool:
    """Sub-agents are named under their parent: `source/session/agent`."""
    return conversation_id.count("/") >= 2
