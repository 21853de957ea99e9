"""Every precision, memory mode and speed mode through the gRPC service, measured. Run on a GPU host.

    python -m benchmarks.inference_bench --family zimage --workdir /tmp/bench --out docs/bench/inference.jsonl

Builds a full-size random-weight pipeline (real architecture config; --tiny for the tiny one),
starts a broker (real NVML inventory) and the inference service under it, and for each mode:
Load, one untimed generation, then --gens timed ones. Records per mode: load time, compile
warm-up (cold, and warm after a service restart with the same compile cache), denoise time
per step, end-to-end Generate latency over gRPC, phase timings, peak VRAM, and PSNR against
the speed-off bf16 image of the same seed. A mode the card cannot run is recorded with the
service's reason. One JSON object per figure, appended as soon as it is measured.
"""
from __future__ import annotations

import argparse
import io
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import inference_pb2_grpc
from diffusion_client.inference import collect
from service_kit.server_runtime import CLIENT_OPTIONS
from benchmarks.bench_record import Recorder, host_description
from service_kit.service_process import ROOT, start_service

MODES: dict[str, dict] = {
    "bf16-off": dict(compute_precision=c.PRECISION_BF16, speed_mode=c.SPEED_MODE_OFF),
    "bf16-default": dict(compute_precision=c.PRECISION_BF16, speed_mode=c.SPEED_MODE_DEFAULT),
    "fp8-default": dict(transformer_precision=c.PRECISION_FP8, speed_mode=c.SPEED_MODE_DEFAULT),
    "int8-default": dict(transformer_precision=c.PRECISION_INT8, speed_mode=c.SPEED_MODE_DEFAULT),
    "int8-off": dict(transformer_precision=c.PRECISION_INT8, speed_mode=c.SPEED_MODE_OFF),
    "auto-default": dict(transformer_precision=c.PRECISION_AUTO, speed_mode=c.SPEED_MODE_DEFAULT),
    "nf4-off": dict(transformer_precision=c.PRECISION_NF4, speed_mode=c.SPEED_MODE_OFF),
    "fp16-off": dict(compute_precision=c.PRECISION_FP16, speed_mode=c.SPEED_MODE_OFF),
    "fp32-off": dict(compute_precision=c.PRECISION_FP32, speed_mode=c.SPEED_MODE_OFF),
    "te-fp8-off": dict(text_encoder_precision=c.PRECISION_FP8, speed_mode=c.SPEED_MODE_OFF),
    "te-nvfp4-off": dict(text_encoder_precision=c.PRECISION_NVFP4, speed_mode=c.SPEED_MODE_OFF),
    "mxfp8-default": dict(transformer_precision=c.PRECISION_MXFP8, speed_mode=c.SPEED_MODE_DEFAULT),
    "nvfp4-default": dict(transformer_precision=c.PRECISION_NVFP4, speed_mode=c.SPEED_MODE_DEFAULT),
    "balanced-off": dict(memory_mode=c.MEMORY_MODE_BALANCED, speed_mode=c.SPEED_MODE_OFF),
    "low_vram-off": dict(memory_mode=c.MEMORY_MODE_LOW_VRAM, speed_mode=c.SPEED_MODE_OFF),
    "sequential-off": dict(memory_mode=c.MEMORY_MODE_SEQUENTIAL, speed_mode=c.SPEED_MODE_OFF),
    "bf16-max": dict(compute_precision=c.PRECISION_BF16, speed_mode=c.SPEED_MODE_MAX),
    "fp8-max": dict(transformer_precision=c.PRECISION_FP8, speed_mode=c.SPEED_MODE_MAX),
}
GEN = {"zimage": dict(width=1024, height=1024, steps=9, guidance_scale=0.0),
       "flux1": dict(width=1024, height=1024, steps=28, guidance_scale=3.5)}
TINY_GEN = dict(width=64, height=64, steps=2)
FEW_STEPS = {"sequential-off": 2}  # sequential streams every weight per step: a few steps show its rate


def image_array(data: bytes):
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64)


def psnr(a, b) -> float:
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def setting(resolved, control):
    return next((r for r in resolved if r.control == control), None)


def timed(stub, request, gens: int, fresh_prompts: bool = False) -> list:
    """`gens` Generates of one request: (client wall seconds, Generation) each. `fresh_prompts`: each with a
    prompt not seen before, so that the text encoders run (the service reuses a repeated prompt's encoding)."""
    runs = []
    for i in range(gens):
        if fresh_prompts:
            fresh = pb.GenerateRequest()
            fresh.CopyFrom(request)
            fresh.prompt = f"{request.prompt}, variation {i} at {time.time_ns()}"
        t = time.perf_counter()
        out = collect(stub.Generate(fresh if fresh_prompts else request, timeout=900))
        runs.append((time.perf_counter() - t, out))
    return runs


def run_mode(stub, record, mode, family, model_dir, gen_fields, gens, references, extra_steps=(), formats=(),
             step_caches=(), fresh_prompts=False, batch_images=1):
    """Loads, generates and records one mode. Returns its image per step count: the timed one, and one more
    for each of `extra_steps` (the bf16-off reference of a mode that runs fewer steps)."""
    req = pb.LoadRequest(model_id=f"{family}-{mode}", priority=5, source=c.ModelSource(local_dir=str(model_dir)),
                         **MODES[mode])
    t0 = time.perf_counter()
    try:
        events = list(stub.Load(req, timeout=900))
    except grpc.RpcError as e:
        record(mode, "ran", 0, "bool", detail=f"{e.code().name}: {e.details()}")
        return {}
    record(mode, "load_s", time.perf_counter() - t0, "s")
    resolved = events[-1].result.resolved
    applied = {r.control: r.applied for r in resolved}
    fell_back = {r.control: r.reason for r in resolved if r.status == c.SETTING_STATUS_FELL_BACK}
    warm = setting(resolved, "compile_warmup")
    if warm:
        seconds, note = compile_seconds(resolved)
        record(mode, "compile_warmup_s", seconds, "s", **({"note": note} if note else {}))
    steps = FEW_STEPS.get(mode, gen_fields["steps"])
    fields = {**gen_fields, "steps": steps}
    request = pb.GenerateRequest(model_id=req.model_id, prompt="a lighthouse on a cliff at dusk, oil painting",
                                 seeds=[1234], **fields)
    try:
        list(stub.Generate(request, timeout=900))  # untimed: first-call effects
        results = timed(stub, request, gens)
    except grpc.RpcError as e:
        record(mode, "ran", 0, "bool", detail=f"generate {e.code().name}: {e.details()}")
        return {}
    record(mode, "ran", 1, "bool", applied=applied, fell_back=fell_back, steps=steps,
           size=f"{fields['width']}x{fields['height']}")
    e2e = statistics.median(r[0] for r in results)
    timings = results[len(results) // 2][1].timings
    ms = lambda d: d.ToNanoseconds() / 1e6  # noqa: E731
    record(mode, "e2e_generate_ms", e2e * 1000, "ms", steps=steps)
    record(mode, "denoise_ms_per_step", statistics.median(ms(r[1].timings.denoise) / steps for r in results), "ms")
    record(mode, "encode_prompt_ms", ms(timings.encode_prompt), "ms")
    record(mode, "vae_decode_ms", ms(timings.decode), "ms")
    record(mode, "image_encode_ms", ms(timings.encode_images), "ms")
    record(mode, "peak_vram_gib", max(r[1].result.peak_memory_bytes for r in results) / 2**30, "GiB")
    for name in formats:  # the same generation in another output format: what the image encode costs end to end
        other = pb.GenerateRequest()
        other.CopyFrom(request)
        other.output_format = getattr(pb, f"IMAGE_FORMAT_{name.upper()}")
        runs = timed(stub, other, gens)
        record(mode, "e2e_generate_ms", statistics.median(r[0] for r in runs) * 1000, "ms", steps=steps, format=name)
        record(mode, "image_encode_ms", statistics.median(ms(r[1].timings.encode_images) for r in runs), "ms",
               format=name)
    if fresh_prompts:  # the same, each generation with a new prompt: the text encoders run every time
        runs = timed(stub, request, gens, fresh_prompts=True)
        record(mode, "e2e_generate_ms", statistics.median(r[0] for r in runs) * 1000, "ms", steps=steps,
               prompts="fresh")
        record(mode, "denoise_ms_per_step", statistics.median(ms(r[1].timings.denoise) / steps for r in runs), "ms",
               prompts="fresh", model_moves=[setting(r[1].result.resolved, "model_moves").applied
                                             for r in runs if setting(r[1].result.resolved, "model_moves")])
        record(mode, "encode_prompt_ms", statistics.median(ms(r[1].timings.encode_prompt) for r in runs), "ms",
               prompts="fresh")
        record(mode, "vae_decode_ms", statistics.median(ms(r[1].timings.decode) for r in runs), "ms", prompts="fresh")
    if batch_images > 1:  # one request for several images (one batched pipeline call): images/s against one image
        batch = pb.GenerateRequest()
        batch.CopyFrom(request)
        batch.seeds[:] = [1234 + i for i in range(batch_images)]
        list(stub.Generate(batch, timeout=900))  # untimed: a compiled model traces the new batch size once
        runs = timed(stub, batch, gens)
        wall = statistics.median(r[0] for r in runs)
        record(mode, "e2e_generate_ms", wall * 1000, "ms", steps=steps, images=batch_images,
               batch_split=[setting(r[1].result.resolved, "batch_split").applied
                            for r in runs if setting(r[1].result.resolved, "batch_split")])
        record(mode, "denoise_ms_per_step", statistics.median(ms(r[1].timings.denoise) / steps for r in runs), "ms",
               images=batch_images)
        record(mode, "images_per_s_vs_one", (batch_images / wall) / (1 / e2e), "x", images=batch_images,
               target=">= 3 at 4 images", peak_vram_gib=max(r[1].result.peak_memory_bytes for r in runs) / 2**30)
        first = image_array(runs[-1][1].images[0].data)
        single = image_array(results[-1][1].images[0].data)
        record(mode, "batch_first_image_max_abs_diff", float(abs(first.astype(int) - single.astype(int)).max()), "levels",
               images=batch_images, note="the batch's first image (seed 1234) against the single image of that seed")
    images = {steps: image_array(results[-1][1].images[0].data)}
    if steps in references:
        value = psnr(images[steps], references[steps])
        record(mode, "psnr_vs_bf16_off_db", value if math.isfinite(value) else 999.0, "dB", steps=steps,
               note="999 means identical" if not math.isfinite(value) else "")
    uncached_step = statistics.median(ms(r[1].timings.denoise) / steps for r in results)
    for threshold in step_caches:  # the same generation with First-Block Cache: speed, passes skipped, PSNR
        cached = pb.GenerateRequest()
        cached.CopyFrom(request)
        cached.step_cache.CopyFrom(pb.StepCache(mode=pb.STEP_CACHE_MODE_FIRST_BLOCK, threshold=threshold))
        try:
            runs = timed(stub, cached, gens)
        except grpc.RpcError as e:
            record(mode, "step_cache_ran", 0, "bool", threshold=threshold, detail=f"{e.code().name}: {e.details()}")
            continue
        per_step = statistics.median(ms(r[1].timings.denoise) / steps for r in runs)
        passes = setting(runs[-1][1].resolved, "step_cache").applied
        value = psnr(image_array(runs[-1][1].images[0].data), images[steps])
        record(mode, "e2e_generate_ms", statistics.median(r[0] for r in runs) * 1000, "ms", steps=steps,
               step_cache=threshold)
        record(mode, "denoise_ms_per_step", per_step, "ms", step_cache=threshold, passes=passes)
        record(mode, "step_cache_denoise_speedup", uncached_step / per_step, "x", step_cache=threshold,
               target=">= 1.5 at >= 30 dB (FLUX, 28 steps)")
        record(mode, "step_cache_psnr_vs_uncached_db", value if math.isfinite(value) else 999.0, "dB",
               step_cache=threshold, note="against this mode's own uncached image of the same seed")
    for extra in extra_steps:
        extra_request = pb.GenerateRequest()
        extra_request.CopyFrom(request)
        extra_request.steps = extra
        images[extra] = image_array(collect(stub.Generate(extra_request, timeout=900)).images[0].data)
    stub.Unload(pb.UnloadRequest(model_id=req.model_id))
    return images


def compile_seconds(resolved) -> tuple[float, str]:
    """The load's compile time: its warm-up, plus loading or compiling the blocks ahead of time where it did."""
    warm = setting(resolved, "compile_warmup")
    seconds = float(warm.applied.rstrip("s"))
    aot = setting(resolved, "compile_ahead_of_time")
    found = re.search(r" in ([0-9.]+)s$", aot.applied) if aot is not None else None
    if found is None:
        return seconds, (f"blocks compiled ahead of time: {aot.applied} ({aot.reason})" if aot is not None else "")
    return seconds + float(found.group(1)), f"blocks compiled ahead of time: {aot.applied} (included), warm-up {warm.applied}"


def time_warm_restart(stub, record, model_dir, mode):
    """A new service process loads `mode` again with the compile cache the cold load filled."""
    req = pb.LoadRequest(model_id="warm", source=c.ModelSource(local_dir=str(model_dir)), **MODES[mode])
    events = list(stub.Load(req, timeout=900))
    seconds, note = compile_seconds(events[-1].result.resolved)
    record(mode, "compile_warmup_warm_restart_s", seconds, "s",
           note="new service process, same compile cache directory" + (f"; {note}" if note else ""))
    stub.Unload(pb.UnloadRequest(model_id="warm"))


def start_stack(workdir: Path, cache: Path, tiny: bool, aot_blocks: bool = False):
    import torch

    # The real NVML inventory on a GPU host; a fake one-device inventory where there is none (a CPU dry run).
    inventory = [] if torch.cuda.is_available() else ["--fake-devices", "1x24GiB"]
    broker = start_service("gpu_broker", "--log-level", "WARNING", *inventory)
    return broker, start_inference(broker.address, cache, tiny, workdir, aot_blocks)


def start_inference(broker_address: str, cache: Path, tiny: bool, workdir: Path, aot_blocks: bool = False):
    flags = ["--broker", broker_address, "--compile-cache-dir", str(cache), "--log-level", "WARNING",
             "--model-root", str(workdir), "--aot-blocks" if aot_blocks else "--no-aot-blocks"]  # models are built there
    if tiny:
        flags += ["--quant-min-features", "16", "--warmup-resolution", "64"]
    return start_service("inference_service", *flags, timeout=600)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=["zimage", "flux1"], required=True)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/inference-bench"))
    p.add_argument("--out", type=Path)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--gens", type=int, default=2)
    p.add_argument("--tiny", action="store_true", help="the tiny pipeline: a quick check of every code path")
    p.add_argument("--formats", default="", help="also time each mode's Generate in these output formats "
                                                 "(comma-separated: jpeg,webp,raw_rgb8); PNG is always timed")
    p.add_argument("--warm-restart", action="store_true",
                   help="after each compiled mode, restart the service and time that mode's warm compile")
    p.add_argument("--aot-blocks", action=argparse.BooleanOptionalAction, default=True,
                   help="the service keeps blocks compiled ahead of time (its default): the warm restart loads "
                        "them (--no-aot-blocks: every process compiles the regular way)")
    p.add_argument("--step-cache", default="", help="also time each mode's Generate with First-Block Cache at these "
                                                    "thresholds (comma-separated), against its uncached image")
    p.add_argument("--fresh-prompts", action="store_true",
                   help="also time each mode with a new prompt per generation (the text encoders run each time)")
    p.add_argument("--images", type=int, default=1,
                   help="also time each mode with one request for this many images (one batched call)")
    p.add_argument("--deadline-s", type=float, default=1e9,
                   help="stop starting modes after this many seconds (a device run has a hard limit)")
    args = p.parse_args()
    started = time.perf_counter()
    args.workdir.mkdir(parents=True, exist_ok=True)
    model_dir = args.workdir / f"{args.family}{'-tiny' if args.tiny else ''}"
    t = time.perf_counter()
    build = ("from demos.tiny_pipelines import save_tiny_pipeline as s" if args.tiny
             else "from benchmarks.full_size_pipelines import save_full_size as s")
    if not (model_dir / "model_index.json").exists():
        subprocess.run([sys.executable, "-c", f"{build}; s({args.family!r}, {str(model_dir)!r})"], cwd=ROOT, check=True)
    print(f"model ready in {time.perf_counter() - t:.1f}s", flush=True)
    command = "python -m benchmarks.inference_bench " + " ".join(sys.argv[1:])
    record = Recorder("inference", args.out, args.family, command, host_description())
    gen_fields = TINY_GEN if args.tiny else GEN[args.family]
    cache = args.workdir / "inductor-cache"
    broker, inference = start_stack(args.workdir, cache, args.tiny, args.aot_blocks)
    # The bf16 speed-off images every PSNR compares against, one per step count the modes run, kept so a
    # later invocation (a run split across device commands) compares against the same references.
    modes = args.modes.split(",")
    step_counts = sorted({FEW_STEPS.get(m, gen_fields["steps"]) for m in modes} - {gen_fields["steps"]})
    stem = f"reference-{args.family}{'-tiny' if args.tiny else ''}"
    reference_file = lambda steps: args.workdir / (  # noqa: E731
        f"{stem}.npy" if steps == gen_fields["steps"] else f"{stem}-{steps}steps.npy")
    references = {}
    if "bf16-off" not in modes:
        import numpy as np

        references = {steps: np.load(reference_file(steps)).astype(np.float64)
                      for steps in [gen_fields["steps"], *step_counts] if reference_file(steps).exists()}
    try:
        ch = grpc.insecure_channel(inference.address, options=CLIENT_OPTIONS)
        stub = inference_pb2_grpc.InferenceServiceStub(ch)
        for mode in modes:
            if args.deadline_s - (time.perf_counter() - started) < 60:
                record(mode, "ran", 0, "bool", detail=f"not run: the bench's {args.deadline_s:.0f} s deadline was reached")
                continue
            print(f"--- {mode}", flush=True)
            images = run_mode(stub, record, mode, args.family, model_dir, gen_fields, args.gens, references,
                              extra_steps=step_counts if mode == "bf16-off" else (),
                              formats=[f for f in args.formats.split(",") if f],
                              step_caches=[float(x) for x in args.step_cache.split(",") if x],
                              fresh_prompts=args.fresh_prompts, batch_images=args.images)
            if mode == "bf16-off":
                import numpy as np

                references = images
                for steps, image in images.items():
                    np.save(reference_file(steps), image.astype(np.uint8))  # PNG pixels: exact, and 3 MB, not 25
            if args.warm_restart and MODES[mode]["speed_mode"] != c.SPEED_MODE_OFF:
                # Straight after the cold compile, so a later mode that outruns the device limit cannot cost it.
                inference.stop()
                inference = start_inference(broker.address, cache, args.tiny, args.workdir, args.aot_blocks)
                ch.close()
                ch = grpc.insecure_channel(inference.address, options=CLIENT_OPTIONS)
                stub = inference_pb2_grpc.InferenceServiceStub(ch)
                time_warm_restart(stub, record, model_dir, mode)
        ch.close()
    finally:
        inference.stop()
        broker.stop()


if __name__ == "__main__":
    main()
