"""A simulated turn whose match shrank at admission (a block of the shared disk gone, what is
left no longer fits: the kvstore takes nothing) waits and is admitted later, as the engine's."""

from __future__ import annotations

from kvfleet.kvstore.admission import MatchShrankError
from kvfleet.kvstore.manager import KVCacheManager
from test_sim_decode_overlap import one_turn, token_times


async def test_a_turn_whose_match_shrank_waits_and_every_turn_ends(monkeypatch) -> None:
    """If this fails, the simulator's replay breaks off (the error escapes the rank) where the
    engine lets the turn wait and match again."""
    refused = []
    original = KVCacheManager.admit

    def admit(manager, request_id, num_new_tokens):
        if request_id == "sim-1" and len(refused) < 3:  # the second turn, three times
            refused.append(request_id)
            raise MatchShrankError(f"request {request_id!r}: its match shrank and no longer fits")
        return original(manager, request_id, num_new_tokens)

    monkeypatch.setattr(KVCacheManager, "admit", admit)
    turns = [one_turn("l", output_tokens=60), one_turn("w", output_tokens=10)]
    times, _ = await token_times(turns, 0.2, True, 1)
    assert refused == ["sim-1"] * 3
    assert [len(times["l"]), len(times["w"])] == [60, 10]


async def test_a_lone_turn_whose_match_shrank_matches_again_at_once(monkeypatch) -> None:
    """If this fails, the simulator fails a turn the engine serves: alone on its rank, a turn
    whose match shrank is matched again in the engine's next loop, with nothing to wait for."""
    refused = []
    original = KVCacheManager.admit

    def admit(manager, request_id, num_new_tokens):
        if len(refused) < 2:
            refused.append(request_id)
            raise MatchShrankError(f"request {request_id!r}: its match shrank and no longer fits")
        return original(manager, request_id, num_new_tokens)

    monkeypatch.setattr(KVCacheManager, "admit", admit)
    times, _ = await token_times([one_turn("a", output_tokens=10)], 0.2, True, 1)
    assert refused == ["sim-0"] * 2
    assert len(times["a"]) == 10
