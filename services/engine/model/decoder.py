"""The decoder (Llama, Mistral, Qwen2/3, MoE variants) and its forward over a paged KV cache."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..attention.attn_reference import dense_attention
from ..attention.backends import AttentionBackend
from ..attention.batch import ForwardBatch
from ..config.model_config import ModelConfig
from ..kv import rope_store
from ..kv.kv_cache import PagedKVCache
from .decode_matmul import Linear
from .layers import DecoderLayer, RMSNorm, StoreRotated
from .rope import rope_angles

# One layer's attention: (layer index, q, k, v, positions) -> output [T, H, D]; k and v are
# None where the projection stored them already (StoreRotated).
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class DecoderStack(nn.Module):
    """Embedding, layers, final norm (named `model.*` as in Hugging Face checkpoints)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """Decoder plus LM head. Reads and writes KV only through the `PagedKVCache` it is given."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderStack(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        cache: PagedKVCache,
        backend: AttentionBackend,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Write the batch's new K/V into `cache` and return logits (fp32).

        Returns `[num_sequences, vocab]` for the last new token of each sequence, or
        `[num_tokens, vocab]` for every new token when `all_logits`.
        """

        def attend(layer: int, q, k, v, _positions) -> torch.Tensor:
            group = cache.group_of(layer)
            if k is not None:  # else stored already, as it was rotated (store below)
                cache.write(layer, k, v, batch.slots[group])
            k_pages, v_pages = cache.kv(layer)
            meta = batch.attention[group]
            window = self.config.layer_window(layer)
            return backend.forward(
                q,
                k_pages,
                v_pages,
                meta,
                window,
                self._scale,
                sinks=self._sinks(layer),
                kv_scales=cache.kv_scales(layer),
            )

        def store(layer: int) -> StoreRotated:
            slots = batch.slots[cache.group_of(layer)]
            return lambda qkv, rope, heads: cache.write_rotating(layer, qkv, rope, slots, heads)

        # Switched off, no layer is offered the one-kernel write (one check, not one a layer).
        stores = store if rope_store.enabled() else None
        hidden = self._run_layers(batch.token_ids, batch.positions, attend, stores)
        if not all_logits:
            hidden = hidden[batch.last_token_index]
        return self._logits(hidden)

    @torch.inference_mode()
    def forward_dense(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Logits `[n, vocab]` of one whole sequence with no cache at all (the ground truth)."""
        positions = torch.arange(token_ids.numel(), device=token_ids.device)

        def attend(layer: int, q, k, v, pos) -> torch.Tensor:
            window = self.config.layer_window(layer)
            return dense_attention(q, k, v, pos, window, self._scale, self._sinks(layer))

        return self._logits(self._run_layers(token_ids, positions, attend))

    @torch.inference_mode()
    def kv_amax(self, token_ids: torch.Tensor) -> torch.Tensor:
        """`[layers, 2 (K, V), kv_heads]`: the largest |K| and |V| per head over one dense
        forward of `token_ids` (what an fp8 cache's scales are calibrated from)."""
        amax = torch.zeros(self.config.num_layers, 2, self.config.num_kv_heads)
        positions = torch.arange(token_ids.numel(), device=token_ids.device)

        def attend(layer: int, q, k, v, pos) -> torch.Tensor:
            amax[layer, 0] = k.abs().amax(dim=(0, 2)).float().cpu()
            amax[layer, 1] = v.abs().amax(dim=(0, 2)).float().cpu()
            window = self.config.layer_window(layer)
            return dense_attention(q, k, v, pos, window, self._scale, self._sinks(layer))

        self._run_layers(token_ids, positions, attend)
        return amax

    @property
    def _scale(self) -> float:
        return self.config.head_dim**-0.5

    def _sinks(self, layer: int) -> torch.Tensor | None:
        return self.model.layers[layer].self_attn.sinks

    def _run_layers(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        store: Callable[[int], StoreRotated] | None = None,
    ) -> torch.Tensor:
        hidden = self.model.embed_tokens(token_ids)
        rope = rope_angles(positions, self.config)
        layers = self.model.layers
        normed = layers[0].input_layernorm(hidden)
        # Each residual add runs with the norm that reads its sum (RMSNorm.add: one kernel):
        # after a layer's MLP, the next layer's input norm, or the final norm.
        next_norms = [layer.input_layernorm for layer in layers[1:]] + [self.model.norm]
        for index, (layer, next_norm) in enumerate(zip(layers, next_norms, strict=True)):
            q, k, v = layer.self_attn.qkv(normed, rope, store(index) if store else None)
            attn = attend(index, q, k, v, positions)
            hidden, normed = layer.post_attention_layernorm.add(
                hidden, layer.self_attn.o_proj(attn.flatten(1))
            )
            hidden, normed = next_norm.add(hidden, layer.mlp(normed))
        return normed

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
