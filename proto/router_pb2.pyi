from kvfleet.proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "conversation_id", "prompt_token_ids", "prompt_text", "sampling", "max_tokens", "rank_id", "relax_rank", "child_samples", "cache_salt", "branch_hints", "retention_seconds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CONVERSATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    RELAX_RANK_FIELD_NUMBER: _ClassVar[int]
    CHILD_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    BRANCH_HINTS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_SECONDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    conversation_id: str
    prompt_token_ids: _common_pb2.TokenIds
    prompt_text: str
    sampling: _common_pb2.SamplingParams
    max_tokens: int
    rank_id: str
    relax_rank: bool
    child_samples: int
    cache_salt: str
    branch_hints: _containers.RepeatedScalarFieldContainer[int]
    retention_seconds: int
    def __init__(self, request_id: _Optional[str] = ..., conversation_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Union[_common_pb2.TokenIds, _Mapping]] = ..., prompt_text: _Optional[str] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_tokens: _Optional[int] = ..., rank_id: _Optional[str] = ..., relax_rank: _Optional[bool] = ..., child_samples: _Optional[int] = ..., cache_salt: _Optional[str] = ..., branch_hints: _Optional[_Iterable[int]] = ..., retention_seconds: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("chunk", "rank_id", "placement")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    chunk: _common_pb2.GenerationChunk
    rank_id: str
    placement: str
    def __init__(self, chunk: _Optional[_Union[_common_pb2.GenerationChunk, _Mapping]] = ..., rank_id: _Optional[str] = ..., placement: _Optional[str] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("rank_id", "address", "max_batch_size", "role", "block_size")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    address: str
    max_batch_size: int
    role: _common_pb2.RankRole
    block_size: int
    def __init__(self, rank_id: _Optional[str] = ..., address: _Optional[str] = ..., max_batch_size: _Optional[int] = ..., role: _Optional[_Union[_common_pb2.RankRole, str]] = ..., block_size: _Optional[int] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("heartbeat_interval_seconds",)
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_seconds: float
    def __init__(self, heartbeat_interval_seconds: _Optional[float] = ...) -> None: ...

class RankLoad(_message.Message):
    __slots__ = ("free_slots", "queued", "kv_usage", "draining", "leaving")
    FREE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    KV_USAGE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    LEAVING_FIELD_NUMBER: _ClassVar[int]
    free_slots: int
    queued: int
    kv_usage: float
    draining: bool
    leaving: bool
    def __init__(self, free_slots: _Optional[int] = ..., queued: _Optional[int] = ..., kv_usage: _Optional[float] = ..., draining: _Optional[bool] = ..., leaving: _Optional[bool] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("rank_id", "load")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    load: RankLoad
    def __init__(self, rank_id: _Optional[str] = ..., load: _Optional[_Union[RankLoad, _Mapping]] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("registered",)
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    registered: bool
    def __init__(self, registered: _Optional[bool] = ...) -> None: ...

class BlocksStored(_message.Message):
    __slots__ = ("block_hashes", "parent_block_hash", "token_ids", "root_hash")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    parent_block_hash: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    root_hash: int
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ..., parent_block_hash: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., root_hash: _Optional[int] = ...) -> None: ...

class BlocksRemoved(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class AllBlocksCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("stored", "removed", "cleared")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    stored: BlocksStored
    removed: BlocksRemoved
    cleared: AllBlocksCleared
    def __init__(self, stored: _Optional[_Union[BlocksStored, _Mapping]] = ..., removed: _Optional[_Union[BlocksRemoved, _Mapping]] = ..., cleared: _Optional[_Union[AllBlocksCleared, _Mapping]] = ...) -> None: ...

class KvEventBatch(_message.Message):
    __slots__ = ("rank_id", "events")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    def __init__(self, rank_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ...) -> None: ...

class KvEventsAck(_message.Message):
    __slots__ = ("events_applied",)
    EVENTS_APPLIED_FIELD_NUMBER: _ClassVar[int]
    events_applied: int
    def __init__(self, events_applied: _Optional[int] = ...) -> None: ...
