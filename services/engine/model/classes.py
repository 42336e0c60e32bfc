"""Which module class runs a model config: by architecture, else by its layers' kinds."""

from __future__ import annotations

from torch import nn

from ..config.model_config import ModelConfig
from .decoder import CausalLM
from .granite_hybrid import GraniteHybridLM
from .hybrid import HybridLM
from .qwen3_next import Qwen3NextLM

# Architectures whose layers are not the generic ones (their parameter names and extras).
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "GraniteMoeHybridForCausalLM": GraniteHybridLM,
    "Qwen3NextForCausalLM": Qwen3NextLM,
}


def model_class(config: ModelConfig) -> type[nn.Module]:
    """The class of `config`'s model: its architecture's own, else `HybridLM` for SSM layers,
    else `CausalLM`."""
    if config.architecture in MODEL_CLASSES:
        return MODEL_CLASSES[config.architecture]
    return HybridLM if config.ssm_layers else CausalLM
