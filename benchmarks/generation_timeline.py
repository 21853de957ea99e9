"""Where one generation's time goes on the GPU: the denoise steps and the decode, timed with and without a
host sync at each step end, on a full-size Z-Image (random weights, bf16, eager) in plain diffusers.

The service times its phases on the host, at the pipeline's step callbacks: the GPU may still be working
through queued steps when the last callback runs, and that tail is then counted in the decode. This measures
how large that tail is: `unsynced` reads the clock at each callback as the service does; `synced`
synchronises the device there first, so each step's figure is its GPU time. A torch.profiler trace of one
synced generation gives the busiest CUDA kernels.

    python -m benchmarks.generation_timeline --out docs/bench/generation_timeline.jsonl
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from benchmarks.bench_record import Recorder, host_description

STEPS = 9


def one_generation(pipe, sync_each_step: bool) -> dict:
    import torch

    marks = []

    def callback(_pipe, index, _t, tensors):
        if sync_each_step:
            torch.cuda.synchronize()
        marks.append(time.perf_counter())
        return tensors

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.inference_mode():
        pipe(prompt="a lighthouse on a cliff at dusk", height=1024, width=1024, num_inference_steps=STEPS,
             guidance_scale=0.0, generator=torch.Generator("cpu").manual_seed(1), output_type="pt",
             callback_on_step_end=callback)
    returned = time.perf_counter()
    torch.cuda.synchronize()
    end = time.perf_counter()
    steps = [b - a for a, b in zip(marks, marks[1:])]
    return {"step_ms": statistics.median(steps) * 1000, "after_last_step_ms": (end - marks[-1]) * 1000,
            "call_ms": (end - t0) * 1000, "returned_before_sync_ms": (end - returned) * 1000}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.full_size_pipelines import build_zimage

    record = Recorder("generation_timeline", args.out, "zimage", "python -m benchmarks.generation_timeline "
                      + " ".join(sys.argv[1:]), host_description())
    pipe = build_zimage().to("cuda", torch.bfloat16)
    one_generation(pipe, False)
    for name, synced in (("unsynced", False), ("synced", True)):
        runs = [one_generation(pipe, synced) for _ in range(3)]
        for key in runs[0]:
            record(name, key, statistics.median(r[key] for r in runs), "ms", steps=STEPS)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        one_generation(pipe, True)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    print(table)
    total = sum(e.device_time_total for e in prof.key_averages()) / 1000
    for event in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:12]:
        record("synced", "cuda_kernel_ms", event.device_time_total / 1000, "ms", kernel=event.key[:120],
               calls=event.count, share=round(event.device_time_total / 1000 / total, 3))


if __name__ == "__main__":
    main()
