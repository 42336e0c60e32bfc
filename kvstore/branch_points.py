"""Branch points: where a turn leaves what is cached, kept so later turns can resume there.

Under a hybrid model a turn can find its whole prefix (full attention) cached far past the last
position where its windows can resume: a context reset keeps the tools and system prompt, whose
full blocks every retained turn holds, but no window ever ended there, so it reuses nothing.
Such a turn commits the window (and state snapshot) ending where its full match ends, its
**branch point**, and the conversation keeps that endpoint for as long as it lives, so the next
turn that branches there resumes at it.

A turn can also name **branch hints**, positions where later prompts are likely to leave it
(the end of the tools and of the system prompt, which the chat template knows and a context
reset keeps): they become branch points on the turn that first computes past them, so even the
first reset there resumes. A hinted turn plans its hints only: a discovered point would push
a hinted record out of the conversation's few.

At admission, with r the reused prefix and f the whole-prefix cached run (both block-aligned,
f <= prompt_len - max(1, R)), C = (prompt_len - R - margin) // B * B the checkpoint position,
and each hint h floored to a block:

| case                                                   | branch points                   |
|--------------------------------------------------------|---------------------------------|
| policy keeps none (all_reusable, per_request, default) | none                            |
| no hints, discovery on, r < f < C                      | f                               |
| r < h < C, for each hint h                             | h                               |
| f <= r, h <= r: the windows already resume past it     | not that one                    |
| f >= C, h >= C: within R + margin of the prompt end    | not that one (the checkpoint's) |

For each branch point b, the turn commits and keeps (never slides out) until its context ends a
window's blocks covering [b - w, b) and a state life cycle's snapshot after block b/B - 1. At
context end a branch record takes refs on those and the full blocks [0, b). A conversation
holds at most `keep_branch_points` records:

| event                                    | branch records                                      |
|------------------------------------------|-----------------------------------------------------|
| a turn with branch point b ends context  | b's record is added as the most recently used       |
|                                          | (a turn's branch points in position order)          |
| ... and the conversation then holds more | the least recently used falls out (a drop plan)     |
| a turn resumes exactly at a held b       | b's record becomes the most recently used           |
| drop_conversation / release_conversation | dropped / handed to the LRU with the turns          |
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import KVStoreConfig


def branch_positions(
    config: KVStoreConfig,
    prompt_len: int,
    num_reused_tokens: int,
    whole_prefix_tokens: int,
    hints: Sequence[int] = (),
) -> tuple[int, ...]:
    """The turn's branch points in tokens per the table above, ascending (empty: none): at most
    `keep_branch_points`, the last ones (those its records would keep), so no request keeps
    more windows than the pools are sized for, whatever it hints."""
    if not config.reuse_policy.keep_branch_points:
        return ()
    checkpoint, bs = config.checkpoint_position(prompt_len), config.block_size
    if hints:
        candidates = {hint // bs * bs for hint in hints}
    elif config.reuse_policy.discover_branch_points:
        candidates = {whole_prefix_tokens}
    else:
        return ()
    points = sorted(p for p in candidates if num_reused_tokens < p < checkpoint)
    return tuple(points[-int(config.reuse_policy.keep_branch_points) :])
