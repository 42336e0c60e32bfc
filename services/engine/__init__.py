"""The engine's compute half: a Llama-style decoder over a paged KV cache, attention backends,
sampling, tokenizers and weights. The serving half (scheduler, gRPC, HTTP) builds on these.

Names are loaded on first use (PEP 562), so that importing one light submodule (the `kvfleet`
command's parsers, say) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the submodule that defines it.
_EXPORTS: dict[str, str] = {
    "AttentionBackend": "attention",
    "available_backends": "attention",
    "make_backend": "attention",
    "AttentionMetadata": "batch",
    "ForwardBatch": "batch",
    "SequenceChunk": "batch",
    "FULL_GROUP": "config",
    "PRESETS": "config",
    "WINDOW_GROUP": "config",
    "ModelConfig": "config",
    "preset": "config",
    "Generation": "generation",
    "default_dtype": "generation",
    "generate": "generation",
    "PagedKVCache": "kv_cache",
    "CausalLM": "model",
    "SamplingParams": "sampling",
    "make_generator": "sampling",
    "sample_batch": "sampling",
    "sample_token": "sampling",
    "ByteTokenizer": "tokenizer",
    "JsonTokenizer": "tokenizer",
    "Tokenizer": "tokenizer",
    "load_tokenizer": "tokenizer",
    "build_model": "weights",
    "load_checkpoint": "weights",
    "save_checkpoint": "weights",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value
