"""The OpenAI request bodies as typed models: what FastAPI validates and publishes in OpenAPI.

Field names are OpenAI's. Flags are strict booleans: `"yes"` or `1` is a 400 naming the field,
not a guess at what the client meant. Every string refuses lone surrogates (they cannot be
tokenized), every float refuses NaN/Infinity, token ids fit the proto's uint32, counts fit
its int32.
kvfleet extensions: `stop_token_ids`, `ignore_eos`, `conversation_id`, `repetition_penalty`,
`cache_salt`, `branch_hints`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool

from ..request.request_inputs import MAX_BRANCH_HINTS, MAX_STOP_CHARS, MAX_STOP_STRINGS
from ..request.sampling_params import MAX_TOP_LOGPROBS

MAX_ID_CHARS = 256
MAX_SAMPLES = 128


def _encodable(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"not valid Unicode (a lone surrogate at {error.start})") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]
ShortText = Annotated[str, Field(max_length=MAX_ID_CHARS), AfterValidator(_encodable)]
StopText = Annotated[str, Field(max_length=MAX_STOP_CHARS), AfterValidator(_encodable)]
TokenId = Annotated[int, Field(ge=0, lt=2**32)]
Position = Annotated[int, Field(ge=1, lt=2**32)]  # a token position in the prompt
Finite = Field(allow_inf_nan=False)


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` adds a last chunk with the usage."""

    include_usage: StrictBool = False


class _Common(BaseModel):
    """Fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")

    model: ShortText
    max_tokens: Annotated[int | None, Field(ge=1, lt=2**31)] = None
    n: Annotated[int, Field(ge=1, le=MAX_SAMPLES)] = 1
    temperature: Annotated[float | None, Finite, Field(ge=0, le=100)] = None
    top_p: Annotated[float | None, Finite, Field(gt=0, le=1)] = None
    seed: Annotated[int | None, Field(ge=0, lt=2**63)] = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=1024)] | None = None
    ignore_eos: StrictBool = False
    # vLLM's: each choice carries the ids it generated, and a stream sends every step's ids
    # even while their text is held back (a partial character): a client times tokens, not text.
    return_token_ids: StrictBool = False
    presence_penalty: Annotated[float | None, Finite, Field(ge=-2, le=2)] = None
    frequency_penalty: Annotated[float | None, Finite, Field(ge=-2, le=2)] = None
    repetition_penalty: Annotated[float | None, Finite, Field(gt=0, le=10)] = None
    user: ShortText | None = Field(
        None, description="the tenant: never the conversation (docs/api.md, identity order)"
    )
    conversation_id: ShortText | None = None
    prompt_cache_key: ShortText | None = Field(
        None, description="names the conversation when no header does (docs/api.md)"
    )
    # Accepted for OpenAI clients; retention follows the engine's reuse policy, not this.
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    cache_salt: ShortText | None = Field(
        None, description="requests share cached prompt blocks only with the same salt"
    )
    branch_hints: Annotated[list[Position], Field(max_length=MAX_BRANCH_HINTS)] | None = Field(
        None,
        description="prompt positions (tokens) where later turns are likely to branch off; a "
        "chat request gets the end of its system messages and tools when it sets none",
    )
    # Checked and honoured in openai_tools.py (chat only).
    tools: list[dict[str, Any]] | None = None
    tool_choice: Text | dict[str, Any] | None = None
    # A JSON answer (json_object, json_schema): constrained (openai_tools.openai_ask).
    response_format: dict[str, Any] | None = None
    # Accepted so that a request using it is refused by name, never silently ignored.
    logit_bias: dict[str, Annotated[float, Finite]] | None = None

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        return tuple(s for s in stops if s)


class CompletionRequest(_Common):
    """`POST /v1/completions`."""

    prompt: (
        Text
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Text], Field(min_length=1, max_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(max_length=1)]
    ) = Field(description="one prompt: text or token ids (a list of one of either is also one)")
    logprobs: Annotated[int | None, Field(ge=0, le=MAX_TOP_LOGPROBS)] = None
    echo: StrictBool = False
    suffix: Text | None = None
    best_of: Annotated[int | None, Field(ge=1, le=MAX_SAMPLES)] = None


class TextPart(BaseModel):
    """A text content part; other part types (images, audio) are not supported."""

    type: Literal["text"]
    text: Text


class ChatMessage(BaseModel):
    """One message: `content` is a string or a list of text parts."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: ShortText | None = None
    tool_calls: list[dict[str, Any]] | None = None  # earlier turns' calls, for the template
    tool_call_id: ShortText | None = None


class ChatCompletionRequest(_Common):
    """`POST /v1/chat/completions`."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int | None, Field(ge=1, lt=2**31)] = None
    parallel_tool_calls: StrictBool | None = None  # false: at most one constrained call
    logprobs: StrictBool = False
    top_logprobs: Annotated[int | None, Field(ge=0, le=MAX_TOP_LOGPROBS)] = None
