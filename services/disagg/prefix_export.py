"""The home rank's half of a moved turn: send the blocks of its prompt's prefix held here.

A conversation's turn placed on another rank asks its home (`PullKvBlocks` with the prompt):
the home matches the prompt as its own next turn would (device, host and disk), brings the
matched host/disk blocks up to the device for the read, and sends every block after the
receiver's held prefix up to the match's end that it has a page for: the matched ones, and
window blocks it still holds committed (the checkpoint window the receiver may need). The
pages stay cached here; nothing of the conversation's retention changes.

Runs on the engine core thread (`call_on_core`): it owns the manager and the pages.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from ...kvstore.hashing import salt_extra_key
from .blocks import KVBlock
from .context_side import HeldPrefixMismatch, prompt_sequence, read_selected, select_blocks
from .page_io import pages_of

MAX_SALT_CHARS = 256  # as the engine's Generate takes
_IDS = itertools.count()


class PullRequestError(ValueError):
    """A prefix pull the home cannot serve as asked; the message names the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def check_pull(prompt: Sequence[int], cache_salt: str, max_tokens: int) -> None:
    """Raise PullRequestError naming the field of a prefix pull this rank never serves."""
    if not prompt:
        raise PullRequestError("prompt_token_ids", "empty: send the moved turn's prompt")
    if len(prompt) > max_tokens:
        raise PullRequestError(
            "prompt_token_ids", f"{len(prompt)} tokens > {max_tokens} this rank serves"
        )
    if len(cache_salt) > MAX_SALT_CHARS:
        raise PullRequestError("cache_salt", f"{len(cache_salt)} chars > {MAX_SALT_CHARS}")


def export_prefix(
    core, prompt: tuple[int, ...], cache_salt: str, held_hashes: tuple[int, ...]
) -> list[KVBlock]:
    """The blocks of `prompt`'s reusable prefix here after the receiver's `held_hashes`
    (empty when this rank has nothing past them); HeldPrefixMismatch when the held hashes are
    not this prompt's."""
    manager = core.manager
    block_size = manager.config.block_size
    extra_key = salt_extra_key(cache_salt)
    sequence = prompt_sequence(prompt, block_size, extra_key)
    hashes = sequence.hashes
    held = len(held_hashes)
    if tuple(hashes[:held]) != tuple(held_hashes):
        raise HeldPrefixMismatch(
            f"the receiver's {held} held blocks are not a prefix of this prompt's "
            f"{len(hashes)} full blocks"
        )
    key = f"prefix-export-{next(_IDS)}"
    manager.add_request(key, prompt, None, extra_key)
    try:
        reach = manager.match(key).num_reusable_tokens
        if reach <= held * block_size:
            return []
        # NOTE: admission brings host/disk blocks of the match to the device (and may reuse
        # less than the match said, a disk file failing its checks); without room only the
        # blocks already on the device are sent.
        if manager.can_admit(key, 0):
            reach = manager.admit(key, 0).num_reused_tokens
        picked = select_blocks(manager, key, hashes, reach, held)
        blocks = read_selected(picked, sequence, pages_of(core).read)
        moves = core.metrics.handoff.moves
        moves.blocks.labels("sent").inc(len(blocks))
        moves.bytes.labels("sent").inc(sum(len(block.data) for block in blocks))
        return blocks
    finally:
        manager.finish_request(key)
