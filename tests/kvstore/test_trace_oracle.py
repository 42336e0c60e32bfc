"""Real trace: Claude Code sessions replayed with an unbounded pool reuse exactly the oracle."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from kvfleet.kvstore.config import KVStoreConfig
from kvfleet.kvstore.life_cycles import FullLifeCycle
from kvfleet.kvstore.manager import KVCacheManager
from kvfleet.kvstore.policies import PerRequest

# The repo's ../shared; KVFLEET_SHARED names it when the checkout lives elsewhere.
SHARED = Path(
    os.environ.get("KVFLEET_SHARED") or Path(__file__).resolve().parents[2] / ".." / "shared"
)
TRACES = SHARED / "traces" / "claude_code_weka"
BLOCK = 64  # the trace's block size
SESSIONS = ["trace_0460.json", "trace_0022.json", "trace_0130.json", "trace_0291.json"]


def flatten(requests):
    """Model requests in session order, sub-agents' requests where they were spawned."""
    for request in requests:
        if request["type"] == "subagent":
            yield from flatten(request["requests"])
        else:
            yield request


def block_tokens(hash_id):
    """The same 64 tokens for the same id (ids are local to one session's namespace)."""
    return np.random.default_rng(hash_id).integers(0, 100_000, BLOCK, dtype=np.int64)


def oracle_blocks(requests):
    """Per request, the longest prefix of its ids an earlier request had (a trie walk)."""
    root: dict = {}
    reused = []
    for request in requests:
        node, count = root, 0
        for hash_id in request["hash_ids"]:
            if hash_id not in node:
                break
            node, count = node[hash_id], count + 1
        reused.append(count)
        node = root
        for hash_id in request["hash_ids"]:
            node = node.setdefault(hash_id, {})
    return reused


@pytest.mark.parametrize("session", SESSIONS)
def test_unbounded_replay_reuses_exactly_the_oracle(session):
    """Any lost or spurious hit, or a wrong chain hash, would move reuse off the oracle."""
    requests = list(flatten(json.loads((TRACES / session).read_text())["requests"]))
    total_blocks = sum(len(request["hash_ids"]) + 1 for request in requests)
    config = KVStoreConfig(
        block_size=BLOCK,
        life_cycles=(FullLifeCycle("full"),),
        pool_pages={"full": total_blocks + 1},
        reuse_policy=PerRequest(),
    )
    manager = KVCacheManager(config)
    reused = []
    for number, request in enumerate(requests):
        tail = np.full(max(1, request["in"] % BLOCK), number, dtype=np.int64)  # never shared
        prompt = np.concatenate([*map(block_tokens, request["hash_ids"]), tail])
        request_id = f"{session}/{number}"
        manager.add_request(request_id, prompt, conversation_id=session)
        match = manager.match(request_id)
        manager.admit(request_id, len(prompt) - match.num_reusable_tokens)
        manager.commit(request_id, len(prompt))
        manager.finish_context(request_id)
        manager.finish_request(request_id)
        reused.append(match.num_reusable_blocks)
    assert reused == oracle_blocks(requests)
    assert sum(reused) > 0
    manager.check_integrity()
