"""The Anthropic Messages request bodies as typed models (`POST /v1/messages`, `count_tokens`).

Field names are Anthropic's. Content blocks are `text`, `tool_use` and `tool_result` (whose
content is a string or text blocks); any other block type (images, documents, thinking) is
refused by name: the engine serves text models and would otherwise drop what the client sent.
Unknown top-level fields are ignored, as on the OpenAI routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag

from ..request.request_inputs import MAX_STOP_STRINGS
from .openai_schema import Finite, ShortText, StopText, Text

TTL_SECONDS = {"5m": 300, "1h": 3600}


class CacheControl(BaseModel):
    """A prompt-cache breakpoint: the prefix up to the end of the marked block is cached."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"

    @property
    def seconds(self) -> int:
        return TTL_SECONDS[self.ttl]


class _Block(BaseModel):
    model_config = ConfigDict(extra="ignore")

    cache_control: CacheControl | None = None


class TextBlock(_Block):
    type: Literal["text"]
    text: Text


class ToolUseBlock(_Block):
    """An earlier assistant turn's tool call."""

    type: Literal["tool_use"]
    id: ShortText
    name: ShortText
    input: dict[str, Any]


class ToolResultBlock(_Block):
    """What a tool returned, for the tool_use with id `tool_use_id`."""

    type: Literal["tool_result"]
    tool_use_id: ShortText
    content: Text | list[TextBlock] | None = None
    is_error: bool | None = None


def _block_type(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("text", "tool_use", "tool_result") else None


# Discriminated by `type`: an unknown type is one error naming the block, not three.
ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")],
    Discriminator(
        _block_type,
        custom_error_type="invalid_block_type",
        custom_error_message="block type must be text, tool_use or tool_result",
    ),
]


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["user", "assistant"]
    content: Text | list[ContentBlock]


class Tool(BaseModel):
    """A client tool: the model sees its name, description and JSON schema."""

    model_config = ConfigDict(extra="ignore")

    name: ShortText
    description: Text | None = None
    input_schema: dict[str, Any]
    cache_control: CacheControl | None = None
    strict: StrictBool | None = None  # true: a call's input is held to input_schema


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["auto", "any", "tool", "none"]
    name: ShortText | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(BaseModel):
    """Structured outputs: the answer is JSON valid against `schema` (constrained)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: OutputFormat | None = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="ignore")

    user_id: ShortText | None = None


class CountTokensRequest(BaseModel):
    """`POST /v1/messages/count_tokens`: what the prompt would be, without generating."""

    model_config = ConfigDict(extra="ignore")

    model: ShortText
    messages: Annotated[list[Message], Field(min_length=1)]
    system: Text | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    # Automatic caching: a breakpoint at the end of the last cacheable block.
    cache_control: CacheControl | None = None


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: Annotated[int, Field(ge=1, lt=2**31)]
    stop_sequences: Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: StrictBool = False  # strict: "yes" is a 400 naming the field, not a guess
    temperature: Annotated[float | None, Finite, Field(ge=0, le=1)] = None
    top_p: Annotated[float | None, Finite, Field(gt=0, le=1)] = None
    top_k: Annotated[int | None, Field(ge=0)] = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
