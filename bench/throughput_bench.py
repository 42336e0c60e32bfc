"""Serving-path speed through EngineCore: steady decode tok/s at a fixed batch, and the offline
throughput shape nano-vllm and mini-sglang publish (256 sequences, input and output lengths
uniform in 100-1024, no stop tokens), each with decode graphs off (the baseline) and on,
against the memory/compute roofline of the steps that actually ran, measured in the same run.
`--grid` adds fixed input/output lengths as TensorRT-LLM's performance tables list them
(ISL/OSL 128/128, 128/2048, 1000/1000, 2048/2048; `--grid-seqs` requests each, no stop tokens).

    .venv/bin/python bench/throughput_bench.py --small            # CPU smoke run (tiny model)
    .venv/bin/python bench/throughput_bench.py --small --grid 16/8,32/16 --modes auto
On the H200 (bench/gpu/decode.sh; runs without `pip install -e`):
    python3 bench/throughput_bench.py --models 8b,1b,qwen3-0.6b --modes off,auto
Mode `rebuild` is `auto` with each decode step's page tables rebuilt from every sequence's
whole tables (the path before persistent device tables), for a same-run A/B. `auto` runs the
Triton decode kernels as shipped (model/decode_matmul.py: matmuls of at most 64 rows, the
gate/up one applying the activation; kv/rope_store.py: RoPE with the K/V write); `cublas` runs
neither (the path before them), `cublaslt` neither with torch's cuBLASLt preferred over cuBLAS,
`triton-mm` the matmuls only, `rope-store` the RoPE write only, `kernels-ungated` both with the
activation a kernel of its own. `ahead-unqueued` plans a step ahead only with no request
waiting and every running sequence in the step in flight (the rule before: a queue, as
`--grid-seqs` above `--grid-batch` makes, turned the overlap off). `--kernel-agreement MODES`
also compares greedy tokens of those modes with `auto`'s.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import import_engine, measure_ceilings, print_table
from lookahead_before import use_rule
from serving_steps import StepRecorder, count_launches, qwen3_0_6b_shape

import_engine()  # the device machine runs this from the checkout, not installed

from kvfleet.services.engine.attention import attn_flash  # noqa: E402
from kvfleet.services.engine.compute.backends import TorchCompute  # noqa: E402
from kvfleet.services.engine.compute.sampling import SamplingParams  # noqa: E402
from kvfleet.services.engine.config.engine_config import EngineConfig  # noqa: E402
from kvfleet.services.engine.config.model_config import PRESETS  # noqa: E402
from kvfleet.services.engine.core.engine_core import EngineCore  # noqa: E402
from kvfleet.services.engine.core.gc_heap import freeze_startup_heap, thaw_heap  # noqa: E402
from kvfleet.services.engine.kv import rope_store  # noqa: E402
from kvfleet.services.engine.model import decode_matmul, fused  # noqa: E402
from kvfleet.services.engine.request.engine_request import GenerateCall  # noqa: E402

# Rows of the comparison: (decode_graphs, fused elementwise ops, next step planned ahead).
MODES = {"off": ("off", False, False), "graphs": ("auto", False, False),
         "no-ahead": ("auto", True, False), "auto": ("auto", True, True),
         "static": ("static", False, True), "rebuild": ("auto", True, True),
         "flash": ("auto", True, True), "cublaslt": ("auto", True, True),
         "triton-mm": ("auto", True, True), "rope-store": ("auto", True, True),
         "cublas": ("auto", True, True), "kernels-ungated": ("auto", True, True),
         "ahead-unqueued": ("auto", True, True)}  # fmt: skip
# modes that plan ahead only with no request queued (lookahead_before.py)
UNQUEUED_AHEAD = {"ahead-unqueued"}
REBUILT_TABLES = {"rebuild"}  # modes whose decode steps rebuild page tables every step
FLASH_DECODE = {"flash"}  # modes whose bf16 decode attention is flash-attn's, not Triton's
BLAS_LT = {"cublaslt"}  # modes whose matmuls prefer cuBLASLt
# The Triton decode kernels (shipped on CUDA with fused_ops) each mode leaves off:
NO_DECODE_MATMUL = {"cublas", "cublaslt", "rope-store"}  # matmuls all cuBLAS's
UNGATED = {"kernels-ungated"}  # the MLP's activation a kernel of its own
NO_ROPE_STORE = {"cublas", "cublaslt", "triton-mm"}  # RoPE, then the K/V write
TRT_LLM_GRID = "128/128,128/2048,1000/1000,2048/2048"
PRESETS.setdefault("qwen3-0.6b", qwen3_0_6b_shape)  # the shape, with random weights


HOST_PROFILE = "--host-profile" in sys.argv


def host_profile(step_fn, steps: int, title: str) -> None:
    """cProfile of a few steps: where the host time of a step goes (printed, top 14)."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step_fn()
    profiler.disable()
    print(f"\n## host profile, {title}, {steps} steps (cProfile inflates the times)")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


def serve(compute, config, calls, recorder: StepRecorder, profile_after: int = 0, rebuild=False):
    """Run `calls` to the end on a fresh core driven from this thread; (wall s, usages).
    With `profile_after`, the 3 steps after that many full decode steps run under the profiler
    (their launch counts land in `recorder.launches`; they end the timed window). `rebuild`:
    the decode runner follows no persistent page tables (every step lays in whole tables)."""
    compute.cache = compute.decode = None  # the old core's KV and graphs go before new ones
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    compute.config = config  # decode_graphs of this run (read when the core opens its tiers)
    if rebuild:  # the manager is never watched: no delta record either, as before
        compute.follow_page_tables = lambda watch: None
    try:
        core = EngineCore(config, compute=compute)
    finally:
        compute.__dict__.pop("follow_page_tables", None)
    if compute.decode is not None:
        compute.decode.capture_all()  # as nano-vllm's warm-up does, before the clock starts
    freeze_startup_heap()  # as `kvfleet engine` does once its ranks are up
    recorder.attach(compute)
    handles = [core.submit(call) for call in calls]
    start = time.perf_counter()
    core.run_once()
    profiled = not profile_after
    recorder.timed_until, recorder.launches = 0, ("-", "-")
    while core.scheduler.num_sequences:
        decodes = sum(s.decode and s.sequences == len(calls) for s in recorder.steps)
        if not profiled and decodes >= profile_after:
            recorder.timed_until = len(recorder.steps)
            recorder.kernels = {}
            recorder.launches = count_launches(core.run_once, steps=3, kernels=recorder.kernels)
            if HOST_PROFILE:
                host_profile(core.run_once, steps=5, title=f"{config.model} {config.decode_graphs}")
            profiled = True
        else:
            core.run_once()
    wall = time.perf_counter() - start
    recorder.detach(compute)
    outputs = [list(h.outputs(5)) for h in handles]
    recorder.tokens = [[t for o in outs for t in o.token_ids] for outs in outputs]
    usages = [outs[-1].usage for outs in outputs]
    core.stop()
    thaw_heap()  # this core's objects may be collected before the next case's
    return wall, usages


def kernel_row(model: str, mode: str, batch: int, kernels: dict) -> list[object]:
    """One row of the device-time table from `count_launches`' summary ('-' without CUDA)."""
    if "busy" not in kernels:
        return [model, mode, batch, kernels.get("step", "-"), "-", "-", "-", "-", "-"]
    top = "; ".join(f"{name} {ms:.2f}" for name, ms in kernels["top"][:3])
    return [model, mode, batch, kernels["step"], kernels["busy"], kernels.get("matmul", 0.0),
            kernels.get("attention", 0.0), kernels.get("other", 0.0), top]  # fmt: skip


def decode_case(compute, config, batch, prompt, out, recorder, vocab, seed=0, rebuild=False):
    """Steady decode of `batch` sequences after `prompt`-token prompts, `out` tokens each:
    (tok/s, roofline share, launches per step)."""
    rng = random.Random(seed)
    calls = [
        GenerateCall(
            f"d{i}",
            tuple(rng.randrange(vocab) for _ in range(prompt)),
            SamplingParams(max_tokens=out),
            f"d{i}",
        )
        for i in range(batch)
    ]
    # Prefill takes ~batch * prompt / budget steps, during which the first sequences already
    # decode: profile halfway through the steps that are left at full batch.
    prefill_steps = -(-batch * prompt // config.max_num_batched_tokens)
    after = max(3, (out - prefill_steps) // 2)
    serve(compute, config, calls, recorder, profile_after=after, rebuild=rebuild)
    timed = recorder.steps[: recorder.timed_until or len(recorder.steps)]
    window = recorder.decode_window(batch, timed)
    rate, share, inside, outside = recorder.window_rate(window)
    recorder.kernels["step"] = 1e3 * batch / rate if rate == rate else float("nan")
    return rate, share, inside, outside, recorder.launches


def throughput_case(
    compute, config, recorder, vocab, num_seqs, lo, hi, seed=0, out=None, rebuild=False
):
    """nano-vllm's bench shape: (output tok/s, roofline share, TTFT p50, p90, out tokens).
    Prompts of `lo`-`hi` tokens, as many out (`out`: a fixed (lo, hi) of its own)."""
    rng = random.Random(seed)
    out_lo, out_hi = out or (lo, hi)
    calls = [
        GenerateCall(
            f"t{i}",
            tuple(rng.randrange(vocab) for _ in range(rng.randint(lo, hi))),
            SamplingParams(max_tokens=rng.randint(out_lo, out_hi)),
            f"t{i}",
        )
        for i in range(num_seqs)
    ]
    wall, usages = serve(compute, config, calls, recorder, rebuild=rebuild)
    out_tokens = sum(u.completion_tokens for u in usages)
    ttfts = sorted(u.ttft_seconds for u in usages)
    p50 = statistics.median(ttfts)
    p90 = ttfts[int(0.9 * (len(ttfts) - 1))]
    return out_tokens / wall, recorder.floor_seconds() / wall, p50, p90, out_tokens


def load_matmul_shapes(path: str) -> dict:
    """{(cols, inner): MatmulShape} from gemm_bench.py's `--save-shapes` JSON."""
    from kvfleet.services.engine.model.decode_matmul_kernel import MatmulShape

    with open(path) as f:
        entries = json.load(f)
    return {(e.pop("cols"), e.pop("inner")): MatmulShape(**e) for e in entries}


def use_kernels(mode: str) -> None:
    """The kernels of `mode`: cuBLAS or cuBLASLt, and the Triton decode kernels or none."""
    if torch.cuda.is_available():
        torch.backends.cuda.preferred_blas_library("cublaslt" if mode in BLAS_LT else "cublas")
    cuda = torch.cuda.is_available()
    decode_matmul.enable(cuda and mode not in NO_DECODE_MATMUL, silu_gated=mode not in UNGATED)
    rope_store.enable(cuda and mode not in NO_ROPE_STORE)


def greedy_agreement(compute, recorder, vocab, arms, tag, batch=24, prompt=300, out=32, seed=1):
    """Greedy tokens of the same requests served by two arms, each (name, config, setup: what
    to switch before serving): (identical sequences, identical tokens, sequences whose first two
    tokens are identical) as shares."""
    rng = random.Random(seed)
    prompts = [tuple(rng.randrange(vocab) for _ in range(prompt + 7 * i)) for i in range(batch)]
    outputs = []
    for name, config, setup in arms:
        setup()
        calls = [GenerateCall(f"{tag}{name}{i}", p, SamplingParams(max_tokens=out), f"{tag}{i}")
                 for i, p in enumerate(prompts)]  # fmt: skip
        serve(compute, config.with_changes(max_batch_size=batch), calls, recorder)
        outputs.append(recorder.tokens)
    pairs = list(zip(*outputs, strict=True))
    tokens = [x == y for a, b in pairs for x, y in zip(a, b, strict=True)]
    same = sum(a == b for a, b in pairs) / len(pairs)
    return same, sum(tokens) / len(tokens), sum(a[:2] == b[:2] for a, b in pairs) / len(pairs)


def kernel_agreement_case(compute, base, recorder, vocab, other: str):
    """Greedy tokens of decode graphs in mode `other` (other kernels) vs `auto`, same requests:
    (identical sequences, identical tokens) as shares (sums in another order may flip a near
    tie, after which a sequence differs; `cublaslt` against `auto` is the control: cuBLAS's
    other kernels, the same arithmetic)."""
    arms = [(mode, base, lambda mode=mode: use_kernels(mode)) for mode in ("auto", other)]
    same, tokens, first = greedy_agreement(compute, recorder, vocab, arms, "m")
    use_kernels("auto")
    print(f"{other} vs auto: first two tokens equal in {first:.0%} of sequences")
    return same, tokens


def agreement_case(compute, base, recorder, vocab):
    """Greedy tokens with decode graphs vs the eager step (both with the same fusion), same
    requests: (identical sequences, identical tokens) as shares."""
    arms = [(graphs, base.with_changes(decode_graphs=graphs), lambda: None)
            for graphs in ("off", "auto")]  # fmt: skip
    return greedy_agreement(compute, recorder, vocab, arms, "g")[:2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny model, small sizes (CPU)")
    parser.add_argument("--models", default="8b,1b,qwen3-0.6b")
    parser.add_argument("--modes", default="off,auto", help="off, graphs, no-ahead, auto, static")
    parser.add_argument("--throughput-modes", default="auto", help="modes of the throughput case")
    parser.add_argument("--decode", default="8b:64,1b:256,qwen3-0.6b:256", help="model:batch")
    parser.add_argument("--decode-prompt", type=int, default=2000)
    parser.add_argument("--decode-out", type=int, default=96)
    parser.add_argument("--throughput-models", default="qwen3-0.6b,8b")
    parser.add_argument("--kv-pages", default="8b:9000,1b:9000,qwen3-0.6b:9000")
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--host-profile", action="store_true", help="cProfile a few steps")
    parser.add_argument("--agreement-models", default="8b,qwen3-0.6b")
    parser.add_argument("--decode-matmul-shapes", default="",
                        help="JSON tilings from gemm_bench.py --save-shapes")  # fmt: skip
    parser.add_argument("--kernel-agreement", default="",
                        help="modes whose greedy tokens to compare with auto's, e.g. "
                             "kernels,cublaslt (cuBLASLt: the control)")  # fmt: skip
    parser.add_argument("--budget-s", type=float, default=1e9, help="skip cases started later")
    parser.add_argument(
        "--grid", default="", help=f"ISL/OSL pairs, e.g. TensorRT-LLM's {TRT_LLM_GRID}"
    )
    parser.add_argument("--grid-models", default="8b", help="models of the grid")
    parser.add_argument("--grid-seqs", type=int, default=256, help="requests per grid pair")
    parser.add_argument("--grid-batch", type=int, default=256, help="max batch in the grid")
    parser.add_argument("--grid-only", action="store_true", help="no decode case, only the grid")
    args = parser.parse_args()
    if args.decode_matmul_shapes:
        decode_matmul.use_shapes(load_matmul_shapes(args.decode_matmul_shapes))
    device = torch.device("cuda" if torch.cuda.is_available() and not args.small else "cpu")
    bandwidth, peak = measure_ceilings(device, args.small)
    print(f"device {device}, copy BW {bandwidth / 1e12:.3f} TB/s, matmul {peak / 1e12:.1f} TFLOP/s")
    models = ["tiny"] if args.small else args.models.split(",")
    batches = dict(kv.split(":") for kv in args.decode.split(","))
    pages = dict(kv.split(":") for kv in args.kv_pages.split(","))
    prompt, out = (60, 20) if args.small else (args.decode_prompt, args.decode_out)
    seqs, lo, hi = (8, 10, 40) if args.small else (256, 100, 1024)
    started, rows, tput_rows, agree_rows, grid_rows = time.perf_counter(), [], [], [], []
    kernel_rows: list[list[object]] = []
    other_rows: list[list[object]] = []
    grid = [tuple(int(n) for n in pair.split("/")) for pair in args.grid.split(",") if pair]
    grid_models = ["tiny"] if args.small else args.grid_models.split(",")
    for model in models:
        batch = 4 if args.small else int(batches.get(model, 64))
        base = EngineConfig(
            model=model,
            device=device.type,
            max_batch_size=max(batch, seqs),
            max_num_batched_tokens=512 if args.small else 16384,
            page_size=16 if args.small else args.page_size,
            kv_pages=600 if args.small else int(pages.get(model, 9000)),
        )
        compute = TorchCompute(base)
        vocab = min(compute.model_config.vocab_size, 256 if args.small else 32000)
        recorder = StepRecorder(compute.model_config, 2, bandwidth, peak)
        for mode in args.modes.split(","):
            if time.perf_counter() - started > args.budget_s:
                print(f"!! {model} {mode}: skipped, past the {args.budget_s:.0f} s budget")
                continue
            graphs, fuse, ahead = MODES[mode]
            fused.enable(fuse and device.type == "cuda")
            base = base.with_changes(overlap_decode=ahead)
            config = base.with_changes(decode_graphs=graphs, max_batch_size=batch)
            rebuild = mode in REBUILT_TABLES
            attn_flash.use_bf16_decode_kernel(mode not in FLASH_DECODE)
            use_kernels(mode)
            use_rule("unqueued" if mode in UNQUEUED_AHEAD else "shipped")
            if grid and model in grid_models:
                grid_config = base.with_changes(decode_graphs=graphs,
                                                max_batch_size=args.grid_batch)  # fmt: skip
                for isl, osl in grid:
                    if time.perf_counter() - started > args.budget_s:
                        print(f"!! {model} {mode} {isl}/{osl}: skipped, past the budget")
                        continue
                    # untimed: the first prefill of a shape compiles flash-attn's kernels
                    # (seconds), which the first mode's first cell paid alone
                    throughput_case(compute, grid_config, recorder, vocab, 8, isl, isl,
                                    out=(4, 4), rebuild=rebuild)  # fmt: skip
                    result = throughput_case(compute, grid_config, recorder, vocab,
                                             args.grid_seqs, isl, isl, out=(osl, osl),
                                             rebuild=rebuild)  # fmt: skip
                    grid_rows.append([model, mode, f"{isl}/{osl}", args.grid_seqs, *result])
                    print(f"{model} {mode} ISL/OSL {isl}/{osl}: {result[0]:.0f} out tok/s, "
                          f"{result[1]:.2f} of roofline", flush=True)  # fmt: skip
                if args.grid_only:
                    continue
            rate, share, inside, outside, launches = decode_case(
                compute, config, batch, prompt, out, recorder, vocab, rebuild=rebuild
            )
            rows.append([model, mode, batch, rate, share, inside, outside, *launches])
            kernel_rows.append(kernel_row(model, mode, batch, recorder.kernels))
            print(f"{model} {mode} device ms per step: {kernel_rows[-1][3:8]}", flush=True)
            calls = recorder.kernels.get("calls", {})
            other_rows += [[model, mode, name[:80], ms, calls.get(name, 0)]
                           for name, ms in recorder.kernels.get("other_top", [])]  # fmt: skip
            print(f"{model} decode_graphs={mode}: batch {batch} {rate:.0f} tok/s, "
                  f"{share:.2f} of roofline, launches/step {launches}", flush=True)  # fmt: skip
            tput_models = ["tiny"] if args.small else args.throughput_models.split(",")
            if model in tput_models and mode in args.throughput_modes.split(","):
                config = base.with_changes(decode_graphs=graphs)
                result = throughput_case(
                    compute, config, recorder, vocab, seqs, lo, hi, rebuild=rebuild
                )
                tput_rows.append([model, mode, *result])
                print(f"{model} throughput decode_graphs={mode}: {result[0]:.0f} out tok/s, "
                      f"{result[1]:.2f} of roofline", flush=True)  # fmt: skip
        use_kernels("auto")
        if model in args.agreement_models.split(",") or args.small:
            fused.enable(device.type == "cuda")
            seqs_same, tokens_same = agreement_case(compute, base, recorder, vocab)
            agree_rows.append([model, "graphs vs eager", seqs_same, tokens_same])
            print(f"{model} greedy graphs vs eager: {seqs_same:.1%} sequences, "
                  f"{tokens_same:.1%} tokens identical", flush=True)  # fmt: skip
        for other in [m for m in args.kernel_agreement.split(",") if m]:
            fused.enable(device.type == "cuda")
            seqs_same, tokens_same = kernel_agreement_case(compute, base, recorder, vocab, other)
            agree_rows.append([model, f"{other} vs auto", seqs_same, tokens_same])
            print(f"{model} greedy {other} vs auto: {seqs_same:.1%} sequences, "
                  f"{tokens_same:.1%} tokens identical", flush=True)  # fmt: skip
        del compute
    print_table(
        f"decode through EngineCore (ctx {prompt}+{out}, page {base.page_size}), full-batch steps",
        [
            "model",
            "decode_graphs",
            "batch",
            "tok/s",
            "roofline share",
            "launch-to-tokens ms",
            "host ms",
            "host launches/step",
            "kernels/step",
        ],
        rows,
    )
    print_table(
        "device time of a full-batch decode step (3 profiled steps; ms per step; step = 1 / rate)",
        ["model", "decode_graphs", "batch", "step ms", "device busy ms", "matmul ms",
         "attention ms", "other ms", "top kernels (ms)"],
        kernel_rows,
    )  # fmt: skip
    print_table(
        "the other kernels of those steps (ms and calls per step)",
        ["model", "decode_graphs", "kernel", "ms", "calls"],
        other_rows,
    )
    print_table(
        f"throughput: {seqs} seqs, in/out uniform {lo}-{hi}, no stop tokens",
        [
            "model",
            "decode_graphs",
            "out tok/s",
            "roofline share",
            "TTFT p50 s",
            "TTFT p90 s",
            "out tokens",
        ],
        tput_rows,
    )

    if grid_rows:
        print_table(
            f"ISL/OSL grid (TensorRT-LLM's shapes): fixed lengths, no stop tokens, page "
            f"{base.page_size}, max batch {args.grid_batch}",
            ["model", "decode_graphs", "ISL/OSL", "requests", "out tok/s", "roofline share",
             "TTFT p50 s", "TTFT p90 s", "out tokens"],
            grid_rows,
        )  # fmt: skip
    print_table(
        "greedy output, same requests (fused ops in both)",
        ["model", "compared", "identical sequences", "identical tokens"],
        agree_rows,
    )


if __name__ == "__main__":
    main()
