"""Which conversation a request belongs to, from whatever the client sends, in a fixed order.

The conversation id keys the router's pin (which rank holds its KV) and the engine's retained
turns, so agent harnesses that know nothing of kvfleet must still get one. In order:

1. the `X-Conversation-Id` header (kvfleet's own);
2. the harnesses' session headers: `x-claude-code-session-id`, `session-id`, `x-session-id`,
   `x-session-affinity`;
3. the OpenAI body's `prompt_cache_key`;
4. the body's `conversation_id` (a kvfleet extension);
5. the session part of Anthropic's `metadata.user_id` (Claude Code sends
   `user_<hash>_account_<uuid>_session_<uuid>`); any other user id names a person, not a
   conversation, and is ignored here;
6. a prefix identity: a hash of the tools, the system prompt and the first user message, which
   every turn of one conversation resends unchanged, so an unkeyed agent keeps its pin.

OpenAI's `user` is a tenant, never a conversation: two conversations of one user are two
conversations. It only keeps equal prefixes of different tenants apart in the prefix identity.
Pure functions of their inputs: no HTTP, no tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..request.engine_request import InvalidRequestError

MAX_ID_CHARS = 256
CONVERSATION_HEADER = "x-conversation-id"
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "x-session-id", "x-session-affinity")
PREFIX_ID_PREFIX = "prefix-"

# Claude Code's `metadata.user_id`: the session uuid is its last part.
_CLAUDE_CODE_SESSION = re.compile(r"(?:^|_)session_([0-9A-Za-z-]{8,64})$")


@dataclass(frozen=True)
class PrefixParts:
    """What every turn of one conversation resends unchanged: its opening."""

    tools: Any = None
    system: Any = None
    first_user: Any = None
    tenant: str | None = None  # OpenAI `user` / cache salt: equal openings of tenants differ

    def identity(self) -> str | None:
        """`prefix-<hash>`, or None when there is no user message to anchor it."""
        if self.first_user is None:
            return None
        canonical = json.dumps(
            [self.tenant, self.tools, self.system, self.first_user],
            sort_keys=True,
            ensure_ascii=False,
            separators=(",", ":"),
        )
        digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
        return PREFIX_ID_PREFIX + digest[:32]


def session_of_user_id(user_id: str | None) -> str | None:
    """The session uuid inside an Anthropic `metadata.user_id`, else None.

    Claude Code writes `user_<hash>_account_<uuid>_session_<uuid>`; some versions write a JSON
    object with a `session_id`. A plain user id is a person, so it gives no conversation.
    """
    if not user_id:
        return None
    match = _CLAUDE_CODE_SESSION.search(user_id)
    if match:
        return match.group(1)
    if user_id.startswith("{"):
        try:
            parsed = json.loads(user_id)
        except ValueError:
            return None
        session = parsed.get("session_id") if isinstance(parsed, dict) else None
        return str(session) if session else None
    return None


def conversation_of(
    headers: Mapping[str, str],
    *,
    prompt_cache_key: str | None = None,
    conversation_id: str | None = None,
    anthropic_user_id: str | None = None,
    prefix: PrefixParts | None = None,
) -> str | None:
    """The conversation id by the order above; None when nothing names or anchors one.

    `headers` is case-insensitive (Starlette's) or lower-cased. An id over MAX_ID_CHARS is an
    InvalidRequestError naming where it came from.
    """
    named: list[tuple[str, str | None]] = [
        ("X-Conversation-Id", headers.get(CONVERSATION_HEADER)),
        *((header, headers.get(header)) for header in SESSION_HEADERS),
        ("prompt_cache_key", prompt_cache_key),
        ("conversation_id", conversation_id),
        ("metadata.user_id", session_of_user_id(anthropic_user_id)),
    ]
    for source, value in named:
        if value:
            if len(value) > MAX_ID_CHARS:
                raise InvalidRequestError(source, f"{len(value)} chars > limit {MAX_ID_CHARS}")
            return value
    return prefix.identity() if prefix is not None else None
