"""Schemathesis against the published OpenAPI of the HTTP API: no fuzzed request gets a 5xx.

Both fronts: an engine rank's HTTP app (the core in-process) and the fleet's front (the
router's gRPC Generate behind it). Examples are bounded and derandomized, so each run sends
the same requests.
"""

from __future__ import annotations

import pytest
import requests
import schemathesis
from engine_testkit import TEST_CONFIG
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig
from schemathesis import GenerationMode

pytestmark = pytest.mark.slow  # the slow lane (README: the test commands)
# A chat without max_tokens runs to the context's end: a short context keeps each case short.
FUZZ_CONFIG = TEST_CONFIG.with_changes(max_model_len=256)

FUZZ = settings(
    max_examples=70,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def rank_url():
    rank = EngineRank(FUZZ_CONFIG, RankAddresses(http_port=0, rank_id="fuzz-rank")).start()
    yield f"http://127.0.0.1:{rank.http_port}"
    rank.core.check_integrity()
    rank.stop(grace=0.5)


@pytest.fixture(scope="module")
def fleet_url():
    fleet = EmbeddedFleet(FleetConfig(FUZZ_CONFIG, num_ranks=1, redis_url=None)).start()
    yield fleet.http_base_url.removesuffix("/v1")
    fleet.stop()


def fuzz(base_url: str) -> list[str]:
    """Send derandomized positive and negative cases for every operation; the 5xx answers."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    openai_paths = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health")
    operations = [
        result.ok() for result in schema.get_all_operations() if result.ok().path in openai_paths
    ]
    assert {op.path for op in operations} == set(openai_paths)
    documented = requests.get(f"{base_url}/openapi.json", timeout=10).json()["components"]
    fields = documented["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"messages", "max_tokens", "max_completion_tokens", "stop", "n"} <= set(fields)
    strategy = st.one_of(
        [op.as_strategy(generation_mode=mode) for op in operations for mode in GenerationMode]
    )
    failures: list[str] = []
    session = requests.Session()

    @FUZZ
    @given(case=strategy, runnable=st.integers(0, 2))
    def send(case, runnable: int) -> None:
        if runnable and isinstance(case.body, dict):
            case.body["model"] = "tiny"  # else most bodies stop at the model name
            if runnable == 2:
                make_runnable(case.body)
        response = case.call(base_url=base_url, session=session, timeout=60)
        if response.status_code >= 500:
            failures.append(f"{response.status_code} {case.path} {case.body!r:.300}: "
                            f"{response.text[:300]}")  # fmt: skip

    send()
    return failures


REFUSED = ("tool_choice", "response_format", "logit_bias", "echo", "suffix", "best_of")


def make_runnable(body: dict) -> None:
    """Without refused parameters, short: a third of the cases reach generation with the
    fuzzed sampling values."""
    for name in REFUSED:
        body.pop(name, None)
    for name in ("max_tokens", "max_completion_tokens"):
        if isinstance(body.get(name), int):
            body[name] = min(body[name], 8)
    body.setdefault("max_tokens", 4)
    if body.get("prompt") in ("", [], [""], [[]]):
        body["prompt"] = "hello"
    if isinstance(body.get("n"), int):
        body["n"] = max(1, min(body["n"], 2))


def test_engine_http_api_never_answers_5xx_to_fuzzed_requests(rank_url):
    """77 of 587 fuzzed requests once got a plain-text 500 from an engine."""
    assert fuzz(rank_url) == []


def test_fleet_http_front_never_answers_5xx_to_fuzzed_requests(fleet_url):
    """105 fuzzed requests once got a 500 or 503 from the `kvfleet up` front."""
    assert fuzz(fleet_url) == []
