"""A rank's /metrics carries vLLM's metric names, so what was built for vLLM reads it."""

from __future__ import annotations

import httpx
import pytest
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow


def test_vllm_names_report_the_ranks_own_figures():
    """If this fails, a KEDA/HPA rule or a Grafana board written for vLLM sees nothing (or
    other numbers than the rank's own) on a kvfleet rank."""
    config = EngineConfig(model="tiny", max_batch_size=2, page_size=16, kv_pages=64)
    rank = EngineRank(config, RankAddresses(http_port=0, metrics_port=0)).start()
    try:
        # ignore_eos: at temperature 1 the random tiny model samples a stop token now and then,
        # and a sample that ends early changes every count below.
        body = {"model": "tiny", "prompt": list(range(40, 90)), "max_tokens": 5, "ignore_eos": True}
        answer = httpx.post(f"http://127.0.0.1:{rank.http_port}/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        page = httpx.get(f"http://127.0.0.1:{rank.metrics_port}/metrics").text
    finally:
        rank.stop(grace=0.5)
    values = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
    }

    def value(name: str, **labels: str) -> float:
        return values[name, tuple(sorted({"model_name": "tiny", **labels}.items()))]

    assert value("vllm:prompt_tokens_total") == 50
    assert value("vllm:generation_tokens_total") == 5
    assert value("vllm:time_to_first_token_seconds_count") == 1
    assert value("vllm:time_per_output_token_seconds_count") == 4
    assert value("vllm:request_success_total", finished_reason="length") == 1
    assert value("vllm:num_requests_running") == 0
    assert value("vllm:num_requests_waiting") == 0
    assert 0 <= value("vllm:gpu_cache_usage_perc") == value("vllm:kv_cache_usage_perc") <= 1
    assert values["kvfleet_engine_prompt_tokens_total", ()] == 50  # its own names stay
