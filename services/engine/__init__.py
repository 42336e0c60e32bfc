"""The engine's compute half: a Llama-style decoder over a paged KV cache, attention backends,
sampling, tokenizers and weights. The serving half (scheduler, gRPC, HTTP) builds on these."""

from .attention import AttentionBackend, available_backends, make_backend
from .batch import AttentionMetadata, ForwardBatch, SequenceChunk
from .config import FULL_GROUP, PRESETS, WINDOW_GROUP, ModelConfig, preset
from .generate import Generation, default_dtype, generate
from .kv_cache import PagedKVCache
from .model import CausalLM
from .sampling import SamplingParams, make_generator, sample_batch, sample_token
from .tokenizer import ByteTokenizer, JsonTokenizer, Tokenizer, load_tokenizer
from .weights import build_model, load_checkpoint, save_checkpoint

__all__ = [
    "FULL_GROUP",
    "PRESETS",
    "WINDOW_GROUP",
    "AttentionBackend",
    "AttentionMetadata",
    "ByteTokenizer",
    "CausalLM",
    "ForwardBatch",
    "Generation",
    "JsonTokenizer",
    "ModelConfig",
    "PagedKVCache",
    "SamplingParams",
    "SequenceChunk",
    "Tokenizer",
    "available_backends",
    "build_model",
    "default_dtype",
    "generate",
    "load_checkpoint",
    "load_tokenizer",
    "make_backend",
    "make_generator",
    "preset",
    "sample_batch",
    "sample_token",
    "save_checkpoint",
]
