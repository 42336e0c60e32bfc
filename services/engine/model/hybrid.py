"""A hybrid decoder: some layers a selective SSM (`ssm.py`), the rest full attention.

Each layer is pre-norm mixer (attention or SSM) then pre-norm SwiGLU, each residual. Attention
layers keep K/V in the `full` layer group's pages, like `CausalLM`. SSM layers keep their
recurrent state in the `ssm` group (the kvstore's `state` life cycle): the page of block j
holds each SSM layer's state after token (j+1)*B - 1 once block j is computed, and the running
state until then. A chunk starting at token n reads the state in the page of block (n-1)//B
(a snapshot when n is a block boundary), writes the state after each block end it passes whose
page exists, and the running state into the page of its last token, so a prefix-cache hit and
a recompute run the same code from different starting points (`paged_ssm.py`: prefill chunks
one sequence at a time, every decoding sequence in one batched step). Which blocks have pages
(the snapshot boundaries; the rest are holes, the null page) is the kvstore's business, not
the model's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..attention.attn_reference import dense_attention
from ..attention.backends import AttentionBackend
from ..attention.batch import ForwardBatch
from ..config.model_config import ModelConfig
from ..kv.device_kv_cache import DeviceKVCache
from .layers import AttentionProjections, RMSNorm, SwiGLU
from .paged_ssm import SSMBatchPlan
from .rope import rope_angles
from .ssm import SelectiveSSM, SSMShape, SSMState

# One recurrent layer over the whole batch: (layer index, mixer, normed hidden [T, h]) ->
# [T, h]; the mixer is a `SelectiveSSM` or another layer with its `forward` and `decode`.
MixFn = Callable[[int, nn.Module, torch.Tensor], torch.Tensor]
# One attention layer: (layer index, q, k, v) -> attention output [T, H, D].
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class HybridLayer(nn.Module):
    """Pre-norm mixer (`self_attn` or `mixer`), then pre-norm SwiGLU."""

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if config.is_ssm_layer(layer):
            self.mixer = SelectiveSSM(SSMShape.of(config))
        else:
            self.self_attn = AttentionProjections(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config)


class HybridStack(nn.Module):
    """Embedding, layers, final norm (`model.*`, as `CausalLM` names them)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HybridLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class HybridLM(nn.Module):
    """Hybrid decoder plus LM head over a `DeviceKVCache` with an `ssm` state group.

    A checkpoint family with other layer parts (`granite_hybrid.py`, `qwen3_next.py`) names
    its `stack_class` and overrides `_run_layers`, `_scale` and `_logits`; the paged forward
    stays this one."""

    stack_class: type[nn.Module] = HybridStack

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not config.ssm_layers:
            raise ValueError(f"model {config.name!r} has no ssm_layers: use CausalLM")
        self.config = config
        self.model = self.stack_class(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_ssm_parameters(self) -> None:
        """The SSM's own starting values (decay rates, skip, dt bias) after a generic init."""
        for module in self.modules():
            if isinstance(module, SelectiveSSM):
                module.reset_dynamics()

    @torch.inference_mode()
    def forward(
        self,
        batch: ForwardBatch,
        cache: DeviceKVCache,
        backend: AttentionBackend,
        all_logits: bool = False,
    ) -> torch.Tensor:
        """Write the batch's K/V and states into `cache`; logits (fp32) of each sequence's last
        new token, or of every new token when `all_logits`."""

        def attend(layer: int, q, k, v) -> torch.Tensor:
            group = cache.group_of(layer)
            cache.write(layer, k, v, batch.slots[group])
            k_pages, v_pages = cache.kv(layer)
            meta = batch.attention[group]
            return backend.forward(
                q, k_pages, v_pages, meta, None, self._scale, kv_scales=cache.kv_scales(layer)
            )

        plan = SSMBatchPlan.of(batch, cache.page_size, cache.null_page_id)

        def mix(layer: int, mixer: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return plan.run(mixer, x, cache.states(layer))

        hidden = self._run_layers(batch.token_ids, batch.positions, attend, mix)
        if not all_logits:
            hidden = hidden[batch.last_token_index]
        return self._logits(hidden)

    @torch.inference_mode()
    def forward_dense(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Logits `[n, vocab]` of one whole sequence with no cache at all (the ground truth)."""
        positions = torch.arange(token_ids.numel(), device=token_ids.device)

        def attend(layer: int, q, k, v) -> torch.Tensor:
            return dense_attention(q, k, v, positions, None, self._scale)

        def mix(layer: int, mixer: nn.Module, x: torch.Tensor) -> torch.Tensor:
            return mixer(x, SSMState.zeros(mixer.shape, x.device))[0]

        return self._logits(self._run_layers(token_ids, positions, attend, mix))

    @property
    def _scale(self) -> float:
        return self.config.head_dim**-0.5

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def _run_layers(
        self, token_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn, mix: MixFn
    ) -> torch.Tensor:
        hidden = self.model.embed_tokens(token_ids)
        rope = rope_angles(positions, self.config)
        for index, layer in enumerate(self.model.layers):
            x = layer.input_layernorm(hidden)
            if hasattr(layer, "mixer"):
                mixed = mix(index, layer.mixer, x)
            else:
                q, k, v = layer.self_attn.qkv(x, rope)
                mixed = layer.self_attn.o_proj(attend(index, q, k, v).flatten(1))
            hidden = hidden + mixed
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.model.norm(hidden)
