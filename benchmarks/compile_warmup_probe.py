"""Where a regional-compile warm-up spends its time, cold and with a warm cache.

    python -m benchmarks.compile_warmup_probe --model-dir /tmp/b/zimage --cache-dir /tmp/b/cc   # twice

One process: load the pipeline, compile the denoiser's repeated blocks as the service's default speed
mode does (inductor, dynamic shapes, fullgraph), time the first call (the service's warm-up: 2 steps,
latent output) and then the same call again, and print one JSON object: both times, inductor's and
AOTAutograd's cache hit/miss counters, and the compile phases dynamo timed (seconds, summed over
graphs). Run it twice with the same --cache-dir: the first run starts cold, the second warm.
The first-call minus second-call difference is what compiling costs that process.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from diffusion_kit.compile_cache import configure_compile_cache

PHASES = ("_compile.compile_inner", "bytecode_tracing", "create_aot_dispatcher_function", "aot_collect_metadata",
          "OutputGraph.call_user_compiler", "AOTAutogradCache.inductor_load", "PyCodeCache.load_by_key_path",
          "async_compile.wait", "Scheduler.codegen", "compile_file", "build_guards")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--cache-dir", type=Path, required=True)
    p.add_argument("--resolution", type=int, default=1024)
    p.add_argument("--backend", default="inductor", help="aot_eager only to check the probe runs (CPU tests)")
    args = p.parse_args()
    configure_compile_cache(args.cache_dir)  # before torch is imported, as the service does

    import torch
    from diffusers import DiffusionPipeline
    from torch._dynamo.utils import compilation_time_metrics, counters

    from diffusion_kit.families import family_of_pipeline_dir
    from inference_service import backend_flags
    from inference_service.pipeline_builder import WARM_UP_BATCHES, warm_up

    family = family_of_pipeline_dir(args.model_dir)
    cuda = torch.cuda.is_available()
    t = time.perf_counter()
    pipe = DiffusionPipeline.from_pretrained(args.model_dir, dtype=torch.bfloat16 if cuda else torch.float32)
    pipe.to("cuda" if cuda else "cpu")
    load_s = time.perf_counter() - t
    backend_flags.apply_speed(cudnn_benchmark=True, tf32=False, compiled=True)  # as the service's compiled load
    getattr(pipe, family.denoiser).compile_repeated_blocks(fullgraph=True, dynamic=True, backend=args.backend)

    def call() -> float:
        t0 = time.perf_counter()
        warm_up(pipe, family, pipe.vae_scale_factor * 2, args.resolution, batches=WARM_UP_BATCHES)  # the service's
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    first, second = call(), call()
    print(json.dumps({
        "model": args.model_dir.name, "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "load_s": round(load_s, 2), "first_call_s": round(first, 2),
        "second_call_s": round(second, 2),
        "counters": {k: dict(counters[k]) for k in ("inductor", "aot_autograd", "stats") if k in counters},
        "phases_s": {k: round(sum(compilation_time_metrics[k]), 2) for k in PHASES if k in compilation_time_metrics},
    }))


if __name__ == "__main__":
    main()
