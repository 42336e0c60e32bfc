"""Run under TRITON_INTERPRET=1 (tests/engine/test_decode_kernels.py starts it): a bf16 model's
decode step with the Triton decode matmuls and the one-kernel RoPE + KV write (model/
decode_matmul.py, kv/rope_store.py) against the same step without them, padded as a decode
graph pads it: the same logits (to bf16 rounding), the same greedy tokens, the same K/V in the
pages, and a null page that stays zeros although pad rows point at it. Also the RoPE kernel on
its own against `apply_rope` and `write`, on a window layer's group too."""

from __future__ import annotations

import dataclasses
import random
import sys

import torch
from kvfleet.services.engine.attention.backends import make_backend
from kvfleet.services.engine.attention.batch import ForwardBatch, SequenceChunk
from kvfleet.services.engine.compute.cuda_graphs import DecodeRunner
from kvfleet.services.engine.config.model_config import preset
from kvfleet.services.engine.kv import rope_store, rope_store_kernel
from kvfleet.services.engine.kv.kv_cache import PagedKVCache
from kvfleet.services.engine.model import decode_matmul, decode_matmul_kernel
from kvfleet.services.engine.model.rope import apply_rope, rope_angles
from kvfleet.services.engine.model.weights import build_model

# Big enough for the matmul kernel's tilings (inner 256 and 512), both split and unsplit.
CONFIG = dataclasses.replace(
    preset("tiny"),
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=64,
    window_layers=(1,),
    window_size=48,
)
PAGE = 16
calls = {"matmul": 0, "gated": 0, "rope_store": 0}


def counted(name: str, fn):
    def call(*args, **kwargs):
        calls[name] += 1
        calls["gated"] += bool(kwargs.get("silu_gated"))
        return fn(*args, **kwargs)

    return call


# Before the switches' first lookup, so that the calls that reach the kernels are counted.
decode_matmul_kernel.decode_matmul = counted("matmul", decode_matmul_kernel.decode_matmul)
rope_store_kernel.rope_store = counted("rope_store", rope_store_kernel.rope_store)


class _Chunk:
    def __init__(self, token, start, pages):
        self.new_tokens, self.start, self.page_ids = (token,), start, pages


def switches(on: bool) -> None:
    decode_matmul.enable(on)
    rope_store.enable(on)


def decode_step(model, backend, on: bool, seed: int):
    """Prefill three sequences, then one decode step of them padded to 4: (logits, tokens,
    cache)."""
    switches(False)  # the prefill is the same both ways
    cache = PagedKVCache(CONFIG, 64, PAGE, dtype=torch.bfloat16)
    rng = random.Random(seed)
    chunks, next_page = [], 1
    for length in (5, 40, 70):
        pages = list(range(next_page, next_page + -(-(length + 1) // PAGE)))
        next_page += len(pages)
        chunk_pages = dict.fromkeys(cache.num_pages, tuple(pages))
        prompt = [rng.randrange(CONFIG.vocab_size) for _ in range(length)]
        model(ForwardBatch.build([SequenceChunk(prompt, 0, chunk_pages)], cache), cache, backend)
        chunks.append(_Chunk(rng.randrange(CONFIG.vocab_size), length, chunk_pages))
    switches(on)
    runner = DecodeRunner(model, cache, backend, max_batch=4, capture=False)
    logits, tokens = runner.run(chunks)
    switches(False)
    return logits.float(), tokens, cache


def check_model(failures: list) -> None:
    model = build_model(CONFIG, seed=0, dtype=torch.bfloat16)
    backend = make_backend("reference", "cpu")
    base_logits, base_tokens, base_cache = decode_step(model, backend, False, seed=1)
    logits, tokens, cache = decode_step(model, backend, True, seed=1)
    error = float((logits - base_logits).abs().max() / base_logits.abs().max())
    print(f"decode step, kernels on vs off: logits {error:.2e}, tokens {tokens.tolist()} "
          f"vs {base_tokens.tolist()}")  # fmt: skip
    # a step: 4 matmuls a layer (gate/up with its activation) and the head; a RoPE + write a
    # layer (the prefill takes none)
    print(f"kernel calls: {calls}")
    layers = CONFIG.num_layers
    expected = {"matmul": 4 * layers + 1, "gated": layers, "rope_store": layers + 1}
    if calls != expected:
        failures.append(("kernel calls", dict(calls)))
    if error > 3e-2 or tokens.tolist() != base_tokens.tolist():
        failures.append(("model step", error))
    for layer in range(CONFIG.num_layers):
        got, want = (torch.stack(c.kv(layer)).float() for c in (cache, base_cache))
        kv_error = float((got - want).abs().max() / want.abs().max())
        print(f"layer {layer} pages: {kv_error:.2e}")
        if kv_error > 3e-2:
            failures.append(("pages", layer, kv_error))
    cache.check_integrity()  # the pad row wrote nothing into the null page


def check_kernel(failures: list) -> None:
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, d, tokens = 4, 2, 64, 6
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, generator=gen).to(torch.bfloat16)
    positions = torch.tensor([0, 3, 17, 100, 2047, 5])
    rope = rope_angles(positions, dataclasses.replace(CONFIG, rope_theta=500000.0))
    slots = torch.tensor([3, 9, 0, 21, 30, 4])
    valid = torch.tensor([True, True, False, True, True, True])  # row 2: a pad row at slot 0
    pages = torch.zeros(2, 32, kv_heads, d, dtype=torch.bfloat16)
    rope_store.enable(True)
    q = rope_store.rotate_and_write(pages, qkv, rope, slots, valid, heads)
    rope_store.enable(False)
    qk, v = qkv.split([(heads + kv_heads) * d, kv_heads * d], dim=-1)
    want = apply_rope.unfused(qk.view(tokens, heads + kv_heads, d), rope)
    q_error = float((q.float() - want[:, :heads].float()).abs().max())
    rows = valid.nonzero().flatten()
    k_error = float((pages[0, slots[rows]].float() - want[rows, heads:].float()).abs().max())
    v_same = torch.equal(pages[1, slots[rows]], v.view(tokens, kv_heads, d)[rows])
    untouched = not pages[:, 0].any()
    print(f"rope_store: q {q_error:.2e}, k {k_error:.2e}, v equal {v_same}, "
          f"pad row's slot untouched {untouched}")  # fmt: skip
    # one bf16 rounding apart at most (|x| < 8 here: a bf16 step is at most 2 ** -5)
    if q_error > 2**-4 or k_error > 2**-4 or not v_same or not untouched:
        failures.append(("rope_store", q_error, k_error, v_same, untouched))


def main() -> int:
    failures: list = []
    check_kernel(failures)  # one rope_store call
    check_model(failures)
    if failures:
        print("FAILED", failures)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
