"""`kvfleet up`'s flags reach the fleet, and its one /metrics page shows what the platform did:
pins, deferrals, reuse per rank and the KV tiers."""

from __future__ import annotations

import httpx
from kvfleet.services.cli import build_parser
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig
from kvfleet.services.fleet.up import fleet_config
from prometheus_client.parser import text_string_to_metric_families


def test_up_flags_reach_the_fleet_config() -> None:
    """If this fails, `kvfleet up` ignores --affinity, --compute-backend, --model-path,
    --metrics-port or --kv-cache-dtype."""
    args = build_parser().parse_args(
        ["up", "--affinity", "lenient", "--compute-backend", "sim", "--model", "8b",
         "--model-path", "/models/m", "--metrics-port", "-1", "--placement", "prefix",
         "--kv-cache-dtype", "fp8_e4m3"]
    )  # fmt: skip
    config = fleet_config(args)
    assert config.admission.affinity == "lenient" and config.admission.placement == "prefix"
    assert config.engine.compute_backend == "sim" and config.engine.model_path == "/models/m"
    assert config.engine.max_num_batched_tokens == 8192  # sim's step budget by default
    assert config.metrics_port is None
    assert config.engine.kv_cache_dtype == "fp8_e4m3"
    assert fleet_config(build_parser().parse_args(["up"])).metrics_port == 9400


def samples(text: str) -> dict[str, list]:
    """Metric name -> its samples (name, labels, value)."""
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_one_metrics_page_shows_pins_reuse_and_tiers_per_rank() -> None:
    """If this fails, the main job's /metrics lacks the router's pins and deferrals, or the
    ranks' reuse and tier counters, or mixes the ranks' series together."""
    engine = EngineConfig(compute_backend="sim", sim_time_scale=0.0, max_batch_size=2)
    fleet = EmbeddedFleet(FleetConfig(engine, num_ranks=2, redis_url=None, metrics_port=0))
    fleet.start(timeout=60.0)
    try:
        with httpx.Client(base_url=fleet.http_base_url, timeout=60.0) as client:
            prompt = list(range(40, 40 + 96))
            for _ in range(2):
                response = client.post(
                    "/completions",
                    json={"model": "kvfleet", "prompt": prompt, "max_tokens": 4},
                    headers={"X-Conversation-Id": "conversation-a"},
                )
                assert response.status_code == 200, response.text
                prompt = prompt + [7] * 4 + list(range(200, 232))
        page = httpx.get(f"http://127.0.0.1:{fleet.metrics_port}/metrics", timeout=10.0).text
    finally:
        fleet.stop()
    metrics = samples(page)
    hits = [s for s in metrics["kvfleet_router_pinned_hits"] if s.name.endswith("_total")]
    assert hits[0].value == 1  # the second turn went to its pinned rank
    assert "kvfleet_router_deferrals" in metrics
    cached = {
        s.labels["rank"]: s.value
        for s in metrics["kvfleet_engine_cached_tokens"]
        if s.name.endswith("_total")
    }
    assert set(cached) == {"rank-0", "rank-1"} and sum(cached.values()) >= 96 - 16
    tiers = {(s.labels["rank"], s.labels["tier"]) for s in metrics["kvfleet_engine_kv_tier_hits"]}
    assert ("rank-0", "device") in tiers and ("rank-1", "device") in tiers
