"""Tiny random Hugging Face models of every supported architecture, built in code.

Each is saved with `save_pretrained` and a small `max_shard_size`, so that the engine loads a
sharded checkpoint (model.safetensors.index.json) exactly as it would a real one.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch
from kvfleet.services.engine.attention.backends import make_backend
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.kv.kv_cache import PagedKVCache

# Shared shape: small, but with GQA, 3 layers, and sizes grouped_mm accepts (multiples of 4).
BASE = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.08,  # peaked logits, so greedy choices are far from ties
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

# architecture -> (config class name, fields on top of BASE)
ARCHS: dict[str, tuple[str, dict]] = {
    "LlamaForCausalLM": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "MistralForCausalLM": ("MistralConfig", {"sliding_window": 24, "head_dim": 16}),
    "Qwen2ForCausalLM": (
        "Qwen2Config",
        {"use_sliding_window": True, "sliding_window": 24, "max_window_layers": 1},
    ),
    "Qwen3ForCausalLM": ("Qwen3Config", {"head_dim": 24, "tie_word_embeddings": True}),
    "Qwen3MoeForCausalLM": (
        "Qwen3MoeConfig",
        {
            "head_dim": 16,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": False,
            "mlp_only_layers": [1],
        },
    ),
    "MixtralForCausalLM": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # Layers 0 and 2 slide a 24-token window, layer 1 attends to everything; a clamp low enough
    # that the random experts' activations cross it.
    "GptOssForCausalLM": (
        "GptOssConfig",
        {
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 24,
            "swiglu_limit": 0.3,
        },
    ),
    # Mamba at 0 and 2, attention at 1 and 3; every multiplier off 1, and a scan chunk of 16
    # so that transformers' chunking differs from ours.
    "GraniteMoeHybridForCausalLM": (
        "GraniteMoeHybridConfig",
        {
            "num_hidden_layers": 4,
            "layer_types": ["mamba", "attention", "mamba", "attention"],
            "mamba_n_heads": 4,
            "mamba_d_state": 16,
            "mamba_chunk_size": 16,
            "shared_intermediate_size": 48,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "position_embedding_type": "rope",
            "embedding_multiplier": 2.0,
            "residual_multiplier": 0.7,
            "logits_scaling": 1.5,
            "attention_multiplier": 0.3,
        },
    ),
    # Linear attention at 0, 1 and 3, gated attention at 2: two key heads each serving two value
    # heads (of another width than the keys), partial rotary (a quarter of each head), experts
    # with a shared expert on every layer but the dense layer 1.
    "Qwen3NextForCausalLM": (
        "Qwen3NextConfig",
        {
            "num_hidden_layers": 4,
            "layer_types": [
                "linear_attention",
                "linear_attention",
                "full_attention",
                "linear_attention",
            ],
            "head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 12,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            "mlp_only_layers": [1],
        },
    ),
}


def hf_config(arch: str, **changes):
    import transformers

    class_name, fields = ARCHS[arch]
    config = getattr(transformers, class_name)(**{**BASE, **fields, **changes})
    config.architectures = [arch]
    return config


def engine_model_config(arch: str, **changes):
    """The engine's ModelConfig read from transformers' config of a tiny `arch`."""
    from kvfleet.services.engine.model.registry import model_config_from_hf

    return model_config_from_hf(hf_config(arch, **changes).to_dict())


def save_tiny(arch: str, directory: Path, seed: int = 0, dtype=torch.float32, **changes):
    """(transformers model in eval mode, checkpoint directory) of a random tiny `arch`."""
    import transformers

    torch.manual_seed(seed)
    config = hf_config(arch, **changes)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=dtype
    ).eval()
    _norms_off_their_constant(model)
    if arch in AFTER_INIT:
        AFTER_INIT[arch](model)
    model.save_pretrained(directory, max_shard_size="40KB")
    return model, directory


@torch.no_grad()
def _norms_off_their_constant(model) -> None:
    """Norm weights away from the constant they start at (1, or 0 where the norm scales by
    `1 + weight`): at the constant, a norm read from the wrong layer, or `weight` taken for
    `1 + weight`, would go unseen."""
    gen = torch.Generator().manual_seed(0)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.add_(0.3 * torch.randn(param.shape, generator=gen).to(param.dtype))


@torch.no_grad()
def _qwen3_next_weights(model) -> None:
    """Slow decays: with transformers' A in [0.01, 16] a head may forget within a few tokens,
    and a state restored wrong beyond them would go unseen; here the heads remember tens to
    hundreds of tokens."""
    gen = torch.Generator().manual_seed(0)
    for name, param in model.named_parameters():
        if name.endswith("linear_attn.A_log"):
            rates = torch.linspace(0.005, 0.2, param.numel())
            param.copy_(torch.log(rates[torch.randperm(param.numel(), generator=gen)]))


# Changes to transformers' random init, per architecture, before saving.
AFTER_INIT = {"Qwen3NextForCausalLM": _qwen3_next_weights}


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """All-position logits `[n, vocab]` of one forward over `tokens`, fp32."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy continuation of `prompt`, `new_tokens` long (full forward per
    token, no cache: the reference every engine path is held to)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def paged_logits(
    model, tokens: list[int], cuts: list[int], page_size: int = 4, backend: str = "reference"
) -> torch.Tensor:
    """Our all-token logits of `tokens` fed through a paged cache in chunks ending at `cuts`
    (a hybrid's SSM layers resume from the state its pages hold at each cut)."""
    num_pages = -(-len(tokens) // page_size) + 1
    dtype = next(model.parameters()).dtype
    with _paged_cache(model.config, num_pages, page_size, dtype) as cache:
        pages = {group: list(range(1, num_pages)) for group in cache.num_pages}
        attention = make_backend(backend, "cpu")
        pieces, start = [], 0
        for end in [*cuts, len(tokens)]:
            batch = ForwardBatch.build([SequenceChunk(tokens[start:end], start, pages)], cache)
            pieces.append(model(batch, cache, attention, all_logits=True))
            start = end
        cache.check_integrity()
    return torch.cat(pieces)


@contextmanager
def _paged_cache(config, num_pages: int, page_size: int, dtype):
    """A `PagedKVCache`; for a hybrid, the tiers' device KV with its SSM state pool."""
    if not config.ssm_layers:
        yield PagedKVCache(config, num_pages, page_size, dtype=dtype)
        return
    from kvfleet.services.engine.config.engine_config import EngineConfig
    from kvfleet.services.engine.kv.device_kv_cache import DeviceKVCache
    from kvfleet.services.engine.kv.kv_setup import build_kv, open_kv_tiers

    engine = EngineConfig(kv_pages=num_pages, page_size=page_size)
    tiers = open_kv_tiers(config, engine, build_kv(config, engine, dtype), "cpu")
    try:
        yield DeviceKVCache(config, tiers.device_kv)
    finally:
        tiers.close()


def random_tokens(n: int, seed: int, vocab: int = 300) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
