"""A block id collision on the shared disk tier is a miss, never another prompt's KV.

Block ids are 64-bit and every pod reads every other pod's block files, so a collision would
serve one prompt's KV to another fleet-wide. The ids are forced to collide here: the hash sees
token ids modulo 1000 only, so `prompt_of(1)` and `prompt_of(7)` get the same ids.
"""

import numpy as np
import pytest
import xxhash
from kvfleet.kvstore.hashing import block_hashes
from tier_factories import BLOCK, make_tiered, prompt_of, serve

REAL_DIGEST = xxhash.xxh3_64_intdigest


def colliding_digest(data, seed=0):
    """xxh3 of the tokens modulo 1000: prompts equal modulo 1000 collide in every block."""
    if len(data) % 4:
        return REAL_DIGEST(data, seed=seed)  # not a block of tokens (the root's extra key)
    tokens = np.frombuffer(bytes(data), dtype="<u4")
    return REAL_DIGEST((tokens % 1000).astype("<u4").tobytes(), seed=seed)


@pytest.fixture
def colliding(monkeypatch):
    monkeypatch.setattr(xxhash, "xxh3_64_intdigest", colliding_digest)


def spilled_to_disk(prompt):
    """A rank that served `prompt` and pushed its blocks off device and host to disk."""
    writer = make_tiered(device_pages=6, host_pages=2)
    serve(writer, "a", prompt)
    for seed in range(2, 5):  # distinct modulo 1000, from each other and from the prompt
        serve(writer, f"push{seed}", [500 + 100 * seed + i for i in range(4 * BLOCK)])
    hashes = block_hashes(prompt, BLOCK)
    assert all(writer.tiers.disk.files.contains("full", h) for h in hashes)
    return writer


def test_a_colliding_prompt_misses_the_other_prompts_disk_blocks(colliding):
    """Another pod serving a prompt whose ids collide must recompute, not reuse."""
    original, other = prompt_of(1), prompt_of(7)
    assert block_hashes(original, BLOCK) == block_hashes(other, BLOCK)  # forced collision
    writer = spilled_to_disk(original)
    folder = str(writer.tiers.disk.files.root)
    same = make_tiered(device_pages=6, host_pages=2, disk_dir=folder)
    assert serve(same, "a2", [*original, 5]) == 4 * BLOCK  # the files are found and served
    colliding_reader = make_tiered(device_pages=6, host_pages=2, disk_dir=folder)
    assert serve(colliding_reader, "b", [*other, 5]) == 0
    assert colliding_reader.tiers.metrics["disk"].hits == 0
    assert colliding_reader.tiers.metrics["disk"].misses >= 1
    for manager in (writer, same, colliding_reader):
        manager.check_integrity()
        manager.tiers.close()


def test_contents_are_kept_only_for_blocks_a_tier_holds():
    """The contents kept for disk checks must not grow with every block ever served."""
    manager = make_tiered(device_pages=6, host_pages=2)
    for seed in range(1, 12):
        serve(manager, f"t{seed}", prompt_of(seed))
    assert 0 < manager.tiers.num_contents() <= 6 + 2
    manager.check_integrity()
    manager.tiers.close()
