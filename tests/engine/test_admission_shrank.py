"""A turn whose prefix loses a disk block at admission, so that what is left no longer fits:
the kvstore takes nothing and says so (`MatchShrankError`), and the turn waits."""

from __future__ import annotations

from engine_testkit import TEST_CONFIG, greedy, random_prompt, serve_stepped
from kvfleet.kvstore.admission import MatchShrankError
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.services.engine.request.engine_request import GenerateCall

AHEAD = TEST_CONFIG.with_changes(decode_graphs="static", overlap_decode=True)


def test_an_admission_whose_match_shrank_waits_and_the_rank_goes_on(monkeypatch):
    """If this fails, a turn whose prefix lost a disk block at admission (what is left no longer
    fits: the kvstore takes nothing and says so) fails every request on the rank, where it
    should wait and match again while the others decode."""
    arrivals = [
        (0, GenerateCall("long", random_prompt(1, 200), greedy(60), "long")),
        (10, GenerateCall("late", random_prompt(2, 300), greedy(8), "late")),
    ]
    clean = serve_stepped(AHEAD, "shrank-clean", arrivals)
    refused = []
    original = KVCacheManager.admit

    def admit(manager, request_id, num_new_tokens):
        if "late" in request_id and len(refused) < 3:
            refused.append(request_id)
            raise MatchShrankError(f"request {request_id!r}: its match shrank and no longer fits")
        return original(manager, request_id, num_new_tokens)

    monkeypatch.setattr(KVCacheManager, "admit", admit)
    shrank = serve_stepped(AHEAD, "shrank", arrivals)
    assert len(refused) == 3
    assert shrank.outputs == clean.outputs
