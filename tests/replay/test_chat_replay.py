"""Replaying through the agent path: the synthesised prompt as a text chat (`--api chat`) and as
Claude Code's Messages request (`--api anthropic`), and their reuse on a live fleet.

The live part runs a real `EmbeddedFleet` (router, two sim ranks, the HTTP front) and replays
one Claude Code session three ways: OpenAI chat with `X-Conversation-Id`, Messages with the
session in `metadata.user_id`, and Messages with no session at all (the prefix identity).
All three send the same content, so all three must reuse the same tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvfleet.services.cli import main
from kvfleet.services.engine.api.anthropic_cache import breakpoints_of
from kvfleet.services.engine.api.anthropic_chat import Cut
from kvfleet.services.engine.api.anthropic_schema import MessagesRequest
from kvfleet.services.engine.api.session_identity import session_of_user_id
from kvfleet.services.engine.config.engine_config import EngineConfig
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.model.model_dir import write_model_dir
from kvfleet.services.fleet.embedded import EmbeddedFleet, FleetConfig
from kvfleet.services.replay.chat_text import chat_text, token_text
from kvfleet.services.replay.claude_code import read_claude_code
from kvfleet.services.replay.messages_target import AnthropicMessagesTarget
from kvfleet.services.replay.prompt_layout import layout_of, shared_end
from kvfleet.services.replay.target import open_target
from kvfleet.services.replay.target_types import TargetOptions, TargetUnavailable
from kvfleet.services.replay.tokens import TokenSynthesizer
from replay_paths import CLAUDE_CODE

SESSION = CLAUDE_CODE / "trace_0242.json"  # 3 turns of 15k-20k prompt tokens, no sub-agents


def chats_of_session():
    """The text chat of every turn of SESSION, as the driver lays them out."""
    conversation = read_claude_code(SESSION)
    synthesizer = TokenSynthesizer(seed=0, vocab_size=128256)
    ends: list[int] = []
    chats = []
    for turn in conversation.turns():
        tokens = synthesizer.turn_tokens(conversation.conversation_id, turn)
        chats.append((tokens, chat_text(tokens, layout_of(turn, ends))))
        ends.append(shared_end(turn))
    return chats


def test_a_chat_holds_the_whole_prompt_and_keeps_its_first_message():
    """If the text drops or reorders tokens, chat reuse says nothing of the trace's; if the
    first user message changes from turn to turn, a header-less client loses its identity."""
    chats = chats_of_session()
    for tokens, chat in chats:
        assert chat.tools and chat.system and len(chat.tools) == 11899  # the trace's tool_tokens
        assert chat.tools + chat.system + "".join(chat.messages) == token_text(tokens)
    firsts = {chat.messages[0] for _tokens, chat in chats}
    assert len(firsts) == 1
    counts = [len(chat.messages) for _tokens, chat in chats]
    assert counts == [2, 3, 4]  # a turn's unique tail is a message of its own


def test_the_messages_body_has_claude_codes_breakpoints_and_session():
    """Claude Code marks the end of the tools, of the system prompt and of the last message,
    and names its session in metadata.user_id; the server must read both as it would from
    Claude Code, with no conversation header."""
    _tokens, chat = chats_of_session()[1]
    target = AnthropicMessagesTarget("http://127.0.0.1:1", model="m")
    body = MessagesRequest.model_validate(target.request_body(chat, "claude_code/s1", 8))
    cuts = [point.cut for point in breakpoints_of(body)]
    assert cuts == [Cut("tools", 0), Cut("system", 0), Cut("messages", 2, 0)]
    session = session_of_user_id(body.metadata.user_id)
    assert session and session == session_of_user_id(
        target.request_body(chat, "claude_code/s1", 8)["metadata"]["user_id"]
    )
    assert session != session_of_user_id(
        target.request_body(chat, "claude_code/s2", 8)["metadata"]["user_id"]
    )
    prefix_only = AnthropicMessagesTarget("http://127.0.0.1:1", model="m", session="prefix")
    assert "metadata" not in prefix_only.request_body(chat, "claude_code/s1", 8)


# ChatML whose system turn holds the tools (their descriptions, where the replay puts their
# text) before the system prompt, in the Messages API's order: a template without tools would
# drop the trace's tool tokens from every chat prompt.
CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
# Tools
{% for tool in tools %}{{ tool.function.description }}
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def model_dir(path: Path) -> Path:
    """The 8b preset without weights (the sim backend needs none), with CHAT_TEMPLATE."""
    write_model_dir(path, preset("8b"))
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path


def test_the_chat_apis_need_an_http_target():
    """If this fails, `--api anthropic` against a simulator replays token ids and labels the
    run as the agent path."""
    with pytest.raises(TargetUnavailable, match="needs an http:// target"):
        open_target("sim", TargetOptions(api="anthropic"))


def sim_fleet(path: Path) -> EmbeddedFleet:
    engine = EngineConfig(model="8b", model_path=str(model_dir(path)), compute_backend="sim",
                          sim_time_scale=0.0, max_batch_size=2,
                          max_num_batched_tokens=8192)  # fmt: skip
    return EmbeddedFleet(FleetConfig(engine, num_ranks=2, redis_url=None))


def replayed(out: Path, *api: str) -> dict:
    """The measures of one replay of SESSION on a fresh fleet: a cache warmed by another arm's
    identical content would make every arm reuse everything. Every turn's record names the
    rank the router's answer named, one for the whole session."""
    fleet = sim_fleet(out.parent / f"model-{out.stem}").start(timeout=60.0)
    records = out.with_suffix(".jsonl")
    try:
        code = main(
            ["replay", str(SESSION), "--target", fleet.http_base_url, "--json", str(out),
             "--time-scale", "0", "--stagger", "0", "--no-progress", "--seed", "0",
             "--records", str(records), *api]
        )  # fmt: skip
    finally:
        fleet.stop()
    assert code == 0
    ranks = {json.loads(line)["rank"] for line in records.read_text().splitlines()}
    assert len(ranks) == 1 and ranks <= {"rank-0", "rank-1"}
    return json.loads(out.read_text())


@pytest.mark.slow  # a live two-rank fleet and three replays of 52k prompt tokens each
def test_messages_without_a_header_reuse_what_chat_with_one_does(tmp_path):
    """If this fails, Claude Code pointed at the fleet (no kvfleet header) loses reuse the
    OpenAI path keeps: its turns land on another rank, or the identity moves between turns."""
    chat = replayed(tmp_path / "chat.json", "--api", "chat")
    messages = replayed(tmp_path / "messages.json", "--api", "anthropic")
    prefix = replayed(tmp_path / "prefix.json", "--api", "anthropic",
                      "--anthropic-session", "prefix")  # fmt: skip
    assert chat["requests"] == messages["requests"] == prefix["requests"] == 3
    assert chat["reused_tokens"] > 0
    assert chat["prompt_tokens"] > 52760  # the trace's tokens, tools included, and the framing
    assert messages["prompt_tokens"] == chat["prompt_tokens"] == prefix["prompt_tokens"]
    assert messages["reused_tokens"] == chat["reused_tokens"] == prefix["reused_tokens"]
    assert messages["config"]["api"] == "anthropic" and chat["config"]["api"] == "chat"
