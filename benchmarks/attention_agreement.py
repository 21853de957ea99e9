"""Do two attention pins train alike? The same job trains once under each pin, each in its own process (a fault in
a fused kernel kills its process; and dynamo reuses a traced graph across pins within one), on images of three
aspect ratios sorted into buckets, compiled as SPEED_MODE_DEFAULT compiles on a GPU. Rows per pin: whether it
finished, which fused SDPA kernels ran, the step time per bucket shape (warm: the example's whole sequence had
run before; and apart, an example's first step in a known bucket) and the losses; then, per step, the relative
difference between the two pins' losses. This is what a pin must show before it becomes a family's
default (training_service/attention_choice.py). A pin ending in `+graphs` replays the blocks as CUDA graphs, as
the trainer does under SPEED_MODE_MAX where training_service/graph_choice.py allows (static shapes: a graph per
sequence shape), in place of the regular compile: losses agreeing over mixed buckets, and the memory the graphs'
pools hold across buckets.

    python -m benchmarks.attention_agreement --family zimage --workdir /tmp/sp --out FILE
    python -m benchmarks.attention_agreement --family flux1 --workdir /tmp/sp --out FILE \
        --pins "flash,efficient+graphs;flash,efficient"    # CUDA graph trees against the regular compile
    python -m benchmarks.attention_agreement --family zimage --tiny --steps 8 --out FILE   # every path, on a CPU
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks.bench_record import Recorder, host_description
from benchmarks.step_profile import RESOLUTION, gpu_busy_share
from benchmarks.training_bench import ensure_base

SHAPES = [(1, 1), (7, 5), (5, 7)]  # width : height of the images, two of each: three buckets
CAPTION = "a photo of noise, number {i}"


def make_images(directory: Path, resolution: int) -> list[tuple[str, str]]:
    """Six noise images of the three aspect ratios, each about resolution^2 pixels, with captions of their own
    lengths (a caption's tokens are part of Z-Image's sequence)."""
    import numpy as np
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    examples = []
    for i, (w, h) in enumerate(SHAPES * 2):
        scale = resolution / (w * h) ** 0.5
        path = directory / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, (round(h * scale), round(w * scale), 3), dtype=np.uint8)).save(path)
        examples.append((str(path), CAPTION.format(i=i) + ", with more words" * i))
    return examples


def pin_and_graphs(variant: str) -> tuple[list[str], bool]:
    """A variant is a pin (SDPA kernels, comma-separated, in order), with `+graphs` at its end to run the blocks
    under inductor's CUDA graph trees instead of the regular compile."""
    pin, graphs = variant.removesuffix("+graphs"), variant.endswith("+graphs")
    return [k for k in pin.split(",") if k], graphs


def step_kinds(steps: list[tuple[int, str]]) -> list[str]:
    """What each step's time can say, from (example, bucket shape) per step. An example's image and caption fix
    its sequence (Z-Image's holds the caption's tokens), so a step is `warm` once its example ran before; an
    example's first step in a bucket that ran before is a `new_sequence` (it may compile graphs or build a
    kernel's plan for a new length, which a long run pays once per length); a bucket's first step compiles its
    graphs (`first_in_bucket`)."""
    kinds, examples, shapes = [], set(), set()
    for index, shape in steps:
        kinds.append("warm" if index in examples else "new_sequence" if shape in shapes else "first_in_bucket")
        examples.add(index)
        shapes.add(shape)
    return kinds


def train_one(args) -> dict:
    """One job under args.pin, in this process: its losses, step times by bucket, and the kernels that ran."""
    from training_service.attention_choice import training_attention
    from training_service.lora_recipe import LoraRecipe, RecipeConfig

    cuda = torch.cuda.is_available()
    resolution = 64 if args.tiny else RESOLUTION[args.family]
    base = ensure_base(args.workdir, args.family, args.tiny)
    examples = make_images(args.workdir / f"agreement-data-{resolution}", resolution)
    kernels, graphs = pin_and_graphs(args.pin)
    cfg = RecipeConfig(family=args.family, base_dir=str(base), examples=examples, rank=16, alpha=16.0,
                       steps=args.steps + 2, resolution=resolution, seed=0, buckets=True,
                       device="cuda" if cuda else "cpu", precision="bf16" if cuda else "fp32", compile=True,
                       cuda_graphs=graphs,
                       compile_backend="inductor" if cuda else "aot_eager", attention=kernels)
    recipe = LoraRecipe(cfg)
    recipe.setup()
    ran: list[tuple[int, str, float]] = []  # (example, bucket shape, ms) per step
    for step in range(args.steps):
        index = recipe.plan.at(step)[0]
        t0 = time.perf_counter()
        recipe.train(until_step=step + 1)  # reads the loss back: the step has finished on the device
        ran.append((index, "x".join(map(str, recipe.examples[index].bucket)), (time.perf_counter() - t0) * 1e3))
    by_kind: dict[str, dict[str, list[float]]] = {"warm": {}, "new_sequence": {}, "first_in_bucket": {}}
    for (_, shape, ms), kind in zip(ran, step_kinds([(index, shape) for index, shape, _ in ran])):
        by_kind[kind].setdefault(shape, []).append(ms)
    trace = gpu_busy_share(lambda: recipe.train(until_step=recipe.state.step + 1), 2)
    pinned = training_attention(cfg.family, cfg.device, tuple(cfg.attention)).kernels  # what the recipe pins
    return {"pin": list(pinned), "losses": recipe.state.losses[:args.steps],
            "ran": list(trace.attention_ran) if trace else [],
            "ms_by_shape": {s: statistics.median(ms) for s, ms in by_kind["warm"].items()},
            "new_sequence_ms_by_shape": {s: statistics.median(ms) for s, ms in by_kind["new_sequence"].items()},
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=list(RESOLUTION), required=True)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/training-bench"))
    p.add_argument("--pins", default="cudnn,flash,efficient;flash,efficient",
                   help="two pins, ';' between them: the candidate, then the one it is held against; a pin ending "
                        "in +graphs runs the blocks under CUDA graph trees")
    p.add_argument("--steps", type=int, default=24, help="steps per pin; the six examples each run about four times")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", type=Path)
    p.add_argument("--timeout", type=float, default=600, help="seconds each pin's process may take")
    p.add_argument("--pin", help=argparse.SUPPRESS)  # the child: train under this pin, print its result
    args = p.parse_args()
    if args.pin is not None:
        print(json.dumps(train_one(args)), flush=True)
        return
    record = Recorder("attention-agreement", args.out, args.family,
                      "python -m benchmarks.attention_agreement " + " ".join(sys.argv[1:]), host_description())
    results = []
    for pin in args.pins.split(";"):
        cmd = [sys.executable, "-m", "benchmarks.attention_agreement", "--family", args.family, "--workdir",
               str(args.workdir), "--steps", str(args.steps), "--pin", pin] + (["--tiny"] if args.tiny else [])
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            failed = None if done.returncode == 0 else done.stderr.strip().splitlines()[-1:] or [str(done.returncode)]
        except subprocess.TimeoutExpired:
            done, failed = None, [f"no result within {args.timeout:.0f} s"]
        mode = "pin-" + pin.replace(",", "-").replace("+", "-")
        record(mode, "finished", int(failed is None), "bool", **({"error": failed[0][-500:]} if failed else {}))
        if failed:
            results.append(None)
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        record(mode, "attention_kernels_ran", ",".join(result["ran"]) or "none", "kernels", pinned=result["pin"])
        for shape, ms in result["ms_by_shape"].items():
            record(mode, f"step_ms_{shape}", ms, "ms", note="median of the steps whose example (image and caption, "
                   "so the whole sequence) had run before")
        for shape, ms in result["new_sequence_ms_by_shape"].items():
            record(mode, f"new_sequence_step_ms_{shape}", ms, "ms", note="median of an example's first step in a "
                   "bucket that had run before: a new caption length in a known image shape")
        record(mode, "losses", result["losses"], "loss")
        if result.get("peak_reserved_gib") is not None:
            record(mode, "peak_reserved_gib", result["peak_reserved_gib"], "GiB", note="what the caching allocator "
                   "held at its peak over the job (load, every bucket, CUDA graph pools included)")
    if len(results) == 2 and all(results):
        a, b = results[0]["losses"], results[1]["losses"]
        diffs = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)]
        record("agreement", "loss_rel_diff_max", max(diffs), "fraction", per_step=[round(d, 5) for d in diffs],
               note=f"{results[0]['pin']} against {results[1]['pin']}, same seed and data")


if __name__ == "__main__":
    main()
