"""Chained block hashes."""

import pytest
from kvfleet.kvstore.hashing import SequenceHashes, block_hashes


def test_equal_prefixes_have_equal_ids():
    """Two sequences sharing 2 blocks must share exactly their first 2 ids, or reuse breaks."""
    first = block_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 3)
    second = block_hashes([1, 2, 3, 4, 5, 6, 0, 8, 9], 3)
    assert first[:2] == second[:2]
    assert first[2] != second[2]
    assert len(first) == 3


def test_id_depends_on_parent():
    """Equal block contents under different parents must differ, else prefixes alias."""
    assert block_hashes([1, 2, 7, 7], 2)[1] != block_hashes([3, 4, 7, 7], 2)[1]


def test_extra_key_salts_every_block():
    """Another model/tenant must never hit this one's blocks."""
    assert set(block_hashes([1, 2, 3, 4], 2, b"a")).isdisjoint(block_hashes([1, 2, 3, 4], 2, b"b"))


def test_incremental_extend_equals_one_shot():
    """Appending in pieces (decode) must give the ids of hashing the whole sequence."""
    sequence = SequenceHashes(4)
    for piece in ([1, 2, 3], [4, 5], [6, 7, 8, 9]):
        sequence.extend(piece)
    assert sequence.hashes == block_hashes(list(range(1, 10)), 4)
    assert sequence.num_tokens == 9


def test_ids_are_stable_across_processes():
    """The disk tier and KV events compare ids across processes: they must be fixed values."""
    assert block_hashes([1, 2], 2) == [0x68D733C03E784A6B]


def test_out_of_range_token_is_rejected():
    """A negative id would wrap silently into another token's bytes."""
    with pytest.raises(ValueError, match="token ids must lie in"):
        block_hashes([1, -1], 2)
