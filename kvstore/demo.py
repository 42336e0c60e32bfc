"""`kvfleet demo`: a synthetic multi-turn agent conversation through the KV cache manager.

Three conversations take turns that append, resend and rewrite the tail of their prompt, under
per_conversation(max_num_turns=2) with pools sized for one slot plus the retained endpoints.
Prints one row per turn and ends with the integrity check.
"""

from __future__ import annotations

import argparse

TURN_KINDS = ("first", "append", "resend", "rewrite tail", "append")
MAX_CONTEXT = 2048 + 1500 * 2 + 96


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `demo` subcommand."""
    parser = subparsers.add_parser(
        "demo",
        help="run a synthetic agent conversation (kvstore)",
        description="Show the KV store alone: synthetic agent conversations turn by turn "
        "(append, resend, rewrite the tail) and the prefix each turn reuses.",
    )
    parser.add_argument("--conversations", type=int, default=3, help="conversations to run")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    parser.set_defaults(func=run_demo)


def next_prompt(kind: str, prompt: list[int], rng) -> list[int]:
    """The prompt of the next turn of one kind (first turn: a fresh 2k-token context)."""
    new = lambda count: rng.integers(0, 50_000, count).tolist()  # noqa: E731
    edits = {
        "first": lambda: new(2048),
        "append": lambda: prompt + new(int(rng.integers(800, 1500))),
        "resend": lambda: list(prompt),
        "rewrite tail": lambda: prompt[: -int(rng.integers(16, 128))] + new(96),
    }
    return edits[kind]()


def run_demo(args: argparse.Namespace) -> int:
    """Drive the turns and print the table."""
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from .config import KVStoreConfig
    from .life_cycles import FullLifeCycle, StateLifeCycle, WindowLifeCycle
    from .manager import KVCacheManager
    from .policies import make_reuse_policy
    from .sizing import TypicalStep, plan_pools

    block_size, max_turns = args.block_size, 2
    life_cycles = (
        FullLifeCycle("full"),
        WindowLifeCycle("swa", window_tokens=512, replay_tokens=128),
        StateLifeCycle("ssm", every_tokens=1024),
    )
    step = TypicalStep(
        num_slots=1,
        max_context_tokens=MAX_CONTEXT,
        chunk_tokens=512,
        retained_turns=args.conversations * max_turns,
        full_tokens_per_retained_turn=MAX_CONTEXT,
    )
    plan = plan_pools(step, life_cycles, block_size)
    config = KVStoreConfig(
        block_size,
        life_cycles,
        plan.pool_pages,
        make_reuse_policy("per_conversation", max_num_turns=max_turns),
    )
    manager = KVCacheManager(config)
    rng = np.random.default_rng(0)
    prompts: dict[str, list[int]] = {f"conv{c}": [] for c in range(args.conversations)}
    table = Table(
        title=f"per_conversation(max_num_turns={max_turns}), block {block_size}; "
        "pages per pool: free/cached/in use"
    )
    for column in ("conv", "turn", "kind", "prompt", "reused", "ckpt"):
        table.add_column(column, justify="right")
    for name, pool in manager.pools.items():
        table.add_column(f"{name} ({pool.num_usable})", justify="right")
    reused_total = prompt_total = 0
    for turn, kind in enumerate(TURN_KINDS, start=1):
        for conversation, prompt in prompts.items():
            prompt = prompts[conversation] = next_prompt(kind, prompt, rng)
            request_id = f"{conversation}/t{turn}"
            manager.add_request(request_id, prompt, conversation)
            reused = manager.match(request_id).num_reusable_tokens
            manager.admit(request_id, min(512, len(prompt) - reused))
            done = reused
            while done < len(prompt):
                done = min(len(prompt), done + 512)
                manager.commit(request_id, done)
                if done < len(prompt):
                    manager.allocate(request_id, min(512, len(prompt) - done))
            checkpoint = manager.progress(request_id).checkpoint_tokens
            manager.finish_context(request_id)
            manager.finish_request(request_id)
            reused_total, prompt_total = reused_total + reused, prompt_total + len(prompt)
            usage = [f"{p.num_free}/{p.num_cached}/{p.num_in_use}" for p in manager.pools.values()]
            table.add_row(
                conversation,
                str(turn),
                kind,
                str(len(prompt)),
                str(reused),
                str(checkpoint or "-"),
                *usage,
            )
    manager.check_integrity()
    console = Console(width=max(100, Console().width))
    console.print(table)
    console.print(f"prefix reuse {reused_total / prompt_total:.1%}; check_integrity() passed")
    return 0
