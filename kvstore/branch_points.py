"""Branch points: where a turn leaves what is cached, kept so later turns can resume there.

Under a hybrid model a turn can find its whole prefix (full attention) cached far past the last
position where its windows can resume: a context reset keeps the tools and system prompt, whose
full blocks every retained turn holds, but no window ever ended there, so it reuses nothing.
Such a turn commits the window (and state snapshot) ending where its full match ends, its
**branch point**, and the conversation keeps that endpoint for as long as it lives, so the next
turn that branches there resumes at it.

At admission, with r the reused prefix and f the whole-prefix cached run (both block-aligned,
f <= prompt_len - max(1, R)) and C = (prompt_len - R - margin) // B * B the checkpoint position:

| case                                                   | branch point b           |
|--------------------------------------------------------|--------------------------|
| policy keeps none (all_reusable, per_request, default) | none                     |
| no required whole-prefix life cycle (f = 0)            | none                     |
| f <= r: the windows resume where the full run ends     | none                     |
| f >= C: within R + margin of the prompt end            | none (the checkpoint's)  |
| r < f < C                                              | b = f                    |

Blocks the turn commits for b and keeps (never slides out) until its context ends: a window's
blocks covering [b - w, b), a state life cycle's snapshot after block b/B - 1. At context end a
branch record takes refs on those and the full blocks [0, b). A conversation holds at most
`keep_branch_points` records:

| event                                    | branch records                                     |
|------------------------------------------|----------------------------------------------------|
| a turn with branch point b ends context  | b's record is added as the most recently used      |
| ... and the conversation then holds more | the least recently used falls out (a drop plan)    |
| a turn resumes exactly at a held b       | b's record becomes the most recently used          |
| drop_conversation / release_conversation | dropped / handed to the LRU with the turns         |
"""

from __future__ import annotations

from .config import KVStoreConfig


def branch_position(
    config: KVStoreConfig, prompt_len: int, num_reused_tokens: int, whole_prefix_tokens: int
) -> int | None:
    """The turn's branch point in tokens per the table above, or None when it keeps none."""
    if not config.reuse_policy.keep_branch_points:
        return None
    if whole_prefix_tokens <= num_reused_tokens:
        return None
    if whole_prefix_tokens >= config.checkpoint_position(prompt_len):
        return None
    return whole_prefix_tokens
