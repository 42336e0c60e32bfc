"""The arms a fleet replay compares, each as the router flags, engine settings and simulator
overrides that give it, so the hardware fleet (fleet_replay.py) and the simulator
(fleet_sim.py) run exactly the same policies."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Arm:
    router_flags: tuple[str, ...] = ()
    engine: dict[str, object] = field(default_factory=dict)  # engine.yaml `engine:` fields
    sim: dict[str, str] = field(default_factory=dict)  # `--target sim?k=v` fleet options
    # sglang-router with this policy in front of the ranks instead of kvfleet's router (the
    # ranks register with no router; the replay sends prompts as text, which it needs)
    sglang_policy: str | None = None
    # the ranks' look-ahead rule: "shipped", or "unqueued", the one before requests waiting at
    # a rank were planned ahead (lookahead_before.py; hardware only, the simulator has one)
    lookahead: str = "shipped"


ARMS: dict[str, Arm] = {
    # strict affinity bounded at 30 s, per_conversation reuse of 5 turns, checkpoint: what a
    # fleet gets when nothing is set.
    "defaults": Arm(),
    # the defaults with router-driven prefetch: a turn waiting for its home's slot holds its
    # blocks there, so they are released after every other retained turn.
    "prefetch": Arm(("--prefetch",), {}, {"prefetch": "true"}),
    # the defaults with re-homing: a pinned turn whose home kept some but under 70 % of its
    # prompt (the router's prefix index) is placed as a new conversation.
    "rehome": Arm(("--rehome-below", "0.7"), {}, {"rehome_below": "0.7"}),
    # the affinity the project argues against, with the retention sim_sweep.py calls t2.
    "lenient/t2": Arm(
        ("--affinity", "lenient"),
        {"max_num_turns": 2},
        {"affinity": "lenient", "max_num_turns": "2"},
    ),
    # the defaults with the ranks' look-ahead rule before (a request waiting at a rank turned
    # the overlapped decode off): a same-run baseline on hardware.
    "ahead-unqueued": Arm(lookahead="unqueued"),
    # the defaults with a long host/disk prefix onboarded at its admission in one go, not in
    # pieces of 256 pages a step (the engine's `onboard_pages_per_step`)
    "pieces-off": Arm((), {"onboard_pages_per_step": 0}, {"onboard_pages_per_step": "0"}),
    # the defaults with an fp8 (e4m3) KV cache: the same bytes per rank hold twice the pages.
    "fp8": Arm((), {"kv_cache_dtype": "fp8_e4m3"}, {"kv_cache_dtype": "fp8_e4m3"}),
    # the defaults with disk-tier writes on a writer thread (kvstore/tiers/write_behind.py); the
    # simulator's side of it is its YAML with `disk_write_ms_per_page: 0`.
    "write-behind": Arm((), {"disk_write_behind": True}, {}),
    # sglang-router's cache-aware policy, the field's prefix-aware router: a radix tree of the
    # prompts' text per worker; a prompt matching over 30 % goes to its longest match, else to
    # the worker with the smallest tree, and it queues there: load decides only past 64
    # requests of imbalance. Its simulator side is the nearest kvfleet policy, a turn waiting
    # for the rank that holds it with no bound, new conversations placed by prefix (kvfleet's
    # `affinity: none` never waits for a busy rank, which sglang's workers make turns do).
    "sglang/cache_aware": Arm(
        sim={"affinity": "strict", "max_wait_seconds": "1e9", "placement": "prefix"},
        sglang_policy="cache_aware",
    ),
    # a router blind to the cache: pins ignored, ranks in turn.
    "round-robin": Arm(
        ("--affinity", "none", "--placement", "round_robin"),
        {},
        {"affinity": "none", "placement": "round_robin"},
    ),
}


def arm_slug(name: str) -> str:
    """An arm's name as a file or folder name (`lenient/t2` -> `lenient_t2`)."""
    return name.replace("/", "_")
