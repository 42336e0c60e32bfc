"""Reading a Hugging Face `config.json` strictly: every key is used, or listed here as one that
does not change inference, or it is an error that names it.
"""

from __future__ import annotations

from typing import Any

from ..config.model_config import RopeScaling

# Keys any transformers config may carry that do not change what inference computes: names,
# versions, training-only knobs (dropout, init, aux losses), output switches, token ids (the
# tokenizer files and generation_config.json give those), and generation defaults of old
# configs (requests carry their own sampling parameters).
IGNORED_KEYS: frozenset[str] = frozenset(
    {
        "_name_or_path", "model_type", "transformers_version", "torch_dtype", "dtype",
        "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
        "decoder_start_token_id", "initializer_range", "attention_dropout", "hidden_dropout",
        "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id",
        "problem_type", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
        "add_cross_attention", "tie_encoder_decoder", "cross_attention_hidden_size",
        "tokenizer_class", "prefix", "task_specific_params", "finetuning_task",
        "tf_legacy_loss", "use_bfloat16", "torchscript", "pruned_heads",
        "_attn_implementation_autoset", "pretraining_tp", "router_aux_loss_coef",
        "output_router_logits", "router_jitter_noise", "max_length", "min_length",
        "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
        "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
        "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "num_return_sequences",
        "output_scores", "return_dict_in_generate", "forced_bos_token_id",
        "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty",
        "suppress_tokens", "begin_suppress_tokens", "bad_words_ids",
    }
)  # fmt: skip

# Keys whose presence alone means a model this engine cannot run as it is.
REFUSED_KEYS: dict[str, str] = {
    "quantization_config": "quantized checkpoints are not supported (load bf16/fp16/fp32 weights)",
    "partial_rotary_factor": "partial rotary embeddings are not supported",
}

# rope kind -> the parameters it reads (besides rope_type/type and rope_theta).
ROPE_PARAMETERS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "dynamic": frozenset({"factor"}),
    "llama3": frozenset(
        {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}
    ),
    "yarn": frozenset(
        {
            "factor",
            "original_max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        }
    ),
}


class ConfigError(ValueError):
    """A config.json this engine cannot serve; the message names the key and the options."""


class KeyReader:
    """Hands out a config's values and remembers which keys were read."""

    def __init__(self, data: dict[str, Any], architecture: str) -> None:
        self.data, self.architecture, self.read = data, architecture, set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ConfigError(f"{self.architecture}: config.json lacks {key!r}")
        return value

    def expect(self, key: str, value: Any) -> None:
        """A key transformers does not read for this architecture, which some checkpoints carry
        anyway: fine with the value that means what transformers does, else an error."""
        self.read.add(key)
        if key in self.data and self.data[key] != value:
            raise ConfigError(
                f"{self.architecture}: {key}={self.data[key]!r} is not supported (transformers "
                f"ignores it for this architecture; only {value!r} means what it computes)"
            )

    def accept(self, *keys: str) -> None:
        """Mark keys as understood without reading them (their meaning is folded elsewhere)."""
        self.read.update(keys)

    def check_all_read(self) -> None:
        for key, why in REFUSED_KEYS.items():
            if self.data.get(key) is not None:
                raise ConfigError(f"{self.architecture}: {key}: {why}")
        left = sorted(set(self.data) - self.read - IGNORED_KEYS)
        if left:
            raise ConfigError(
                f"{self.architecture}: unsupported config key(s) {left}; this architecture "
                f"reads {sorted(self.read)} (and ignores the inference-neutral keys listed in "
                "kvfleet.services.engine.model.hf_keys.IGNORED_KEYS)"
            )


def read_rope(r: KeyReader, default_theta: float, max_position: int):
    """(rope_theta, RopeScaling or None) from `rope_parameters` (transformers 5) or
    `rope_theta` + `rope_scaling` (transformers 4)."""
    params = dict(r.get("rope_scaling") or {})
    params.update(r.get("rope_parameters") or {})
    theta = float(params.pop("rope_theta", None) or r.get("rope_theta", default_theta))
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind not in ROPE_PARAMETERS:
        raise ConfigError(
            f"{r.architecture}: rope_scaling type {kind!r} is not supported; "
            f"supported: {sorted(ROPE_PARAMETERS)}"
        )
    unknown = sorted(set(params) - ROPE_PARAMETERS[kind])
    if unknown:
        raise ConfigError(
            f"{r.architecture}: rope_scaling {kind!r} does not take {unknown}; "
            f"it takes {sorted(ROPE_PARAMETERS[kind])}"
        )
    if kind == "default":
        return theta, None
    original = params.get("original_max_position_embeddings") or r.get(
        "original_max_position_embeddings", max_position
    )
    factor = params.get("factor")
    if factor is None and kind == "yarn":
        factor = max_position / original
    if factor is None:
        raise ConfigError(f"{r.architecture}: rope_scaling {kind!r} needs 'factor'")
    fields: dict[str, Any] = {"kind": kind, "factor": float(factor)}
    fields["original_max_position"] = int(original)
    for ours, key in (
        ("low_freq_factor", "low_freq_factor"),
        ("high_freq_factor", "high_freq_factor"),
        ("beta_fast", "beta_fast"),
        ("beta_slow", "beta_slow"),
        ("mscale", "mscale"),
        ("mscale_all_dim", "mscale_all_dim"),
        ("attention_factor", "attention_factor"),
        ("truncate", "truncate"),
    ):
        if params.get(key) is not None:
            fields[ours] = params[key]
    if kind == "llama3":
        needed = ROPE_PARAMETERS["llama3"] - {"original_max_position_embeddings"}
        missing = sorted(needed - set(params))
        if missing:
            raise ConfigError(f"{r.architecture}: rope_scaling 'llama3' needs {missing}")
    return theta, RopeScaling(**fields)
