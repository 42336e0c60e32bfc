"""The engine's look-ahead rule before requests waiting at the rank were planned ahead, for
same-run A/Bs: a step is planned while the one before runs only with no request waiting and
every running sequence in that step (lookahead.py has the rule that ships).

    use_rule("unqueued")   # in a bench process: the rule before
    python bench/lookahead_before.py engine ARGS...   # a `kvfleet engine` rank with it
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import import_engine

import_engine()  # the device machine runs this from the checkout, not installed

from kvfleet.services.engine.core import engine_core, lookahead  # noqa: E402


def unqueued_look_ahead(inflight, scheduler, manager, commands_waiting: bool) -> bool:
    running = scheduler.running
    if scheduler.waiting or len(running) != len(inflight.rows):
        return False
    if any(pool.num_available() < len(running) for pool in manager.pools.values()):
        return False
    return lookahead.can_look_ahead(inflight, scheduler, manager, commands_waiting)


def use_rule(rule: str) -> None:
    """`shipped` (lookahead.can_look_ahead) or `unqueued` (the rule before)."""
    rules = {"shipped": lookahead.can_look_ahead, "unqueued": unqueued_look_ahead}
    engine_core.can_look_ahead = rules[rule]


if __name__ == "__main__":
    from kvfleet.services import cli

    use_rule("unqueued")
    print("lookahead_before: the ranks' look-ahead rule is the one before", file=sys.stderr)
    sys.argv[0] = "kvfleet"
    sys.exit(cli.main())
