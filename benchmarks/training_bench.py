"""LoRA training at every base precision through the gRPC service, measured. Run on a GPU host.

    python -m benchmarks.training_bench --family zimage --workdir /tmp/tbench --out docs/bench/training.jsonl

Builds a full-size random-weight pipeline (real architecture config; --tiny for the tiny one) and a
small dataset of generated images, starts a broker (real NVML inventory) and the training service
under it, and trains one job per mode through StartTraining / WatchTraining. Records per mode:
whether it ran (or the service's reason), setup time (start to first step), first-step time
(compile warm-up for the compiled modes: cold on the first compiled run, warm on a repeat that
shares the compile cache), steady-state steps/s from the step events, peak memory and the last
loss. One JSON object per figure, appended as soon as it is measured.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import grpc

from benchmarks.bench_record import Recorder, host_description
from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from training_service.nf4_weights import BACKENDS as NF4_BACKENDS, DEFAULT_BACKEND as NF4_DEFAULT
from training_service.step_trace import host_rows, parse_window

FAMILY = {"zimage": c.FAMILY_ZIMAGE, "flux1": c.FAMILY_FLUX1}
RESOLUTION = {"zimage": 768, "flux1": 512}
MODES: dict[str, dict] = {
    "fp32": dict(base_precision=c.PRECISION_FP32),  # the CPU mode: a check of the bench itself
    "nf4": dict(base_precision=c.PRECISION_NF4),
    "bf16": dict(base_precision=c.PRECISION_BF16),
    "int8": dict(base_precision=c.PRECISION_INT8),
    "fp8": dict(base_precision=c.PRECISION_FP8),
    "mxfp8": dict(base_precision=c.PRECISION_MXFP8),
    "auto": dict(base_precision=c.PRECISION_AUTO),
    "fp32-compile": dict(base_precision=c.PRECISION_FP32, speed_mode=c.SPEED_MODE_DEFAULT),  # the CPU's check
    "fp32-compile-warm": dict(base_precision=c.PRECISION_FP32, speed_mode=c.SPEED_MODE_DEFAULT),
    "bf16-compile": dict(base_precision=c.PRECISION_BF16, speed_mode=c.SPEED_MODE_DEFAULT),
    "bf16-compile-warm": dict(base_precision=c.PRECISION_BF16, speed_mode=c.SPEED_MODE_DEFAULT),
    # MAX: cuDNN attention first on Z-Image, CUDA graph replay on both (attention_choice, graph_choice)
    "bf16-max": dict(base_precision=c.PRECISION_BF16, speed_mode=c.SPEED_MODE_MAX),
    "bf16-max-warm": dict(base_precision=c.PRECISION_BF16, speed_mode=c.SPEED_MODE_MAX),
    "fp8-compile": dict(base_precision=c.PRECISION_FP8, speed_mode=c.SPEED_MODE_DEFAULT),
    "fp8-compile-warm": dict(base_precision=c.PRECISION_FP8, speed_mode=c.SPEED_MODE_DEFAULT),
    "bf16-gc": dict(base_precision=c.PRECISION_BF16, gradient_checkpointing=True),
    "nf4-adamw8bit": dict(base_precision=c.PRECISION_NF4, optimizer=pb.OPTIMIZER_ADAMW_8BIT),
    # the memory floor: nf4 base, checkpointed blocks, 8-bit optimizer state
    "nf4-gc": dict(base_precision=c.PRECISION_NF4, gradient_checkpointing=True),
    "nf4-gc-adamw8bit": dict(base_precision=c.PRECISION_NF4, gradient_checkpointing=True,
                             optimizer=pb.OPTIMIZER_ADAMW_8BIT),
    # the floor's speed: compiled nf4 blocks, every block checkpointed or one call in every 2 or 3
    "nf4-gc-compile": dict(base_precision=c.PRECISION_NF4, gradient_checkpointing=True,
                           speed_mode=c.SPEED_MODE_DEFAULT),
    "nf4-gc2-compile": dict(base_precision=c.PRECISION_NF4, gradient_checkpointing=True,
                            gradient_checkpointing_interval=2, speed_mode=c.SPEED_MODE_DEFAULT),
    "nf4-gc3-compile": dict(base_precision=c.PRECISION_NF4, gradient_checkpointing=True,
                            gradient_checkpointing_interval=3, speed_mode=c.SPEED_MODE_DEFAULT),
}
CAPTION = ("a weathered lighthouse on a basalt cliff at dusk, waves breaking below, warm light in the lantern room, "
           "oil painting with thick brush strokes")


def ensure_base(workdir: Path, family: str, tiny: bool) -> Path:
    """The tiny or the full-size random-weight pipeline under workdir, built once."""
    base_dir = workdir / (("tiny-" if tiny else "full-") + family)
    if tiny:
        from demos.tiny_pipelines import save_tiny_pipeline

        if not (base_dir / "model_index.json").exists():
            save_tiny_pipeline(family, base_dir)
    else:
        from benchmarks.full_size_pipelines import save_full_size

        save_full_size(family, base_dir)
    return base_dir


def make_dataset(directory: Path, resolution: int, n: int = 4) -> Path:
    import numpy as np
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        pixels = rng.integers(0, 256, (resolution, resolution, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(directory / f"{i}.png")
        (directory / f"{i}.txt").write_text(CAPTION)
    return directory


def run_mode(stub, record, mode, family, base_dir, data_dir, steps, resolution, timeout_s, jobs_dir, trace=None):
    req = pb.StartTrainingRequest(family=FAMILY[family], base=c.ModelSource(local_dir=str(base_dir)),
                                  dataset=pb.Dataset(image_dir=str(data_dir)), rank=16, steps=steps,
                                  resolution=resolution, seed=0, adapter_id=f"bench-{family}-{mode}-{int(time.time())}",
                                  **MODES[mode])
    t0 = time.perf_counter()
    try:
        job_id = stub.StartTraining(req, timeout=60).job_id
    except grpc.RpcError as e:
        record(mode, "ran", 0, "bool", detail=f"{e.code().name}: {e.details()}")
        return
    first_step_at, steps_seen, resolved, warnings, finished = None, [], {}, [], None
    try:
        for event in stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=timeout_s):
            kind = event.WhichOneof("event")
            if kind == "resolved":
                resolved.update({r.control: r.applied for r in event.resolved.resolved})
            elif kind == "warning":
                warnings.append(f"{event.warning.reason}: {event.warning.message}")
            elif kind == "step":
                if first_step_at is None:
                    first_step_at = time.perf_counter()
                steps_seen.append(event.step)
            elif kind == "finished":
                finished = event.finished
    except grpc.RpcError as e:
        stub.StopTraining(pb.StopTrainingRequest(job_id=job_id, mode=pb.STOP_MODE_DISCARD), timeout=30)
        record(mode, "ran", 0, "bool", detail=f"watch {e.code().name} after {len(steps_seen)} steps, "
               f"{time.perf_counter() - t0:.0f} s after start: {e.details()}",
               applied=resolved)
        return
    ok = finished is not None and finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED
    stderr = jobs_dir / job_id / "trainer.stderr"
    record(mode, "ran", int(ok), "bool", applied=resolved, warnings=warnings, steps=len(steps_seen),
           size=f"{resolution}px", detail=finished.message if finished else "no finished event",
           **({} if ok or not stderr.is_file() else {"stderr_tail": stderr.read_text()[-1500:]}))
    if not steps_seen:
        return
    first = steps_seen[0]
    traced = steps_seen[trace[0] - 1:trace[0] - 1 + trace[1]] if trace else []
    timed = steps_seen[:trace[0] - 1] if traced else steps_seen  # the traced steps ran slower: the rate is before
    timed_note = {"note": f"steps before the traced {trace[0]}-{traced[-1].step}"} if traced else {}
    record(mode, "setup_s", first_step_at - t0 - first.elapsed.ToNanoseconds() / 1e9, "s")
    record(mode, "first_step_s", first.elapsed.ToNanoseconds() / 1e9, "s")
    record(mode, "start_to_first_step_s", first_step_at - t0, "s",
           note="StartTraining to the first step's event: setup, any ahead-of-time graph load, and the first step")
    skip = min(5, len(timed) - 2)
    if skip >= 1:
        a, b = timed[skip], timed[-1]
        per_step = (b.elapsed.ToNanoseconds() - a.elapsed.ToNanoseconds()) / 1e9 / (b.step - a.step)
        elapsed = [s.elapsed.ToNanoseconds() / 1e6 for s in timed]
        step_ms = [round(b - a, 1) for a, b in zip(elapsed, elapsed[1:])]  # a recompile or a slow step shows here
        record(mode, "steps_per_s", 1 / per_step, "steps/s", batch=1, step_ms=step_ms,
               median_step_ms=statistics.median(step_ms[skip:]), **timed_note)
    summary = jobs_dir / job_id / "trace" / "summary.json"
    if traced and summary.is_file():
        record_trace(record, mode, json.loads(summary.read_text()), summary.parent / "ops.txt")
    record(mode, "peak_memory_gib", max(s.peak_memory_bytes for s in steps_seen) / 2**30, "GiB")
    record(mode, "peak_reserved_gib", max(s.peak_reserved_bytes for s in steps_seen) / 2**30, "GiB",
           lease=resolved.get("gpu_memory", ""), note="what the trainer's allocator held: what the lease covers")
    record(mode, "last_loss", steps_seen[-1].loss, "", finite=all(s.loss == s.loss for s in steps_seen),
           median_grad_norm=statistics.median(s.grad_norm for s in steps_seen))


def deadline_refusal(deadline_s: float, left_s: float, slowest_job_s: float) -> str:
    """Why the next mode is not started with `left_s` of the bench's `deadline_s` left, given the longest job so far
    (its compile included); "" when it may start. A job the deadline cuts short is discarded, and its GPU time with
    it: a mode that would need as long as the slowest one did is not started."""
    if left_s < 60:
        return f"not run: the bench's {deadline_s:.0f} s deadline was reached"
    if left_s < slowest_job_s:
        return (f"not run: {left_s:.0f} s of the bench's {deadline_s:.0f} s deadline were left and a job of this run "
                f"took {slowest_job_s:.0f} s; a job the deadline cuts short is discarded")
    return ""


# Each traced step's device side (step_trace.StepDeviceTime), carried on the traced_step_ms row.
STEP_SPLIT = ("step_kernel_ms", "step_idle_ms", "step_lead_ms", "step_tail_ms")


def record_trace(record, mode: str, summary: dict, ops: Path) -> None:
    """The rows of the job's own profile of its traced steps (the service's --trace-steps, step_trace)."""
    where = f"steps {summary['first_step']}-{summary['first_step'] + summary['steps'] - 1} under torch.profiler"
    per_step = {key: summary[key] for key in STEP_SPLIT if key in summary}  # traces written before have fewer
    record(mode, "traced_step_ms", statistics.median(summary["step_wall_ms"]), "ms", note=where,
           step_wall_ms=summary["step_wall_ms"], **per_step)
    record(mode, "gpu_busy_share", summary["busy_share"], "fraction", note="CUDA kernel time over wall time")
    if "idle_host_ms" in summary and summary.get("step_idle_ms"):
        record(mode, "gpu_idle_ms_per_step", statistics.mean(summary["step_idle_ms"]), "ms",
               note="no kernel ran; by_host_op: the host operators that ran meanwhile (step_trace.idle_host_time); "
                    "by_loop_phase: the part of the recipe's loop it fell in",
               by_host_op=summary["idle_host_ms"], by_loop_phase=summary.get("idle_phase_ms", {}))
    named = summary.get("kernels_named_by", "operators")
    for key in ("kernel_ms", "gemm_ms", "attention_ms"):
        record(mode, f"{key.removesuffix('_ms')}_ms_per_step", summary[key], "ms",
               **({"note": f"kernels placed by their {named}"} if key != "kernel_ms" else {}))
    record(mode, "attention_kernels_ran", ",".join(summary["attention_ran"]) or "none", "kernels",
           note=f"placed by their {named}")
    for metric, value, unit in host_rows(summary.get("host", {})):  # traces written before it have none
        record(mode, metric, value, unit, **({"note": "the host's own time, under the profiler"}
                                             if metric == "host_ms_per_step" else {}))
    for call, per_step in sorted(summary["calls"].items()):
        record(mode, f"{call}_per_step", per_step, "calls")
    if ops.is_file() and record.out is not None:
        ops_copy = record.out.with_name(f"{record.out.stem}-{mode}-ops.txt")
        ops_copy.write_text(ops.read_text())
        print(f"{mode}: the profiler's busiest operators in {ops_copy}", flush=True)


BASELINE_VARIANTS = {"eager": {"NO_COMPILE": "1"}, "compiled": {}, "nf4": {"NF4": "1"}}


def run_baseline_probe(probe: Path, family: str, record, workdir: Path, budget_s: float, variant: str) -> None:
    """The shared plain diffusers+peft loop, in this same run, so a ratio compares like with like.
    `compiled` runs the eager pass too (the probe compiles the model it has just timed)."""
    import json
    import os
    import subprocess

    nf4 = variant == "nf4"
    out = workdir / f"baseline-{variant}"
    out.mkdir(parents=True, exist_ok=True)
    name = {"zimage": "zimage", "flux1": "flux"}[family]
    env = {**os.environ, "FAMILIES": name, "SDPA_PIN": "1", "BUDGET_S": str(budget_s), "OUT": str(out),
           **BASELINE_VARIANTS[variant]}
    subprocess.run([sys.executable, str(probe), "train"], env=env, timeout=budget_s + 120, check=False)
    path = out / "baseline.json"
    if not path.is_file():
        record("baseline-probe", "ran", 0, "bool", detail="the probe wrote no baseline.json")
        return
    found = json.loads(path.read_text())
    for key, value in found.items():
        if key.startswith(f"{name}.") and ("steps_per_s" in key or key.endswith("peak_GiB") or "compile_first" in key):
            metric = key.split(".")[-1]
            unit = "steps/s" if "steps_per_s" in key else "GiB" if key.endswith("GiB") else "s"
            record("baseline-probe" + ("-nf4" if nf4 else ""), metric, float(value), unit, probe_key=key,
                   note="../shared/tools/baseline_probe.py train, SDPA_PIN=1, fixed random inputs")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=list(FAMILY), required=True)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/training-bench"))
    p.add_argument("--out", type=Path)
    p.add_argument("--modes", default="nf4,bf16,int8,fp8")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--resolution", type=int)
    p.add_argument("--job-timeout", type=float, default=900)
    p.add_argument("--deadline-s", type=float, default=1e9,
                   help="stop starting modes after this many seconds (a device run has a hard limit), and "
                        "do not start one when less is left than the slowest job so far took")
    p.add_argument("--aot-blocks", action=argparse.BooleanOptionalAction, default=True,
                   help="the service's --aot-blocks, on as by default: the first compiled mode compiles and saves "
                        "the blocks' graphs, later ones (the -warm modes) load them (--no-aot-blocks: every "
                        "compiled mode traces the blocks with the regular compile)")
    p.add_argument("--warm-trainer", action=argparse.BooleanOptionalAction, default=True,
                   help="the service's --warm-trainer: trainers forked from a warm process, or started fresh")
    p.add_argument("--nf4-backend", choices=NF4_BACKENDS, default=NF4_DEFAULT,
                   help="the service's --nf4-backend: what holds the nf4 modes' base weights (each row's command, "
                        "and a job's applied settings, say which)")
    p.add_argument("--trace-steps", metavar="FIRST:COUNT",
                   help="the service's --trace-steps: each job profiles these steps, the rows say where their time "
                        "went, and steps/s is taken over the steps before them")
    p.add_argument("--tiny", action="store_true", help="the tiny pipeline: a quick check of every code path")
    p.add_argument("--no-broker", action="store_true", help="train without a lease (a CPU host has none to give)")
    p.add_argument("--baseline-probe", type=Path,
                   help="also run this copy of shared/tools/baseline_probe.py in the same run")
    p.add_argument("--baseline-variants", default="compiled,nf4",
                   help=f"which probe passes: {', '.join(BASELINE_VARIANTS)} (compiled includes the eager pass)")
    p.add_argument("--baseline-budget", type=float, default=420)
    args = p.parse_args()
    try:  # before the pipeline is built: a bad window should not cost a GPU run
        window = parse_window(args.trace_steps) if args.trace_steps else None
    except ValueError as e:
        p.error(str(e))
    command = "python -m benchmarks.training_bench " + " ".join(sys.argv[1:])
    record = Recorder("training", args.out, args.family, command, host_description())
    resolution = args.resolution or (64 if args.tiny else RESOLUTION[args.family])
    t0 = time.perf_counter()
    base_dir = ensure_base(args.workdir, args.family, args.tiny)
    print(f"pipeline ready in {time.perf_counter() - t0:.0f} s", flush=True)
    data_dir = make_dataset(args.workdir / f"data-{resolution}", resolution)
    broker = None if args.no_broker else start_service("gpu_broker", timeout=120)
    service = start_service("training_service", *(() if broker is None else ("--broker", broker.address)), "--output-dir",
                            str(args.workdir / "out"), "--adapter-store", str(args.workdir / "adapters"),
                            "--compile-cache-dir", str(args.workdir / "compile-cache"),
                            "--model-root", str(args.workdir), "--dataset-root", str(args.workdir),
                            "--aot-blocks" if args.aot_blocks else "--no-aot-blocks",
                            "--warm-trainer" if args.warm_trainer else "--no-warm-trainer",
                            "--nf4-backend", args.nf4_backend,
                            *(("--trace-steps", args.trace_steps) if args.trace_steps else ()), timeout=300)
    channel = grpc.insecure_channel(service.address, options=CLIENT_OPTIONS)
    stub = training_pb2_grpc.TrainingServiceStub(channel)
    try:
        slowest = 0.0  # the longest job so far, start to end
        for mode in args.modes.split(","):
            left = args.deadline_s - (time.perf_counter() - t0)
            why = deadline_refusal(args.deadline_s, left, slowest)
            if why:
                record(mode, "ran", 0, "bool", detail=why)
                continue
            print(f"--- {mode}", flush=True)
            started = time.perf_counter()
            run_mode(stub, record, mode, args.family, base_dir, data_dir, args.steps, resolution,
                     min(args.job_timeout, left), args.workdir / "out" / "jobs", window)
            slowest = max(slowest, time.perf_counter() - started)
    finally:
        channel.close()
        service.stop()
    try:
        if args.baseline_probe:  # after the service stopped: the probe has the GPU to itself
            for variant in args.baseline_variants.split(","):
                if args.deadline_s - (time.perf_counter() - t0) < args.baseline_budget + 30:
                    record("baseline-probe", "ran", 0, "bool", detail=f"{variant} not run: the deadline was reached")
                    continue
                run_baseline_probe(args.baseline_probe, args.family, record, args.workdir, args.baseline_budget, variant)
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
