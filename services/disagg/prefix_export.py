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

from ...kvstore.hashing import SequenceHashes, salt_extra_key
from .blocks import KVBlock
from .context_side import HeldPrefixMismatch, select_blocks
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


def salted_sequence(prompt: Sequence[int], block_size: int, cache_salt: str) -> SequenceHashes:
    """The prompt's chained block ids as the manager computes them for this salt."""
    sequence = SequenceHashes(block_size, salt_extra_key(cache_salt))
    sequence.extend(prompt)
    return sequence


def export_prefix(
    core, prompt: tuple[int, ...], cache_salt: str, held_hashes: tuple[int, ...]
) -> list[KVBlock]:
    """The blocks of `prompt`'s reusable prefix here after the receiver's `held_hashes`
    (empty when this rank has nothing past them); HeldPrefixMismatch when the held hashes are
    not this prompt's."""
    manager = core.manager
    block_size = manager.config.block_size
    sequence = salted_sequence(prompt, block_size, cache_salt)
    hashes = sequence.hashes
    held = len(held_hashes)
    if tuple(hashes[:held]) != tuple(held_hashes):
        raise HeldPrefixMismatch(
            f"the receiver's {held} held blocks are not a prefix of this prompt's "
            f"{len(hashes)} full blocks"
        )
    key = f"prefix-export-{next(_IDS)}"
    manager.add_request(key, prompt, None, salt_extra_key(cache_salt))
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
        io = pages_of(core)
        blocks = []
        for name, rows in picked.items():
            data = io.read(name, [page for _, _, page in rows])
            blocks.extend(
                KVBlock(name, index, block_hash, raw, sequence.contents(index))
                for (index, block_hash, _), raw in zip(rows, data, strict=True)
            )
        moves = core.metrics.handoff.moves
        moves.blocks.labels("sent").inc(len(blocks))
        moves.bytes.labels("sent").inc(sum(len(block.data) for block in blocks))
        return blocks
    finally:
        manager.finish_request(key)
