"""Schemathesis against the published OpenAPI of the Messages routes: no fuzzed request gets a
5xx, and every refusal is Anthropic's error body (never OpenAI's)."""

from __future__ import annotations

import pytest
import requests
import schemathesis
from engine_testkit import TEST_CONFIG
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from schemathesis import GenerationMode

MESSAGES_PATHS = ("/v1/messages", "/v1/messages/count_tokens")


@pytest.fixture(scope="module")
def rank_url():
    rank = EngineRank(TEST_CONFIG, RankAddresses(http_port=0, rank_id="messages-fuzz")).start()
    yield f"http://127.0.0.1:{rank.http_port}"
    rank.core.check_integrity()
    rank.stop(grace=0.5)


@pytest.mark.slow
def test_messages_routes_never_answer_5xx_or_an_openai_error_to_fuzzed_requests(rank_url):
    schema = schemathesis.openapi.from_url(f"{rank_url}/openapi.json")
    operations = [
        result.ok() for result in schema.get_all_operations() if result.ok().path in MESSAGES_PATHS
    ]
    assert {op.path for op in operations} == set(MESSAGES_PATHS)
    strategy = st.one_of(
        [op.as_strategy(generation_mode=mode) for op in operations for mode in GenerationMode]
    )
    failures: list[str] = []
    session = requests.Session()

    @settings(max_examples=80, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=strategy, runnable=st.booleans())
    def send(case, runnable: bool) -> None:
        if runnable and isinstance(case.body, dict):
            case.body["model"] = "tiny"  # else most bodies stop at the model name
            if isinstance(case.body.get("max_tokens"), int):
                case.body["max_tokens"] = max(1, min(case.body["max_tokens"], 4))
        response = case.call(base_url=rank_url, session=session, timeout=60)
        refused = response.status_code >= 400 and response.json().get("type") != "error"
        if response.status_code >= 500 or refused:
            failures.append(f"{response.status_code} {case.path} {case.body!r:.300}: "
                            f"{response.text[:300]}")  # fmt: skip

    send()
    assert failures == []
