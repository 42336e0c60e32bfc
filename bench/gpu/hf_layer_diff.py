"""Where our forward first departs from transformers': the same random checkpoint run by both
on one prompt, every module that both models name alike hooked, and each output compared in
forward order (max |diff|, and whether it is bit-identical). Prints one table.

    python bench/gpu/hf_layer_diff.py --models qwen3-1.7b      # on the GPU, bf16
    .venv/bin/python bench/gpu/hf_layer_diff.py --device cpu --dtype bfloat16 --small

The backend is SDPA on both sides unless given (`--backend`, `--hf-attention`). Our q/k/v and
gate/up projections run packed (model/packed.py) and every norm after the first layer's input
norm runs fused with its residual add (`RMSNorm.add`), so those modules fire no hooks: a
departure there shows first at the layer's `o_proj` or `mlp`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gpu_common import import_engine, print_table
from hf_parity import build_hf, hf_prompt_logits, ours_prompt_logits


def capture(model: torch.nn.Module, names: list[str]) -> tuple[dict, list]:
    """Hook `names`; returns (name -> first output, the hook handles), in call order."""
    outputs: dict[str, torch.Tensor] = {}
    handles = []
    modules = dict(model.named_modules())
    for name in names:

        def hook(_module, _inputs, output, name=name):
            tensor = output[0] if isinstance(output, tuple) else output
            if isinstance(tensor, torch.Tensor) and name not in outputs:
                outputs[name] = tensor.detach().float().reshape(-1).cpu()

        handles.append(modules[name].register_forward_hook(hook))
    return outputs, handles


def rope_rows(engine, name, hf, ours, length, device, dtype) -> list[list[object]]:
    """Our cos/sin against transformers' rotary embedding at the same positions."""
    from kvfleet.services.engine.model.rope import rope_angles

    positions = torch.arange(length, device=device)
    cos, sin = rope_angles(positions, ours.config)
    probe = torch.zeros(1, length, 1, device=device, dtype=dtype)
    hf_cos, hf_sin = hf.model.rotary_emb(probe, positions[None])
    half = cos.shape[-1]
    inv_freq = hf.model.rotary_emb.inv_freq
    rows = [[name, f"rope inv_freq ({inv_freq.dtype}, {inv_freq.device})", "-", "-"]]
    for label, a, b in (("rope cos", hf_cos, cos), ("rope sin", hf_sin, sin)):
        a = a[0, :, :half].float().cpu()
        b = b[:, 0, :].float().cpu()
        rows.append([name, label, float((a - b).abs().max()), bool(torch.equal(a, b))])
        a16, b16 = a.to(dtype), b.to(dtype)
        rows.append([name, f"{label} in {dtype}", float((a16 - b16).float().abs().max()),
                     bool(torch.equal(a16, b16))])  # fmt: skip
    return rows


# --sdpa-kernel: SDPA's kernels by name
SDPA_KERNELS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--models", default="qwen3-1.7b,llama-3.2-1b")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2, help="decoder layers to list")
    parser.add_argument("--hf-attention", default="sdpa")
    parser.add_argument("--backend", default="sdpa")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sdpa-kernel", choices=sorted(SDPA_KERNELS), default=None,
                        help="force SDPA's kernel on both sides")  # fmt: skip
    args = parser.parse_args()
    with forced_sdpa_kernel(args.sdpa_kernel):
        rows = compare_all(args)
    kernel = f", SDPA kernel {args.sdpa_kernel}" if args.sdpa_kernel else ""
    print_table(f"first departures from transformers ({args.device}, {args.dtype}{kernel})",
                ["model", "module (forward order)", "max |diff|", "identical"], rows)  # fmt: skip
    return 0


def forced_sdpa_kernel(name: str | None):
    """SDPA limited to kernel `name` on both sides (nothing forced when None)."""
    return contextlib.nullcontext() if name is None else sdpa_kernel(SDPA_KERNELS[name])


def compare_all(args: argparse.Namespace) -> list[list[object]]:
    """One row per hooked module (and RoPE's cos/sin) per model, in forward order."""
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    engine = import_engine()
    rows: list[list[object]] = []
    for name in args.models.split(","):
        hf = build_hf(name, args.small, device, dtype, args.seed, args.hf_attention)
        with tempfile.TemporaryDirectory(prefix="hf-diff-") as tmp:
            hf.save_pretrained(tmp, max_shard_size="1GB")
            ours = engine.load_checkpoint(tmp, device)
        shared = [n for n, _ in hf.named_modules() if n and n in dict(ours.named_modules())]
        listed = [n for n in shared if ".layers." not in n or int(n.split(".")[2]) < args.layers]
        generator = torch.Generator().manual_seed(args.seed)
        prompt = torch.randint(0, hf.config.vocab_size, (args.prompt_len,), generator=generator)
        prompt = prompt.tolist()
        theirs, hf_hooks = capture(hf, listed)
        hf_prompt_logits(hf, prompt, device)
        mine, our_hooks = capture(ours, listed)
        backend = engine.make_backend(args.backend, device)
        ours_prompt_logits(engine, ours, prompt, device, dtype, backend, chunk=args.prompt_len)
        for handle in hf_hooks + our_hooks:
            handle.remove()
        rows += rope_rows(engine, name, hf, ours, args.prompt_len, device, dtype)
        for module in [n for n in theirs if n in mine]:
            a, b = theirs[module], mine[module]
            if a.numel() != b.numel():
                rows.append([name, module, f"shapes {a.numel()} vs {b.numel()}", "-"])
                continue
            rows.append([name, module, float((a - b).abs().max()), bool(torch.equal(a, b))])
    return rows


if __name__ == "__main__":
    sys.exit(main())
