"""The engine's `sim` compute backend: cost-model sleeps, deterministic tokens, real reuse."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import grpc
import httpx
import pytest
from kvfleet.kvstore.tiers.metrics import DISK, HOST
from kvfleet.proto import common_pb2, engine_pb2, engine_pb2_grpc
from kvfleet.services.cli import build_parser
from kvfleet.services.core.cost_model import StepWork
from kvfleet.services.engine.compute.backends import make_compute
from kvfleet.services.engine.compute.compute_sim import SimCompute, step_work
from kvfleet.services.engine.compute.sampling import SamplingParams
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.core.engine_core import EngineCore
from kvfleet.services.engine.rank.cli import engine_config_from_args
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.engine.request.engine_request import GenerateCall
from kvfleet.services.engine.request.scheduled_chunk import ScheduledChunk
from peers_testkit import SIM_CONFIG


def _chunk(start: int, count: int, context_done: bool) -> ScheduledChunk:
    sequence = SimpleNamespace(context_done=context_done, num_tokens=start + count)
    return ScheduledChunk(sequence, start, tuple(range(count)), {})


def _run(core: EngineCore, request_id: str, prompt, max_tokens: int = 5, **sampling):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, **sampling)
    call = GenerateCall(request_id, tuple(prompt), params, "conv-" + request_id)
    return list(core.submit(call).outputs(10))


def _tokens(outputs) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


def test_step_work_splits_prefill_spans_from_decode_contexts():
    """Prefill chunks charged as decodes (or the reverse) would skew every simulated TTFT."""
    work = step_work([_chunk(0, 48, False), _chunk(99, 1, True), _chunk(48, 16, False)], 2, 1)
    assert work == StepWork(((0, 48), (48, 64)), (100,), host_pages_in=2, disk_pages_in=1)


def test_each_step_sleeps_its_cost_model_time_times_the_scale():
    """A rank that does not sleep the cost model's step time gives meaningless TTFTs."""
    slept: list[float] = []
    config = dataclasses.replace(SIM_CONFIG, sim_time_scale=0.5)
    compute = SimCompute(config, sleep=slept.append)
    core = EngineCore(config, compute=compute).start()
    try:
        outputs = _run(core, "a", range(1, 100), max_tokens=5)
        core.check_integrity()
    finally:
        core.stop()
    costs = compute.costs
    prefill = [StepWork(prefill_spans=(span,)) for span in ((0, 48), (48, 96), (96, 99))]
    decode = [StepWork(decode_contexts=(context,)) for context in (100, 101, 102, 103)]
    expected = [costs.step_seconds(work) for work in prefill + decode]
    assert len(_tokens(outputs)) == 5
    assert slept == pytest.approx([0.5 * s for s in expected], rel=1e-12)
    assert compute.simulated_seconds == pytest.approx(sum(expected), rel=1e-12)


def test_pages_onboarded_from_host_and_disk_are_charged_once():
    """Onboarding left out (or charged twice) would mis-time every lower-tier hit."""
    slept: list[float] = []
    compute = SimCompute(SIM_CONFIG.with_changes(sim_time_scale=2.0), sleep=slept.append)
    tiers = compute.open_tiers()
    tiers.metrics[HOST].hits += 3  # what an admission that onboarded 3 host pages counts
    tiers.metrics[DISK].hits += 2
    compute.execute([])
    compute.execute([])
    expected = compute.costs.step_seconds(StepWork(host_pages_in=3, disk_pages_in=2))
    assert expected > compute.costs.step_overhead_s
    assert slept == [2.0 * expected]


def test_same_prompt_and_seed_give_the_same_tokens_and_another_seed_differs():
    """Nondeterministic sim output would make replays of the same arm disagree."""
    core = EngineCore(SIM_CONFIG, compute=SimCompute(SIM_CONFIG)).start()
    try:
        first = _tokens(_run(core, "a", range(1, 40), max_tokens=8, seed=7))
        again = _tokens(_run(core, "b", range(1, 40), max_tokens=8, seed=7))
        other = _tokens(_run(core, "c", range(1, 40), max_tokens=8, seed=8))
        core.check_integrity()
    finally:
        core.stop()
    assert first == again
    assert first != other


def test_sim_tokens_are_printable_bytes_so_outputs_run_to_max_tokens():
    """A sampled stop token would cut outputs short of the trace's output lengths."""
    core = EngineCore(SIM_CONFIG, compute=SimCompute(SIM_CONFIG)).start()
    eos = 257  # the byte tokenizer's <|eos|>
    try:
        outputs = _run(core, "a", range(1, 30), max_tokens=40, stop_token_ids=(eos,))
        core.check_integrity()
    finally:
        core.stop()
    tokens = _tokens(outputs)
    assert len(tokens) == 40 and all(32 <= t < 127 for t in tokens)
    assert outputs[-1].finish_reason == "length"


def test_registry_builds_the_sim_backend_and_names_unknown_ones():
    """`compute_backend: sim` must select the cost model, and a typo must say what exists."""
    assert isinstance(make_compute(SIM_CONFIG), SimCompute)
    with pytest.raises(ValueError, match=r"unknown 'simm'; known: \['sim', 'torch'\]"):
        make_compute(dataclasses.replace(SIM_CONFIG, compute_backend="simm"))


def test_negative_time_scale_is_refused_with_its_value():
    """A negative sleep factor would crash the core thread at its first step."""
    with pytest.raises(ValueError, match=r"sim_time_scale must be >= 0, got -1\.0"):
        EngineConfig(compute_backend="sim", sim_time_scale=-1.0)


def test_engine_command_flags_select_sim_and_its_settings():
    """`kvfleet engine --compute-backend sim` must reach the engine config."""
    args = build_parser().parse_args(
        ["engine", "--compute-backend", "sim", "--sim-time-scale", "0.25", "--sim-costs", "c.yaml"]
    )
    config = engine_config_from_args(args)
    assert (config.compute_backend, config.sim_time_scale, config.sim_costs_path) == (
        "sim",
        0.25,
        "c.yaml",
    )


@pytest.fixture(scope="module")
def sim_rank():
    rank = EngineRank(SIM_CONFIG, RankAddresses(http_port=0, rank_id="sim-0")).start()
    yield rank
    rank.core.check_integrity()
    rank.stop(grace=0.5)


def _http_completion(rank: EngineRank, conversation: str, prompt: list[int]) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0.0}
    headers = {"X-Conversation-Id": conversation}
    url = f"http://127.0.0.1:{rank.http_port}/v1/completions"
    response = httpx.post(url, json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_second_turn_over_http_reports_cached_tokens(sim_rank):
    """Without real reuse on a sim rank, peers and kvfleet could not be compared on it."""
    prompt = list(range(1, 120))
    first = _http_completion(sim_rank, "http-a", prompt)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    output = list(first["choices"][0]["text"].encode())
    second = _http_completion(sim_rank, "http-a", [*prompt, *output, 7, 8, 9])
    assert second["usage"]["prompt_tokens"] == 128
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 112
    sim_rank.core.check_integrity()


def _grpc_generate(rank: EngineRank, conversation: str, prompt: list[int]):
    with grpc.insecure_channel(f"127.0.0.1:{rank.grpc_port}") as channel:
        request = engine_pb2.EngineGenerateRequest(
            request_id=f"{conversation}-{len(prompt)}",
            conversation_id=conversation,
            prompt_token_ids=common_pb2.TokenIds(ids=prompt),
            sampling=common_pb2.SamplingParams(temperature=0.0),
            max_tokens=6,
        )
        chunks = list(engine_pb2_grpc.EngineStub(channel).Generate(request, timeout=30))
    return [t for c in chunks for t in c.token_ids], chunks[-1]


def test_second_turn_over_grpc_reports_cached_tokens(sim_rank):
    """The router's path to a sim rank (gRPC Generate) must carry reuse in its usage."""
    prompt = list(range(3, 122))
    output, last = _grpc_generate(sim_rank, "grpc-a", prompt)
    assert (len(output), last.finished, last.usage.cached_tokens) == (6, True, 0)
    _, last2 = _grpc_generate(sim_rank, "grpc-a", [*prompt, *output, 7, 8, 9])
    assert (last2.usage.prompt_tokens, last2.usage.cached_tokens) == (128, 112)
    sim_rank.core.check_integrity()
