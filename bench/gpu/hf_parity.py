"""Greedy parity with transformers on a 1B-class random model: build a Llama 3.2-1B-shaped and a
Qwen3-1.7B-shaped model with transformers (random weights, no download), save them sharded,
load them in kvfleet, and compare greedy tokens and prompt logits. Prints one table.

    python bench/gpu/hf_parity.py                  # cuda if present (bf16), else CPU (small, fp32)
    python bench/gpu/hf_parity.py --small --device cpu --dtype bfloat16

Needs transformers (the dev extra; installed on the H200 machine). On the GPU the attention
backend is flash when flash-attn is importable (bench/gpu/run.sh unpacks it), else SDPA.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu_common import import_engine, print_table, sync

# name -> (transformers config class, shape). Big: the real models' shapes; small: for CPU.
SHAPES = {
    "llama-3.2-1b": ("LlamaConfig", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
        max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})),
    "qwen3-1.7b": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
        max_position_embeddings=40960, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
}  # fmt: skip
SMALL = dict(vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=4, head_dim=32)  # fmt: skip


def build_hf(
    name: str, small: bool, device: torch.device, dtype: torch.dtype, seed: int, attention: str
):
    import transformers

    class_name, shape = SHAPES[name]
    shape = {**shape, **(SMALL if small else {})}
    config = getattr(transformers, class_name)(
        **shape, initializer_range=0.04, bos_token_id=None, eos_token_id=None, pad_token_id=None
    )
    config.architectures = [class_name.replace("Config", "ForCausalLM")]
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=dtype, attn_implementation=attention
        )
    return model.eval()


@torch.no_grad()
def hf_greedy(model, prompt: list[int], new_tokens: int, device) -> tuple[list[int], torch.Tensor]:
    """(greedy tokens, each step's logits) with transformers' own KV cache."""
    out = model(torch.tensor([prompt], device=device), use_cache=True)
    tokens, steps = [], []
    for _ in range(new_tokens):
        logits = out.logits[0, -1].float()
        steps.append(logits)
        tokens.append(int(logits.argmax()))
        # The cache's attribute and keyword differ between transformers releases.
        name = "cache" if hasattr(out, "cache") else "past_key_values"
        step = torch.tensor([[tokens[-1]]], device=device)
        out = model(step, **{name: getattr(out, name)}, use_cache=True)
    return tokens, torch.stack(steps)


@torch.no_grad()
def hf_prompt_logits(model, prompt: list[int], device) -> torch.Tensor:
    return model(torch.tensor([prompt], device=device)).logits[0].float()


def ours_prompt_logits(engine, model, prompt, device, dtype, backend, chunk=512) -> torch.Tensor:
    page = 16
    cache = engine.PagedKVCache(model.config, len(prompt) // page + 2, page, device, dtype)
    pages = {g: list(range(1, len(prompt) // page + 2)) for g in cache.num_pages}
    pieces = []
    for start in range(0, len(prompt), chunk):
        piece = engine.SequenceChunk(prompt[start : start + chunk], start, pages)
        batch = engine.ForwardBatch.build([piece], cache)
        pieces.append(model(batch, cache, backend, all_logits=True))
    return torch.cat(pieces)


def compare(engine, name, args, device, dtype) -> list[list[object]]:
    hf = build_hf(name, args.small, device, dtype, args.seed, args.hf_attention)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hf-parity-") as tmp:
        hf.save_pretrained(tmp, max_shard_size="4MB" if args.small else "1GB")
        shards = len(list(Path(tmp).glob("model-*.safetensors")))
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        ours = engine.load_checkpoint(tmp, device)  # dtype: config.json's torch_dtype
        sync(device)
        load_s = time.perf_counter() - t0
        rss_rise_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    backend = engine.make_backend(args.backend, device)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = hf.config.vocab_size
    for length in args.prompt_lens:
        prompt = torch.randint(0, vocab, (length,), generator=gen).tolist()
        theirs, their_steps = hf_greedy(hf, prompt, args.new_tokens, device)
        cache_pages = (length + args.new_tokens) // 16 + 2
        cache = engine.PagedKVCache(ours.config, cache_pages, 16, device, dtype)
        params = engine.SamplingParams(temperature=0.0, max_tokens=args.new_tokens)
        mine = engine.generate(ours, cache, backend, prompt, params, prefill_chunk=512).token_ids
        same = next(
            (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), len(theirs)
        )
        margin = "-"
        if same < len(theirs):  # how close transformers' own top-2 were where we differ
            step = their_steps[same]
            margin = float(step[theirs[same]] - step[mine[same]])
        expected = hf_prompt_logits(hf, prompt, device)
        got = ours_prompt_logits(engine, ours, prompt, device, dtype, backend)
        argmax_agree = float((got.argmax(-1) == expected.argmax(-1)).float().mean())
        rows.append([name, str(dtype).removeprefix("torch."), args.hf_attention, backend.name,
                     shards,
                     round(load_s, 2), round(rss_rise_mib), length,
                     f"{same}/{len(theirs)}", margin, float((got - expected).abs().max()),
                     float(expected.abs().max()), argmax_agree])  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--small", action="store_true", help="small shapes (default on CPU)")
    parser.add_argument("--models", default=",".join(SHAPES))
    parser.add_argument("--prompt-lens", default=None, help="default: 32,512,2000 (CPU: 32,256)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hf-attention", default="sdpa", help="transformers: sdpa or eager")
    parser.add_argument("--backend", default=None, help="ours: flash, sdpa or reference (auto)")
    args = parser.parse_args()
    device = torch.device(args.device)
    args.small = args.small or device.type == "cpu"
    lens = args.prompt_lens or ("32,256" if device.type == "cpu" else "32,512,2000")
    args.prompt_lens = [int(n) for n in lens.split(",")]
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    engine = import_engine()
    rows = []
    for name in args.models.split(","):
        rows += compare(engine, name, args, device, dtype)
    print_table(
        f"greedy parity with transformers ({'small' if args.small else '1B-class'} shapes, "
        f"{device})",
        [
            "model",
            "dtype",
            "HF attention",
            "backend",
            "shards",
            "load s",
            "host RSS rise MiB",
            "prompt",
            "greedy match",
            "HF margin at 1st diff",
            "prompt logits max|diff|",
            "max|logit|",
            "prompt argmax agree",
        ],
        rows,
    )
    print("greedy match: tokens equal before the first difference; HF margin: transformers'"
          " logit of its token minus ours at that step (small = a near tie)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
