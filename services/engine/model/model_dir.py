"""Local model directories: without weights (`config.json` + a byte-level `tokenizer.json`),
or, with `--arch`, a tiny random Hugging Face checkpoint (tiny_checkpoint.py).

Peer routers load a tokenizer from the `model_path` a worker reports; pointing them at this
directory means none of them downloads one. The `sim` compute backend needs no weights, so
`kvfleet engine --compute-backend sim --model-path DIR` serves from it as it is.

The tokenizer (tokenizer.py's `byte_tokenizer_json`) gives the same ids as the engine's
`ByteTokenizer`: UTF-8 byte `b` is id `b`, and the special tokens follow at 256, 257, ...
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config.model_config import ModelConfig
from .tokenizer import BYTE_SPECIAL_TOKENS, byte_tokenizer_json


def write_model_dir(path: str | Path, model: ModelConfig) -> Path:
    """Write `config.json` (the engine's layout) and the byte `tokenizer.json` into `path`."""
    if model.vocab_size < 256 + len(BYTE_SPECIAL_TOKENS):
        raise ValueError(
            f"vocab_size {model.vocab_size} < {256 + len(BYTE_SPECIAL_TOKENS)}: the byte "
            "tokenizer's ids would not fit"
        )
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(model.to_dict(), indent=1))
    (path / "tokenizer.json").write_text(byte_tokenizer_json())
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model.max_position}
        )
    )
    return path


# Kept here (not imported from the registry) so `kvfleet --help` does not import torch.
ARCHITECTURES = (
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "GptOssForCausalLM", "GraniteMoeHybridForCausalLM",
    "Qwen3NextForCausalLM",
)  # fmt: skip


def register(subparsers) -> None:
    """`kvfleet model-dir DIR [--model PRESET | --arch ARCH]`: write a model directory."""
    parser = subparsers.add_parser(
        "model-dir",
        help="write config.json + a byte tokenizer.json (for --model-path of sim ranks, peers), "
        "or with --arch a tiny random Hugging Face checkpoint that `kvfleet up` serves",
        description="Write a model directory: without --arch, a preset's config.json and a byte "
        "tokenizer.json without weights, for --model-path of sim ranks and of peer routers; with "
        "--arch, a tiny random Hugging Face checkpoint (sharded safetensors, tokenizer with a chat "
        "template) that `kvfleet up --model-path` serves.",
    )
    parser.add_argument("path", help="directory to write (created if missing)")
    parser.add_argument("--model", default="tiny", help="preset shape (tiny, 1b, 8b)")
    parser.add_argument(
        "--arch",
        choices=ARCHITECTURES,
        default=None,
        help="write a tiny random checkpoint of this architecture (config, sharded "
        "safetensors, tokenizer with a chat template, generation_config)",
    )
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="--arch: the weights' dtype (config.json's torch_dtype)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="--arch: seed of the random weights")
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="context length (default: the preset's)"
    )
    parser.set_defaults(func=_run)


def _run(args) -> int:
    from ..config.model_config import preset

    if args.arch:
        from .tiny_checkpoint import write_tiny_checkpoint

        path = write_tiny_checkpoint(args.path, args.arch, args.seed, args.dtype)
        print(f"{args.arch} checkpoint: {path} (serve it: kvfleet up --model-path {path})")
        return 0
    model = preset(args.model)
    if args.max_model_len is not None:
        model = model.with_changes(max_position=args.max_model_len)
    print(f"model directory: {write_model_dir(args.path, model)}")
    return 0
