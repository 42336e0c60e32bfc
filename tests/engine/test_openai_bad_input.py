"""Bad input to the HTTP API is a 4xx whose `param` names the client's field, on both fronts.

The fronts: an engine rank's HTTP app, and the fleet's (the router's gRPC Generate behind it),
where engine and router refusals must still name OpenAI fields (`n`, not `child_samples`) and
a large prompt must meet the router's limit, not gRPC's message size.
"""

from __future__ import annotations

import json

import httpx
import pytest
from engine_testkit import TEST_CONFIG
from kvfleet.services.engine.rank.engine_rank import EngineRank, RankAddresses
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig


@pytest.fixture(scope="module", params=["rank", "fleet"])
def http(request):
    if request.param == "rank":
        rank = EngineRank(TEST_CONFIG, RankAddresses(http_port=0, rank_id="bad-input")).start()
        base, stop = f"http://127.0.0.1:{rank.http_port}", lambda: rank.stop(grace=0.5)
    else:
        fleet = EmbeddedFleet(FleetConfig(TEST_CONFIG, num_ranks=1, redis_url=None)).start()
        base, stop = fleet.http_base_url.removesuffix("/v1"), fleet.stop
    with httpx.Client(base_url=base, timeout=120) as client:
        yield client
    stop()


def post(http: httpx.Client, path: str, raw: str) -> httpx.Response:
    return http.post(path, content=raw.encode("utf-8", "surrogatepass"),
                     headers={"content-type": "application/json"})  # fmt: skip


COMPLETION = '{"model": "tiny", "max_tokens": 2, %s}'
CHAT = '{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], %s}'
NESTED = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("path", "raw", "param"),
    [
        ("/v1/completions", COMPLETION % '"prompt": [-1]', "prompt"),
        ("/v1/completions", COMPLETION % '"prompt": [4294967296]', "prompt"),
        ("/v1/completions", COMPLETION % '"prompt": [1000000]', "prompt"),
        ("/v1/completions", COMPLETION % '"prompt": "\\ud800"', "prompt"),
        ("/v1/completions", COMPLETION % '"prompt": "hi", "temperature": Infinity', "temperature"),
        ("/v1/completions", COMPLETION % '"prompt": "hi", "top_p": NaN', "top_p"),
        ("/v1/completions", COMPLETION % '"prompt": "hi", "stream_options": "yes"',
         "stream_options"),
        ("/v1/completions", COMPLETION % '"prompt": "hi", "stop_token_ids": 5', "stop_token_ids"),
        ("/v1/completions", COMPLETION % '"prompt": "hi", "n": 0', "n"),
        ("/v1/completions", COMPLETION % '"prompt": "hi", "n": 50', "n"),
        ("/v1/completions", COMPLETION % '"prompt": "hi", "max_tokens": 0', "max_tokens"),
        ("/v1/completions", COMPLETION % '"prompt": "hi", "max_tokens": 4096', "max_tokens"),
        ("/v1/completions", COMPLETION % '"prompt": "hi", "seed": -1', "seed"),
        ("/v1/completions", COMPLETION % f'"prompt": "hi", "stop": "{"x" * 1001}"', "stop"),
        ("/v1/completions", COMPLETION % f'"prompt": "hi", "tools": {NESTED}', None),
        ("/v1/chat/completions", COMPLETION % '"messages": ["hello"]', "messages[0]"),
        ("/v1/chat/completions", COMPLETION % '"messages": [{"role": "user", "content": 5}]',
         "messages[0].content"),
        ("/v1/chat/completions", CHAT % '"max_completion_tokens": 0', "max_completion_tokens"),
        ("/v1/chat/completions", CHAT % '"tool_choice": "required"', "tool_choice"),
        ("/v1/chat/completions", CHAT % '"tool_choice": {"type": "function"}', "tool_choice"),
        ("/v1/chat/completions", CHAT % '"tools": [{"type": "function", "function": {}}]',
         "tools[0].function.name"),
        ("/v1/chat/completions",
         CHAT % '"tools": [{"function": {"name": "f"}}], "tool_choice": '
                '{"type": "function", "function": {"name": "g"}}', "tool_choice"),
        ("/v1/chat/completions", CHAT % '"response_format": {"type": "xml"}',
         "response_format.type"),
        ("/v1/chat/completions", CHAT % '"response_format": {"type": "json_schema"}',
         "response_format.json_schema"),
        ("/v1/chat/completions",
         CHAT % '"response_format": {"type": "json_schema", "json_schema": {"name": "a", '
                '"schema": {"type": "nosuch"}}}', "response_format.json_schema.schema"),
        ("/v1/completions",
         COMPLETION % '"prompt": "hi", "response_format": {"type": "json_schema", '
                      '"json_schema": {"name": "a", "schema": {"$ref": "#/$defs/gone"}}}',
         "response_format.json_schema.schema"),
        ("/v1/chat/completions",
         CHAT % '"tools": [{"function": {"name": "f", "parameters": {"type": "nosuch"}}}], '
                '"tool_choice": "required"', "tools[0].function.parameters"),
        ("/v1/chat/completions",
         CHAT % '"tools": [{"function": {"name": "f", "strict": true, "parameters": '
                '{"properties": {"a": {"type": 5}}}}}]', "tools[0].function.parameters"),
        ("/v1/chat/completions", CHAT % '"top_logprobs": 3', "top_logprobs"),
    ],
)  # fmt: skip
def test_bad_input_is_400_naming_the_clients_field(http, path, raw, param):
    """A plain-text 500 or an internal field name (`sampling`, `child_samples`) leaves the
    client guessing what to fix."""
    response = post(http, path, raw)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert "sampling" not in error["message"] and "child_samples" not in error["message"]


def test_a_body_over_the_request_limit_is_413(http):
    """A 20 MB prompt once reached gRPC and came back as a 503 "message larger than max"."""
    body = json.dumps({"model": "tiny", "prompt": "x" * 20_000_000})
    response = post(http, "/v1/completions", body)
    assert response.status_code == 413
    assert "over the limit of 16777216 bytes" in response.json()["error"]["message"]


def test_a_prompt_past_the_limits_but_under_the_body_limit_is_400(http):
    """2.5 M token ids (5 MB as a proto, over gRPC's default 4 MB) must meet the fleet's own
    limit or the model's context: a 400 naming `prompt`, never a 503."""
    body = json.dumps({"model": "tiny", "prompt": [200] * 2_500_000, "max_tokens": 1})
    response = post(http, "/v1/completions", body)
    assert response.status_code == 400, response.text[:300]
    assert response.json()["error"]["param"] == "prompt"
