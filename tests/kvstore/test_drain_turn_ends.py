"""A draining rank writes where a finished turn ends (prompt and output), not only its prompt.

Turn "a" is 4 blocks of BLOCK tokens; it then decodes 2 blocks more, committing each token as
an engine does. A retained record holds its prompt end (4 blocks); a next turn that resends
prompt and output resumes after 6 blocks on a full-attention model. A window life cycle
commits no block past the prompt's end, so there a resume after the output has no window
blocks: nothing of it is written (the retained record's flush covers the prompt end).
"""

from kvfleet.kvstore.block_pool import NULL_PAGE
from kvfleet.kvstore.hashing import block_hashes
from kvfleet.kvstore.life_cycles import FullLifeCycle, WindowLifeCycle
from kvfleet.kvstore.policies import PerConversation
from tier_factories import BLOCK, block_kv, make_tiered, prompt_of, serve

OUTPUT = [7_000 + i for i in range(2 * BLOCK)]


def _rank(life_cycles):
    return make_tiered(
        life_cycles, device_pages=16, host_pages=0, policy=PerConversation(max_num_turns=2)
    )


def _decoded(manager, request_id: str) -> tuple[int, ...]:
    """Serve turn "a" up to its context end, decode OUTPUT; the ids `computed_block_ids` gives."""
    prompt = prompt_of(1)
    manager.add_request(request_id, prompt, "a")
    manager.admit(request_id, len(prompt))
    manager.commit(request_id, len(prompt))
    manager.finish_context(request_id)
    for computed, token in enumerate(OUTPUT, start=len(prompt) + 1):
        manager.append_tokens(request_id, [token])
        manager.allocate(request_id, 1)
        manager.commit(request_id, computed)
    hashes = block_hashes(prompt + OUTPUT, BLOCK)
    for name in manager.life_cycles:  # each page's block-identified KV, as `serve` writes
        for index, page in enumerate(manager.page_table(request_id, name)[: len(hashes)]):
            if page != NULL_PAGE:
                storage = manager.tiers.device_kv.storage(name)
                storage[:, :, page] = block_kv(manager, name, hashes[index])
    return manager.computed_block_ids(request_id)


def _files(manager) -> int:
    return len(list(manager.tiers.disk.files.root.rglob("*.kvb")))


def test_a_full_attention_turn_end_is_written_whole_and_once():
    """Without the write, the output's 2 blocks would be recomputed by the next rank."""
    rank = _rank((FullLifeCycle("full"),))
    block_ids = _decoded(rank, "a1")
    assert len(block_ids) == 6
    assert rank.flush_retained_to_disk() == 4
    assert rank.flush_resume_point_to_disk(block_ids) == 2  # the prompt's blocks are there
    assert rank.flush_resume_point_to_disk(block_ids) == 0
    assert _files(rank) == 6
    rank.finish_request("a1")
    other = make_tiered(
        (FullLifeCycle("full"),), device_pages=16, disk_dir=str(rank.tiers.disk.files.root)
    )
    assert serve(other, "a2", prompt_of(1) + OUTPUT + prompt_of(9, BLOCK), "a") == 6 * BLOCK
    for manager in (rank, other):
        manager.check_integrity()
        manager.tiers.close()


def test_a_resume_point_with_a_window_block_missing_is_not_written():
    """Writing its full blocks alone would fill the disk with blocks no resume can use."""
    rank = _rank((FullLifeCycle("full"), WindowLifeCycle("swa", window_tokens=2 * BLOCK)))
    block_ids = _decoded(rank, "a1")
    assert len(block_ids) == 6
    assert rank.flush_resume_point_to_disk(block_ids) == 0
    assert _files(rank) == 0
    rank.finish_request("a1")
    rank.check_integrity()
    rank.tiers.close()
