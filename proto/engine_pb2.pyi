from kvfleet.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefetchRequest(_message.Message):
    __slots__ = ("conversation_id", "hold_seconds", "prompt_token_ids")
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    HOLD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    conversation_id: str
    hold_seconds: float
    prompt_token_ids: _common_pb2.TokenIds
    def __init__(self, conversation_id: _Optional[str] = ..., hold_seconds: _Optional[float] = ..., prompt_token_ids: _Optional[_Union[_common_pb2.TokenIds, _Mapping]] = ...) -> None: ...

class PrefetchReply(_message.Message):
    __slots__ = ("held", "host_blocks", "disk_blocks")
    HELD_FIELD_NUMBER: _ClassVar[int]
    HOST_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DISK_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    held: bool
    host_blocks: int
    disk_blocks: int
    def __init__(self, held: _Optional[bool] = ..., host_blocks: _Optional[int] = ..., disk_blocks: _Optional[int] = ...) -> None: ...

class EngineGenerateRequest(_message.Message):
    __slots__ = ("request_id", "conversation_id", "prompt_token_ids", "prompt_text", "sampling", "max_tokens", "num_samples", "kv_source_address", "handoff_token_ids", "cache_salt", "branch_hints", "retention_seconds", "kv_home_address", "kv_source_request_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    KV_SOURCE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    BRANCH_HINTS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    KV_HOME_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    KV_SOURCE_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    conversation_id: str
    prompt_token_ids: _common_pb2.TokenIds
    prompt_text: str
    sampling: _common_pb2.SamplingParams
    max_tokens: int
    num_samples: int
    kv_source_address: str
    handoff_token_ids: _containers.RepeatedScalarFieldContainer[int]
    cache_salt: str
    branch_hints: _containers.RepeatedScalarFieldContainer[int]
    retention_seconds: int
    kv_home_address: str
    kv_source_request_id: str
    def __init__(self, request_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Union[_common_pb2.TokenIds, _Mapping]] = ..., prompt_text: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_tokens: _Optional[int] = ..., num_samples: _Optional[int] = ..., kv_source_address: _Optional[str] = ..., handoff_token_ids: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[str] = ..., branch_hints: _Optional[_Iterable[int]] = ..., retention_seconds: _Optional[int] = ..., kv_home_address: _Optional[str] = ..., kv_source_request_id: _Optional[str] = ...) -> None: ...

class KvPullRequest(_message.Message):
    __slots__ = ("request_id", "block_hashes", "prompt_token_ids", "cache_salt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    prompt_token_ids: _common_pb2.TokenIds
    cache_salt: str
    def __init__(self, request_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[int]] = ..., prompt_token_ids: _Optional[_Union[_common_pb2.TokenIds, _Mapping]] = ..., cache_salt: _Optional[str] = ...) -> None: ...

class KvBlockData(_message.Message):
    __slots__ = ("block_hash", "layer_group", "data", "crc32", "block_index")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    LAYER_GROUP_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    block_hash: int
    layer_group: int
    data: bytes
    crc32: int
    block_index: int
    def __init__(self, block_hash: _Optional[int] = ..., layer_group: _Optional[int] = ..., data: _Optional[bytes] = ..., crc32: _Optional[int] = ..., block_index: _Optional[int] = ...) -> None: ...
