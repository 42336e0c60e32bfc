"""The conversation id from what harnesses send, in docs/api.md's order: kvfleet's header, the
harnesses' session headers, `prompt_cache_key`, `conversation_id`, Claude Code's session in
`metadata.user_id`, else a hash of the conversation's opening; `user` never names one."""

from __future__ import annotations

import pytest
from kvfleet.services.engine.api.session_identity import (
    SESSION_HEADERS,
    PrefixParts,
    conversation_of,
    session_of_user_id,
)
from kvfleet.services.engine.request.engine_request import InvalidRequestError

CLAUDE_USER_ID = (
    "user_5f1d0c0ffee0a1b2c3d4e5f60718293a4b5c6d7e8f9001122334455667788990_account_"
    "0b9e4d1a-2c3f-4e5a-9b8c-7d6e5f4a3b2c_session_3f2a1b0c-9d8e-4f7a-8b6c-5d4e3f2a1b0c"
)
OPENING = PrefixParts(tools=[{"name": "bash"}], system=["be brief"], first_user="fix the bug")


def test_every_source_in_order_wins_over_the_ones_after_it():
    """A later source overriding an earlier one would move a conversation between ranks."""
    headers = {"x-conversation-id": "kv", **{header: f"h-{header}" for header in SESSION_HEADERS}}
    body = {"prompt_cache_key": "pck", "conversation_id": "cid"}
    body["anthropic_user_id"] = CLAUDE_USER_ID
    # Everything present: drop the winner each time and the next source in the order wins.
    for header in headers.copy():
        assert conversation_of(headers, prefix=OPENING, **body) == headers[header]
        del headers[header]
    for field, expected in [
        ("prompt_cache_key", "pck"),
        ("conversation_id", "cid"),
        ("anthropic_user_id", "3f2a1b0c-9d8e-4f7a-8b6c-5d4e3f2a1b0c"),
    ]:
        assert conversation_of({}, prefix=OPENING, **body) == expected
        del body[field]
    assert conversation_of({}, prefix=OPENING) == OPENING.identity()
    assert conversation_of({}) is None


@pytest.mark.parametrize("header", ["X-Conversation-Id", *SESSION_HEADERS])
def test_each_header_alone_names_the_conversation(header):
    from starlette.datastructures import Headers

    headers = Headers(headers={header.title(): "sess-1"})  # case as a client may send it
    assert conversation_of(headers, prefix=OPENING) == "sess-1"


@pytest.mark.parametrize(
    ("user_id", "session"),
    [
        (CLAUDE_USER_ID, "3f2a1b0c-9d8e-4f7a-8b6c-5d4e3f2a1b0c"),
        ('{"device_id": "d", "session_id": "s-123"}', "s-123"),
        ("alice@example.com", None),  # a person, not a conversation
        ("user_abc_account_def", None),
        ("", None),
        ("{not json", None),
    ],
)
def test_only_the_session_part_of_a_user_id_names_a_conversation(user_id, session):
    assert session_of_user_id(user_id) == session


def test_the_prefix_identity_is_stable_across_turns_and_differs_by_opening():
    """Turn 2 resends the opening unchanged, so it must hash the same; another first message
    or another tenant is another conversation."""
    same = PrefixParts(tools=[{"name": "bash"}], system=["be brief"], first_user="fix the bug")
    assert same.identity() == OPENING.identity() and OPENING.identity().startswith("prefix-")
    for other in (
        PrefixParts(tools=[{"name": "bash"}], system=["be brief"], first_user="add a test"),
        PrefixParts(tools=None, system=["be brief"], first_user="fix the bug"),
        PrefixParts(tools=[{"name": "bash"}], system=["be long"], first_user="fix the bug"),
        PrefixParts(OPENING.tools, OPENING.system, OPENING.first_user, tenant="bob"),
    ):
        assert other.identity() != OPENING.identity()
    assert PrefixParts(tools=None, system=["only system"]).identity() is None


def test_an_id_over_the_limit_is_refused_naming_its_source():
    with pytest.raises(InvalidRequestError) as error:
        conversation_of({"x-session-id": "s" * 300})
    assert error.value.field == "x-session-id"


class RecordingBackend:
    """A backend that records each request and answers one token."""

    def __init__(self) -> None:
        from kvfleet.services.engine.model.tokenizer import ByteTokenizer

        self.tokenizer = ByteTokenizer()
        self.model_names = ("kvfleet",)
        self.model_card: dict[str, int] = {}
        self.max_request_tokens = None
        self.calls: list = []

    async def generate(self, request):
        from kvfleet.services.engine.request.engine_request import SampleOutput, Usage

        self.calls.append(request)
        usage = Usage(len(request.prompt_token_ids), 0, 1, 0.0, 0.0)
        yield SampleOutput(request.request_id, 0, (65,), True, "length", usage)


@pytest.mark.parametrize(
    ("extra", "conversation"),
    [
        ({"prompt_cache_key": "pck-1", "user": "alice"}, "pck-1"),
        ({"conversation_id": "cid-1", "user": "alice"}, "cid-1"),
        ({"user": "alice", "prompt_cache_retention": "24h"}, "prefix-"),  # a tenant only
    ],
)
def test_the_openai_chat_path_takes_the_order_and_never_the_user(extra, conversation):
    from fastapi.testclient import TestClient
    from kvfleet.services.engine.api.openai_http import build_app

    backend = RecordingBackend()
    body = {"model": "kvfleet", "messages": [{"role": "user", "content": "hi"}], **extra}
    with TestClient(build_app(backend)) as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 200
    assert backend.calls[0].conversation_id.startswith(conversation)
