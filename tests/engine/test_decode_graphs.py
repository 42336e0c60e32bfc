"""The static-buffer decode path (what CUDA graphs replay) on CPU: bucket padding, the eager
fallback, and greedy output identical to the plain eager step, with and without prefix cache."""

from __future__ import annotations

import random

import pytest
import torch
from engine_testkit import (
    TEST_CONFIG,
    final,
    greedy,
    make_core,
    pages_in_use,
    shared_compute,
    tokens_of,
    wait_until,
)
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.compute.cuda_graphs import DecodeRunner, batch_buckets, is_decode_step
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.request.engine_request import GenerateCall, SequenceFailedError

# The planned-ahead step (overlap_decode, on by default) runs on the static path; EAGER has none.
STATIC = TEST_CONFIG.with_changes(decode_graphs="static", overlap_decode=True)
EAGER = TEST_CONFIG.with_changes(decode_graphs="off")


def test_buckets_end_at_max_batch_and_pad_up():
    assert batch_buckets(4) == (1, 2, 4)
    assert batch_buckets(100) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 100)
    assert batch_buckets(256)[-1] == 256


def test_unknown_mode_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="decode_graphs"):
        EngineConfig(decode_graphs="always")


class _Chunk:
    def __init__(self, token, start, pages):
        self.new_tokens, self.start, self.page_ids = (token,), start, pages


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_padded_decode_matches_plain_forward_and_keeps_null_page_zero(kv_cache_dtype):
    """Three sequences padded to bucket 4: same logits as the unpadded eager forward (an fp8
    cache's graph path quantizes and reads through the same scales); the pad row's K/V must not
    reach the null page."""
    config = EAGER.with_changes(kv_cache_dtype=kv_cache_dtype)
    compute = shared_compute(config, storage="graphs-unit")
    compute.open_tiers()
    cache, model = compute.cache, compute.model
    rng = random.Random(3)
    chunks, next_page = [], 1
    for length in (5, 40, 70):
        pages = list(range(next_page, next_page + -(-(length + 1) // cache.page_size)))
        next_page += len(pages)
        chunk_pages = dict.fromkeys(cache.num_pages, tuple(pages))
        prompt = [rng.randrange(256) for _ in range(length)]
        model(ForwardBatch.build([SequenceChunk(prompt, 0, chunk_pages)], cache), cache,
              compute.attention)  # fmt: skip
        chunks.append(_Chunk(rng.randrange(256), length, chunk_pages))
    runner = DecodeRunner(model, cache, compute.attention, max_batch=4, capture=True)
    assert not runner.capture  # CPU: the same buffers, run eagerly
    assert runner.fits(chunks) and runner.bucket(len(chunks)) == 4
    inputs = [SequenceChunk(c.new_tokens, c.start, c.page_ids) for c in chunks]
    expected = model(ForwardBatch.build(inputs, cache), cache, compute.attention)
    logits, tokens = runner.run(chunks)
    assert logits.shape == expected.shape
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert tokens.tolist() == expected.argmax(dim=-1).tolist()
    cache.check_integrity()


def test_prefill_and_oversized_batches_take_the_eager_path():
    compute = shared_compute(EAGER, storage="graphs-unit")
    runner = DecodeRunner(compute.model, compute.cache, compute.attention, 2, capture=False)
    one = _Chunk(1, 3, {})
    assert is_decode_step([one]) and runner.fits([one, one])
    assert not runner.fits([one, one, one])  # past the last bucket
    assert not is_decode_step([_Chunk(1, 3, {}), type("C", (), {"new_tokens": (1, 2)})()])
    assert not is_decode_step([])


def _serve(config: EngineConfig, storage: str, turns: int) -> list[list[int]]:
    """Three conversations at once (batch 3 pads to 4), each turn resending the last plus its
    output; the outputs of every turn, in order."""
    core = make_core(config, storage=storage)
    rng = random.Random(11)
    prompts = [[rng.randrange(256) for _ in range(30 + 25 * c)] for c in range(3)]
    outputs = []
    try:
        for turn in range(turns):
            handles = [
                core.submit(GenerateCall(f"c{c}-t{turn}", tuple(p), greedy(12), f"c{c}"))
                for c, p in enumerate(prompts)
            ]
            for c, handle in enumerate(handles):
                out = tokens_of(list(handle.outputs(60)))
                outputs.append(out)
                prompts[c] = prompts[c] + out + [rng.randrange(256) for _ in range(9)]
        core.check_integrity()
        core.call_on_core(core.compute.cache.check_integrity)
    finally:
        core.stop()
    return outputs


@pytest.mark.parametrize("ahead", [True, False], ids=["planned-ahead", "no-ahead"])
@pytest.mark.parametrize("policy", ["per_conversation", "per_request"])
def test_greedy_output_identical_with_and_without_static_decode(policy, ahead):
    """Padding, slots or page tables built wrong would change the tokens."""
    config = STATIC.with_changes(reuse_policy=policy, overlap_decode=ahead)
    static = _serve(config, f"graphs-static-{policy}-{ahead}", 3)
    eager = _serve(EAGER.with_changes(reuse_policy=policy), f"graphs-eager-{policy}", 3)
    assert static == eager


def test_static_decode_runs_in_the_serving_path():
    compute = shared_compute(STATIC, storage="graphs-path")
    core = make_core(STATIC, storage="graphs-path")
    calls = []
    original = compute.decode.run
    try:

        def run(chunks, feed=None):
            calls.append((len(chunks), feed is not None))
            return original(chunks, feed)

        compute.decode.run = run
        out = list(core.submit(GenerateCall("r", (1, 2, 3), greedy(4), "c")).outputs(30))
    finally:
        core.stop()
    assert len(tokens_of(out)) == 4
    assert final(out).usage.completion_tokens == 4
    # The first token comes from the prefill step; each later decode step is planned while
    # the one before is in flight and takes its input token from the device.
    assert calls == [(1, False), (1, True), (1, True)]


def test_stop_token_learnt_a_step_late_ends_the_output_where_eager_does():
    """The step planned ahead computes one row too many for a stopping sequence; it must not
    reach the client, the kvstore or the usage."""

    def serve(config, prompts, stop=()):
        core = make_core(config, storage=f"graphs-stop-{config.decode_graphs}")
        try:
            handles = [
                core.submit(GenerateCall(f"s{c}", p, greedy(12, stop_token_ids=stop), f"s{c}"))
                for c, p in enumerate(prompts)
            ]
            outs = [list(h.outputs(60)) for h in handles]
            core.check_integrity()
            core.call_on_core(core.compute.cache.check_integrity)
            return outs
        finally:
            core.stop()

    # A token that one sequence first samples late (deep in the decode phase, where steps are
    # planned ahead) and no other sequence samples at all.
    for seed in range(8):
        prompts = [tuple(random.Random(seed * 10 + c).randrange(256) for _ in range(40))
                   for c in range(3)]  # fmt: skip
        free = [tokens_of(o) for o in serve(EAGER, prompts)]
        late = [
            (c, out.index(t), t)
            for c, out in enumerate(free)
            for t in out
            if out.index(t) >= 6 and all(t not in other for other in free if other is not out)
        ]
        if late:
            break
    assert late, "no prompt gave a late, unique token"
    victim, index, stop = late[0]
    eager, static = serve(EAGER, prompts, (stop,)), serve(STATIC, prompts, (stop,))
    assert [tokens_of(o) for o in static] == [tokens_of(o) for o in eager]
    assert tokens_of(static[victim]) == free[victim][: index + 1]
    assert final(static[victim]).finish_reason == "stop"
    assert [final(o).usage.completion_tokens for o in static] == [len(tokens_of(o)) for o in eager]


def test_cancel_while_a_step_is_in_flight_leaves_the_core_clean():
    core = make_core(STATIC, storage="graphs-cancel")
    try:
        long = core.submit(GenerateCall("long", (1, 2, 3, 4), greedy(200), "a"))
        other = core.submit(GenerateCall("other", (5, 6, 7), greedy(30), "b"))
        first = [long.get(30) for _ in range(5)]
        assert all(o is not None for o in first)
        long.cancel()
        rest = tokens_of(list(other.outputs(60)))
        assert len(rest) == 30
        core.check_integrity()
        core.call_on_core(core.compute.cache.check_integrity)
        wait_until(lambda: core.load().running == 0)
    finally:
        core.stop()
    alone = make_core(EAGER, storage="graphs-cancel-eager")
    try:
        assert tokens_of(list(alone.submit(GenerateCall("o", (5, 6, 7), greedy(30), "b"))
                              .outputs(60))) == rest  # fmt: skip
    finally:
        alone.stop()


def test_non_finite_row_of_a_step_planned_ahead_fails_its_request_alone():
    """The failing row's next step is already in flight when its tokens are read: that request
    fails, the others' tokens match a clean run, and no page stays held."""
    prompts = [tuple(range(3 + 40 * c, 23 + 40 * c)) for c in range(3)]

    def serve(poison_at: int | None):
        core = make_core(STATIC.with_changes(reuse_policy="per_request"), storage="graphs-nan")
        padded_steps = []

        def poison(_module, _inputs, logits):
            if logits.shape[0] == 4:  # a decode step of the three, padded to bucket 4
                padded_steps.append(1)
                if len(padded_steps) == poison_at:
                    logits = logits.clone()
                    logits[1, 5] = float("nan")
            return logits

        hook = core.compute.model.register_forward_hook(poison)
        try:
            handles = [
                core.submit(GenerateCall(f"n{c}", p, greedy(10), f"n{c}"))
                for c, p in enumerate(prompts)
            ]
            results = []
            for handle in handles:
                try:
                    results.append(tokens_of(list(handle.outputs(60))))
                except SequenceFailedError as error:
                    results.append(error)
            core.check_integrity()
            core.call_on_core(core.compute.cache.check_integrity)
            assert pages_in_use(core) == {"full": 0, "window": 0}
            return results
        finally:
            hook.remove()
            core.stop()

    clean, mixed = serve(None), serve(3)
    assert isinstance(mixed[1], SequenceFailedError)
    assert mixed[0] == clean[0] and mixed[2] == clean[2]
