"""Where a training step's time goes (eager, or with --compile the blocks compiled): the recipe's loop against
bare loops over the same model.

The service's eager bf16 step ran at 0.84x (Z-Image) and 0.70x (FLUX) of the shared baseline probe's on an
H200 (docs/bench/training.md). This splits that gap. After one recipe setup, in one process, it times:

- `recipe`: the recipe's own loop (`LoraRecipe.train`): fresh noise and batches, clipping, the
  schedule, and the step event with its two host syncs;
- `bare-synced`: the same model, optimizer and objective on one fixed batch, reading the loss every step;
- `bare`: the same, with no host sync until the end, as the baseline probe does;
- `built`: the bare loop over a model built in this process from the same config with random weights and the
  same adapter (as the baseline probe builds its model), not loaded from disk: if it is faster than `bare`, the
  difference lies in how the model was loaded, not in what it is given.

If `bare` is as slow as `recipe`, the gap lies in the model or its inputs. If it is as fast as the probe,
it lies in the loop. On a GPU it also records how much of each step's wall time the GPU was busy, from a
torch.profiler trace of a few steps.

With --aot-blocks DIR the compiled blocks are the graphs compiled ahead of time in DIR (loaded, or compiled and
saved there): run it twice to time the loaded graphs.

With --skip-guard-eval the timed loops run with dynamo checking only the guards that tell its cached graphs apart
(`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`), every shape having been traced in the warm-up: beside a
run without it, what the guard checks of the regular compile cost a step (on the H100 the job's own trace put them
at 13 ms of Z-Image's step). On a GPU every traced loop's rows also split the host's time per step (host_breakdown).

With --cudagraphs the blocks replay as CUDA graphs (inductor's graph trees), as the trainer runs them under
SPEED_MODE_MAX where training_service/graph_choice.py allows. On a GPU the rows
also say, per loop, the kernel time per step, its GEMM and attention shares, and which fused SDPA kernels ran,
with an `attention_pin_not_honoured` row when the pin's first kernel did not.

    python -m benchmarks.step_profile --family flux1 [--tiny] [--precision bf16] [--compile | --cudagraphs]
        [--aot-blocks DIR] [--attention cudnn,flash,efficient] [--steps 30] [--out FILE] [--tables DIR]
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

from benchmarks.bench_record import Recorder, host_description
from benchmarks.training_bench import CAPTION, RESOLUTION, ensure_base, make_dataset
from training_service.denoiser_setup import lora_inputs_for_step
from training_service.nf4_weights import BACKENDS as NF4_BACKENDS, DEFAULT_BACKEND as NF4_DEFAULT
from training_service.step_trace import Trace, host_rows, summarize


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_busy_share(fn, steps: int, table: Path | None = None) -> Trace | None:
    """A profiler trace of `steps` calls of fn: the share of wall time CUDA kernels ran, and per step the host
    calls that launch, copy or wait, the kernel milliseconds (all, GEMM, attention) and which SDPA kernels ran
    (kernel_breakdown). None without a GPU. `table` gets the profiler's busiest host ops."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    _sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        _sync()
        wall = time.perf_counter() - t0
    return summarize(prof, steps, wall, table)


def trace_rows(name: str, trace: Trace, pinned: tuple[str, ...], replayed: bool) -> list[tuple]:
    """The (metric, value, unit, note) rows of one loop's trace. `replayed`: the step ran as CUDA graphs, whose
    replays run no operators on the host: their GEMM and attention kernels are said only where the trace placed
    them by their names (step_trace.kernel_name_breakdown), and only the total otherwise."""
    rows = [(f"{name}_gpu_busy_share", trace.busy_share, "fraction",
             "CUDA kernel time over wall time in a torch.profiler trace (the profiler adds host overhead)"),
            (f"{name}_kernel_ms_per_step", trace.kernel_ms, "ms", None)]
    if not replayed or trace.kernels_named_by == "kernel names":
        ran = ",".join(trace.attention_ran) or "none"
        placed = f"the fused SDPA kernels that ran in the traced steps, by their {trace.kernels_named_by}"
        rows.append((f"{name}_attention_kernels_ran", ran, "kernels", placed))
        if pinned and pinned[0] not in trace.attention_ran:
            rows.append((f"{name}_attention_pin_not_honoured", pinned[0], "kernel",
                         f"pinned {','.join(pinned)}, in this order; ran {ran}"))
        rows += [(f"{name}_gemm_kernel_ms_per_step", trace.gemm_ms, "ms", f"by their {trace.kernels_named_by}"),
                 (f"{name}_attention_kernel_ms_per_step", trace.attention_ms, "ms",
                  f"by their {trace.kernels_named_by}")]
    rows += [(f"{name}_{metric}", value, unit, None) for metric, value, unit in host_rows(trace.host)]
    return rows + [(f"{name}_{call}_per_step", per_step, "calls", None) for call, per_step in sorted(trace.calls.items())]


def timed_guard_checks(aot) -> list[float]:
    """Wraps the guard check of every graph installed on the blocks so that it adds its seconds up in the
    returned cell: the Python side of a graph compiled ahead of time (the regular compile checks its guards in
    dynamo's C++ frame evaluation, which no wrapper can time)."""
    spent = [0.0]
    seen: set[int] = set()
    for block in aot.blocks:
        for graph in block.forward.graphs:
            if id(graph) in seen:
                continue
            seen.add(id(graph))
            check = graph.guard_check

            def timed(*args, _check=check, **kwargs):
                t0 = time.perf_counter()
                try:
                    return _check(*args, **kwargs)
                finally:
                    spent[0] += time.perf_counter() - t0

            graph.guard_check = timed
    return spent


def built_model_step(recipe):
    """A bare step over the recipe's architecture built here from its config, with the recipe's adapter config,
    inputs and objective: the baseline probe's way of making the model. None for a quantised base."""
    from peft import LoraConfig

    base = recipe.model
    if recipe.cfg.precision.value not in ("bf16", "fp16", "fp32"):
        return None
    device = recipe.cfg.device
    with torch.device(device):
        fresh = type(base).from_config(base.config).to(recipe.dtype)
    fresh.requires_grad_(False)
    torch.manual_seed(0)
    config = base.peft_config["default"]
    fresh.add_adapter(LoraConfig(r=config.r, lora_alpha=config.lora_alpha, init_lora_weights="gaussian",
                                 target_modules=sorted(config.target_modules)))
    fresh.train()
    params = [p for p in fresh.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()
    lora_inputs_for_step(fresh, device, recipe.dtype)  # as the recipe's model: only how it was made differs
    optimizer = torch.optim.AdamW(params, lr=recipe.cfg.learning_rate)
    inputs = recipe.step_inputs(0)

    def step():
        recipe.model, kept = fresh, recipe.model
        try:
            loss = recipe.loss(inputs)
            recipe.backward(loss)
        finally:
            recipe.model = kept
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=list(RESOLUTION), required=True)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/training-bench"))
    p.add_argument("--precision", default="bf16")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--nf4-backend", choices=NF4_BACKENDS, default=NF4_DEFAULT,
                   help="with --precision nf4: what holds the base weights (training_service.nf4_weights)")
    p.add_argument("--checkpoint-interval", type=int, default=1,
                   help="with --gradient-checkpointing: one block call in every N checkpointed")
    p.add_argument("--compile", action="store_true",
                   help="the blocks compiled as SPEED_MODE_DEFAULT compiles them (inductor; the warm-up steps trace)")
    p.add_argument("--cudagraphs", action="store_true",
                   help="the trainer's CUDA graph mode (SPEED_MODE_MAX on FLUX.1 and Z-Image): the blocks "
                        "compiled with inductor's CUDA graphs (mode reduce-overhead, static shapes) in place of the "
                        "regular compile")
    p.add_argument("--aot-blocks", type=Path, metavar="DIR",
                   help="with --compile: the blocks' graphs compiled ahead of time, loaded from DIR or saved there")
    p.add_argument("--built-model", action="store_true",
                   help="also time the bare loop over the same architecture built in-process (bf16 only)")
    p.add_argument("--attention", default="",
                   help="SDPA kernels to pin, in order (cudnn,flash,efficient); default: the training policy's")
    p.add_argument("--skip-guard-eval", action="store_true",
                   help="with --compile or --cudagraphs: the timed and traced loops (not the recipe's warm-up steps, "
                        "which trace the graphs, nor --built-model's loop) run under "
                        "torch.compiler.set_stance(skip_guard_eval_unsafe=True), dynamo checking only the guards "
                        "that tell its cached graphs apart: what guard checks cost a step")
    p.add_argument("--out", type=Path)
    p.add_argument("--tables", type=Path, help="a folder for the profiler's tables of the traced steps")
    args = p.parse_args()
    if args.skip_guard_eval and not (args.compile or args.cudagraphs) or args.skip_guard_eval and args.aot_blocks:
        p.error("--skip-guard-eval needs --compile or --cudagraphs, without --aot-blocks (graphs compiled ahead of "
                "time check their guards in Python, timed as aot_guard_check_ms_per_step)")
    if args.aot_blocks and not args.compile:
        p.error("--aot-blocks needs --compile: only compiled blocks have graphs to keep")
    if args.cudagraphs and (args.compile or args.aot_blocks):
        p.error("--cudagraphs compiles the blocks itself: leave out --compile and --aot-blocks")
    from training_service.attention_choice import training_attention
    from training_service.lora_recipe import LoraRecipe, RecipeConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    resolution = 64 if args.tiny else RESOLUTION[args.family]
    base_dir = ensure_base(args.workdir, args.family, args.tiny)
    data = make_dataset(args.workdir / f"data-{resolution}", resolution)
    examples = [(str(f), CAPTION) for f in sorted(data.glob("*.png"))]
    record = Recorder("step-profile", args.out, args.family, "python -m benchmarks.step_profile " + " ".join(sys.argv[1:]),
                      host_description())
    steps = args.steps
    cfg = RecipeConfig(family=args.family, base_dir=str(base_dir), examples=examples, rank=16, alpha=16.0,
                       steps=steps + 8, resolution=resolution, seed=0, device=device,
                       precision=args.precision if device == "cuda" else "fp32",
                       gradient_checkpointing=args.gradient_checkpointing, checkpoint_interval=args.checkpoint_interval,
                       nf4_backend=args.nf4_backend, compile=args.compile or args.cudagraphs,
                       cuda_graphs=args.cudagraphs,
                       compile_backend="inductor" if device == "cuda" else "aot_eager",
                       aot_dir=str(args.aot_blocks) if args.aot_blocks else None,
                       attention=[k for k in args.attention.split(",") if k])
    resolved: list[dict] = []
    recipe = LoraRecipe(cfg, emit=lambda kind, data: resolved.extend(data["resolved"]) if kind == "resolved" else None)
    recipe.setup()
    loop = "cudagraphs" if args.cudagraphs else "compile" if args.compile else "eager"
    precision = f"{cfg.precision}" + ("-torchao" if cfg.precision == "nf4" and args.nf4_backend != NF4_DEFAULT else "")
    mode = f"{precision}-{loop}" + ("-gc" if args.gradient_checkpointing else "")
    if args.gradient_checkpointing and args.checkpoint_interval > 1:
        mode += str(args.checkpoint_interval)
    if cfg.attention:
        mode += "-attn-" + "-".join(cfg.attention)
    if args.skip_guard_eval:
        mode += "-skipguards"

    def timed_stance():
        """The stance of the timed loops: every shape they run was traced in the warm-up before them."""
        if not args.skip_guard_eval:
            return contextlib.nullcontext()
        return torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)

    if recipe.aot is not None:
        mode += "-aot-loaded" if recipe.aot.loaded == recipe.aot.graphs else "-aot-compiled"
        record(mode, "aot_graphs", recipe.aot.graphs, "graphs", note=recipe.aot.how())

    # the recipe's loop: five steps of warm-up, then the timed ones
    recipe.train(until_step=5)
    guards = timed_guard_checks(recipe.aot) if recipe.aot is not None else None
    _sync()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with timed_stance():
        recipe.train(until_step=5 + steps)
        _sync()
    record(mode, "recipe_ms_per_step", (time.perf_counter() - t0) / steps * 1e3, "ms")
    if torch.cuda.is_available():
        record(mode, "recipe_peak_allocated_gib", torch.cuda.max_memory_allocated() / 2**30, "GiB",
               note="the caching allocator's peak over the timed steps of the recipe's loop" + (
                   "; replayed CUDA graphs use their pool without the allocator, so this leaves them out"
                   if args.cudagraphs else ""))
        record(mode, "recipe_peak_reserved_gib", torch.cuda.max_memory_reserved() / 2**30, "GiB",
               note="the memory the caching allocator held at its peak over the same steps, CUDA graph pools "
                    "included")
    if guards is not None:
        record(mode, "aot_guard_check_ms_per_step", guards[0] / steps * 1e3, "ms",
               note="the graphs' guard checks in Python (prepare the frame's locals, run the guard manager), "
                    "inside recipe_ms_per_step")
        said = [r["applied"] for r in resolved if "ran eagerly" in r["applied"]]
        record(mode, "aot_steps_with_eager_block_calls", len(said), "records", note="; ".join(said) or
               "every block call of the warm-up and timed steps ran a graph compiled ahead of time")

    inputs = recipe.step_inputs(0)

    def bare_step() -> torch.Tensor:
        loss = recipe.loss(inputs)
        recipe.backward(loss)
        recipe.optimizer.step()
        recipe.optimizer.zero_grad(set_to_none=True)
        return loss

    for name, synced in (("bare_synced", True), ("bare", False)):
        with timed_stance():
            for _ in range(3):
                bare_step()
            _sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                loss = bare_step()
                if synced:
                    float(loss)
            _sync()
        record(mode, f"{name}_ms_per_step", (time.perf_counter() - t0) / steps * 1e3, "ms")

    built = built_model_step(recipe) if args.built_model else None
    if built is not None:
        for _ in range(3):
            built()
        _sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            built()
        _sync()
        record(mode, "built_ms_per_step", (time.perf_counter() - t0) / steps * 1e3, "ms",
               note="the bare loop over a model built in this process from the same config (random weights)")

    pinned = training_attention(cfg.family, device, tuple(cfg.attention)).kernels
    for name, fn in (("recipe", lambda: recipe.train(until_step=recipe.state.step + 1)), ("bare", bare_step)):
        table = args.tables / f"{args.family}-{mode}-{name}.txt" if args.tables else None
        with timed_stance():
            trace = gpu_busy_share(fn, 3, table)
        for metric, value, unit, note in trace_rows(name, trace, pinned, args.cudagraphs) if trace else ():
            record(mode, metric, value, unit, **({"note": note} if note else {}))

if __name__ == "__main__":
    main()
