"""`diffusion`: the command line of the three services, built on diffusion_client.

    diffusion serve --model-root models --dataset-root data      # broker, inference and training, here
    diffusion load z models/tiny-zimage --precision fp8
    diffusion generate z "a lighthouse at dusk" -n 2 -o out/
    diffusion train --family zimage --base models/tiny-zimage --data data/lighthouses --steps 100
    diffusion jobs | watch JOB | stop JOB | adapters | models | unload z | status

Addresses come from --inference/--training/--broker, else DIFFUSION_INFERENCE, DIFFUSION_TRAINING and
DIFFUSION_BROKER, else the ports `serve` listens on. A token comes from --token-file, DIFFUSION_TOKEN or
DIFFUSION_TOKEN_FILE. Exit status: 0 success; 2 bad request; 3 not found; 4 failed precondition; 5 resource
exhausted; 6 unauthenticated or permission denied; 7 unavailable (after retries); 8 deadline exceeded;
9 cancelled; 10 a training job that ended FAILED or CANCELLED; 1 anything else.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from google.protobuf.json_format import MessageToDict

from diffusion.v1 import broker_pb2
from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as ipb
from diffusion.v1 import training_pb2 as tpb
from diffusion_client import options as opt
from diffusion_client.broker import Broker
from diffusion_client.errors import EXIT_JOB_FAILED, ClientError
from diffusion_client.inference import Inference
from diffusion_client.training import Training

PORTS = {"broker": 50051, "inference": 50052, "training": 50053}


def address(args, service: str) -> opt.Connection:
    where = getattr(args, service) or os.environ.get(f"DIFFUSION_{service.upper()}") or f"127.0.0.1:{PORTS[service]}"
    token = Path(args.token_file).read_text().strip().splitlines()[0] if args.token_file else opt.token_from_env()
    return opt.Connection(where, token, Path(args.tls_ca) if args.tls_ca else None)


def local(where: str) -> str:
    """A source or folder named on this command line: hub:... as given, a path made absolute (the services take
    absolute paths only; relative ones here mean relative to where the command runs)."""
    return where if where.startswith("hub:") else str(Path(where).expanduser().absolute())


def err(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def out_json(args, value) -> bool:
    if args.json:
        print(json.dumps(value if isinstance(value, (dict, list)) else MessageToDict(value), indent=None))
    return args.json


def short(enum, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix).lower()


def seconds(duration) -> float:
    return duration.ToNanoseconds() / 1e9


def table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in [header, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())


def pixel_count(text: str) -> int:
    """A pixel count given as N or WxH."""
    try:
        width, _, height = text.lower().partition("x")
        return int(width) * int(height) if height else int(width)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a pixel count or WIDTHxHEIGHT, got {text!r}") from None


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


# ---- inference ----------------------------------------------------------------------------------

def cmd_load(args) -> int:
    with Inference(address(args, "inference")) as client:
        def show(ev):
            if not args.json:
                done = f" {ev.bytes_done / 2**20:.0f}/{ev.bytes_total / 2**20:.0f} MiB" if ev.bytes_total else ""
                err(f"{short(ipb.LoadPhase, ev.phase, 'LOAD_PHASE_'):<14} {seconds(ev.elapsed):6.1f}s  "
                    f"{ev.message}{done}")
        model = client.load_model(args.model_id, local(args.source), on_event=show,
                                  transformer_precision=args.precision,
                                  compute_precision=args.compute_precision,
                                  text_encoder_precision=args.text_encoder_precision, memory_mode=args.memory,
                                  speed_mode=args.speed, device_index=args.device, priority=args.priority,
                                  keep_alive_s=args.keep_alive, variant=args.variant or "",
                                  max_pixels_per_call=args.max_pixels_per_call or 0)
    if not out_json(args, model):
        print(f"loaded {model.model_id} ({short(c.Family, model.family, 'FAMILY_')}) on {model.device_name} "
              f"(device {model.device_index})")
        for r in model.resolved:
            print(f"  {r.control:<28} {r.applied}{f'  ({r.reason})' if r.reason else ''}")
    return 0


def cmd_generate(args) -> int:
    from tqdm import tqdm

    fields = {k: v for k, v in dict(width=args.width, height=args.height, steps=args.steps,
                                     num_images=args.num_images, guidance_scale=args.guidance,
                                     negative_prompt=args.negative_prompt,
                                     step_cache=args.step_cache).items() if v is not None}
    adapters = [(a.rsplit(":", 1)[0], float(a.rsplit(":", 1)[1]) if ":" in a else 1.0) for a in args.adapter]
    bar = None

    def show(ev):
        nonlocal bar
        kind = ev.WhichOneof("event")
        if args.json or args.quiet:
            return
        if kind == "queued" and ev.queued.position:
            err(f"queued at position {ev.queued.position}")
        elif kind == "progress":
            bar = bar or tqdm(total=ev.progress.total_steps, unit="step", file=sys.stderr, desc="denoising")
            bar.update(ev.progress.step - bar.n)
        elif kind in ("image", "result") and bar is not None:
            bar.close()
            bar = None

    with Inference(address(args, "inference")) as client:
        generation = client.generate(args.model_id, args.prompt, on_event=show, seeds=args.seed,
                                     output_format=args.format, adapters=adapters, timeout=args.timeout, **fields)
    paths = generation.save(args.output, args.model_id)
    t = generation.timings
    if not out_json(args, {"generation_id": generation.generation_id, "images": [
            {"path": str(p), "seed": i.seed, "width": i.width, "height": i.height, "mime_type": i.mime_type}
            for p, i in zip(paths, generation.images)],
            "timings_s": {k: seconds(getattr(t, k)) for k in ("queued", "encode_prompt", "denoise", "decode",
                                                                "encode_images", "total")}}):
        for path, image in zip(paths, generation.images):
            print(f"{path}  seed {image.seed}  {image.width}x{image.height}")
        err(f"total {seconds(t.total):.2f}s (denoise {seconds(t.denoise):.2f}s)")
    return 0


def cmd_unload(args) -> int:
    with Inference(address(args, "inference")) as client:
        resp = client.unload(args.model_id or "")
    if not out_json(args, resp):
        print(f"unloaded {args.model_id or 'the loaded model'}")
    return 0


def cmd_models(args) -> int:
    with Inference(address(args, "inference")) as client:
        resp = client.models()
    if not out_json(args, resp):
        table([[m.model_id, short(c.Family, m.family, "FAMILY_"), m.device_name, str(m.device_index),
                gib(m.estimated_footprint_bytes)] for m in resp.models],
              ["MODEL", "FAMILY", "DEVICE", "INDEX", "FOOTPRINT"])
    return 0


# ---- training -----------------------------------------------------------------------------------

def follow(client: Training, job_id: str, args, from_sequence: int = 1) -> int:
    """Follows a job to its end with a bar (loss, ETA); re-attaches after a dropped connection."""
    from tqdm import tqdm

    bar = None

    def reconnecting(error, sequence):
        err(f"connection lost ({error.code.name}); re-attaching from event {sequence}")

    for ev in client.watch(job_id, from_sequence, on_reconnect=reconnecting):
        kind = ev.WhichOneof("event")
        if args.json:
            print(json.dumps(MessageToDict(ev)), flush=True)
        elif kind == "phase":
            if bar is None:
                err(f"{short(tpb.TrainingPhase, ev.phase.phase, 'TRAINING_PHASE_')} {ev.phase.message}".rstrip())
        elif kind == "warning":
            err(f"warning: {ev.warning.message}")
        elif kind == "step":
            bar = bar or tqdm(total=ev.step.total_steps, unit="step", file=sys.stderr, desc=job_id)
            bar.set_postfix(loss=f"{ev.step.loss:.4f}", eta=f"{seconds(ev.step.eta):.0f}s", refresh=False)
            bar.update(ev.step.step - bar.n)
        elif kind == "checkpoint" and bar is not None:
            bar.write(f"checkpoint at step {ev.checkpoint.step}", file=sys.stderr)
        if kind == "finished":
            if bar is not None:
                bar.close()
            state = short(tpb.TrainingJobState, ev.finished.state, "TRAINING_JOB_STATE_")
            if not args.json:
                print(f"{job_id} {state}" + (f": adapter {ev.finished.adapter_id}" if ev.finished.adapter_id else "")
                      + (f" ({ev.finished.message})" if ev.finished.message else ""))
            return 0 if ev.finished.state == tpb.TRAINING_JOB_STATE_SUCCEEDED else EXIT_JOB_FAILED
    return EXIT_JOB_FAILED


def cmd_train(args) -> int:
    fields = {k: v for k, v in dict(steps=args.steps, rank=args.rank, resolution=args.resolution,
                                     learning_rate=args.learning_rate, adapter_id=args.adapter_id,
                                     priority=args.priority, seed=args.seed,
                                     device_index=args.device).items() if v is not None}
    if args.gradient_checkpointing is not None:
        fields.update(gradient_checkpointing=True, gradient_checkpointing_interval=args.gradient_checkpointing)
    with Training(address(args, "training")) as client:
        job = client.start(args.family, local(args.base), local(args.data), args.prompt or "",
                           base_precision=args.precision, speed_mode=args.speed,
                           **fields)
        if args.no_follow:
            if not out_json(args, job):
                print(job.job_id)
            return 0
        err(f"started {job.job_id}")
        return follow(client, job.job_id, args)


def cmd_watch(args) -> int:
    with Training(address(args, "training")) as client:
        return follow(client, args.job_id, args, args.from_sequence)


def cmd_jobs(args) -> int:
    with Training(address(args, "training")) as client:
        jobs = client.jobs()
    if not out_json(args, [MessageToDict(j) for j in jobs]):
        table([[j.job_id, short(tpb.TrainingJobState, j.state, "TRAINING_JOB_STATE_"),
                short(c.Family, j.family, "FAMILY_"), f"{j.steps_completed}/{j.total_steps}", j.adapter_id,
                j.error[:60]] for j in jobs], ["JOB", "STATE", "FAMILY", "STEPS", "ADAPTER", "ERROR"])
    return 0


def cmd_stop(args) -> int:
    with Training(address(args, "training")) as client:
        job = client.stop(args.job_id, discard=args.discard)
    if not out_json(args, job):
        print(f"{job.job_id} {short(tpb.TrainingJobState, job.state, 'TRAINING_JOB_STATE_')}")
    return 0


def cmd_adapters(args) -> int:
    with Training(address(args, "training")) as client:
        adapters = client.adapters()
    if not out_json(args, [MessageToDict(a) for a in adapters]):
        table([[a.adapter_id, short(c.Family, a.family, "FAMILY_"), str(a.rank), str(a.steps),
                ",".join(a.trigger_words), a.job_id] for a in adapters],
              ["ADAPTER", "FAMILY", "RANK", "STEPS", "TRIGGERS", "JOB"])
    return 0


# ---- broker -------------------------------------------------------------------------------------

def compute_of(lease) -> str:
    """What a lease's holder does with the device's compute: interactive (busy or idle), or batch (yielding)."""
    if lease.compute_class == broker_pb2.COMPUTE_CLASS_BATCH:
        return f"batch, yields to {lease.yielding_to_lease_id}" if lease.yielding_to_lease_id else "batch"
    return "interactive, busy" if lease.busy else "interactive"


def cmd_status(args) -> int:
    gpu = Broker(address(args, "broker"))
    try:
        state = gpu.status()
    finally:
        gpu.close()
    if out_json(args, state):
        return 0
    table([[str(d.index), d.name, gib(d.total_bytes), gib(d.leased_bytes)] for d in state.devices],
          ["DEVICE", "NAME", "TOTAL", "LEASED"])
    print()
    table([[x.lease_id, x.holder.client_id, str(x.device_index), "whole" if x.exclusive else gib(x.memory_bytes),
            str(x.holder.priority), compute_of(x), x.holder.purpose[:50]] for x in state.leases],
          ["LEASE", "HOLDER", "DEVICE", "MEMORY", "PRIORITY", "COMPUTE", "PURPOSE"])
    if state.queue:
        print()
        table([[str(w.position), w.request_id, w.holder.client_id, gib(w.memory_bytes),
                str(w.effective_priority)] for w in state.queue], ["POS", "REQUEST", "HOLDER", "MEMORY", "PRIORITY"])
    return 0


# ---- serve --------------------------------------------------------------------------------------

def cmd_serve(args) -> int:
    """The three services on this host, on the ports the other commands default to, until Ctrl-C."""
    import signal
    import threading

    from service_kit.service_process import start_service

    host = args.host
    broker_flags = ["--fake-devices", args.fake_devices] if args.fake_devices else []
    roots = [x for r in args.model_root for x in ("--model-root", local(r))]
    started = []
    try:
        broker = start_service("gpu_broker", *broker_flags, listen=f"{host}:{PORTS['broker']}")
        started.append(broker)
        inference = start_service("inference_service", "--broker", broker.address, *roots,
                                  *(["--compile-backend", args.compile_backend] if args.compile_backend else []),
                                  listen=f"{host}:{PORTS['inference']}", timeout=300)
        started.append(inference)
        training = start_service("training_service", "--broker", broker.address, *roots,
                                 *[x for r in args.dataset_root for x in ("--dataset-root", local(r))],
                                 listen=f"{host}:{PORTS['training']}", timeout=300)
        started.append(training)
        print(f"broker {broker.address}, inference {inference.address}, training {training.address}; "
              "Ctrl-C stops them", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(1.0):
                if any(p.proc.poll() is not None for p in started):
                    err("a service exited; stopping the others")
                    return 1
        except KeyboardInterrupt:
            pass
        return 0
    finally:
        for proc in reversed(started):
            proc.stop()


# ---- parsing ------------------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="diffusion", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inference", help="the inference service's HOST:PORT")
    p.add_argument("--training", help="the training service's HOST:PORT")
    p.add_argument("--broker", help="the GPU broker's HOST:PORT")
    p.add_argument("--token-file", help="a file whose first line is this caller's bearer token")
    p.add_argument("--tls-ca", help="PEM CA of the services' certificates: talk TLS")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="start broker, inference and training here, on the default ports")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--model-root", action="append", default=[], help="a folder models may be loaded from")
    s.add_argument("--dataset-root", action="append", default=[], help="a folder datasets may be read from")
    s.add_argument("--fake-devices", help="e.g. 1x24GiB: a pretend inventory for hosts without a GPU")
    s.add_argument("--compile-backend", help="torch.compile backend (aot_eager on a CPU host)")
    s.set_defaults(run=cmd_serve)

    s = sub.add_parser("load", help="load a model (phases on stderr)")
    s.add_argument("model_id")
    s.add_argument("source", help="a pipeline folder, a .safetensors or .gguf file, or hub:ORG/NAME[@REV]")
    s.add_argument("--precision", help="transformer precision: nf4, int8, fp8, mxfp8, nvfp4, auto")
    s.add_argument("--compute-precision", help="bf16, fp16 or fp32")
    s.add_argument("--text-encoder-precision", help="fp8 or nvfp4")
    s.add_argument("--memory", help="auto, resident, balanced, low_vram or sequential")
    s.add_argument("--speed", help="off, default or max")
    s.add_argument("--device", type=int, help="the device index to load on")
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--variant", help="a hub repo's weight variant, e.g. fp16 (default: the plain weights)")
    s.add_argument("--keep-alive", type=float, metavar="SECONDS",
                   help="unload after this long idle (negative: never; 0: after each generation)")
    s.add_argument("--max-pixels-per-call", type=pixel_count, metavar="N|WxH",
                   help="the largest image (or pixels of images per call) its GPU lease plans room for, e.g. "
                        "2048x2048 (default: the family's default image)")
    s.set_defaults(run=cmd_load)

    s = sub.add_parser("generate", help="generate images into a folder (a progress bar on stderr)")
    s.add_argument("model_id")
    s.add_argument("prompt")
    s.add_argument("-o", "--output", default=".", help="folder for the images (MODEL-SEED.EXT)")
    s.add_argument("-n", "--num-images", type=int)
    s.add_argument("--seed", type=int, action="append", default=[], help="repeat for several images")
    s.add_argument("--steps", type=int)
    s.add_argument("--width", type=int)
    s.add_argument("--height", type=int)
    s.add_argument("--guidance", type=float)
    s.add_argument("--negative-prompt")
    s.add_argument("--format", help="png, webp, jpeg or raw_rgb8")
    s.add_argument("--adapter", action="append", default=[], metavar="ID[:WEIGHT]")
    s.add_argument("--step-cache", type=float, metavar="THRESHOLD",
                   help="First-Block Cache at this threshold (0 to 1; FLUX.1 and Qwen-Image loaded with speed off): "
                        "skips denoiser work on steps that barely change; it changes the image")
    s.add_argument("--timeout", type=float, help="seconds; the service refuses work it cannot finish in time")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(run=cmd_generate)

    s = sub.add_parser("unload", help="unload a model and give its GPU lease back")
    s.add_argument("model_id", nargs="?")
    s.set_defaults(run=cmd_unload)
    sub.add_parser("models", help="the loaded models").set_defaults(run=cmd_models)

    s = sub.add_parser("train", help="start a LoRA training job and follow it")
    s.add_argument("--family", required=True, help="zimage, flux1, qwen_image or sdxl")
    s.add_argument("--base", required=True, help="the base model, as for load")
    s.add_argument("--data", required=True, help="a folder of images (with .txt captions)")
    s.add_argument("--prompt", help="the caption for images without one")
    s.add_argument("--precision", help="base precision: nf4, bf16, int8, fp8, mxfp8, auto")
    s.add_argument("--steps", type=int)
    s.add_argument("--rank", type=int)
    s.add_argument("--resolution", type=int)
    s.add_argument("--learning-rate", type=float)
    s.add_argument("--speed", help="speed mode: off (eager, the default), default (compiled) or max")
    s.add_argument("--gradient-checkpointing", type=int, nargs="?", const=1, metavar="N",
                   help="checkpoint every block, or with N one block call in every N (more memory, fewer recomputed)")
    s.add_argument("--adapter-id")
    s.add_argument("--seed", type=int)
    s.add_argument("--priority", type=int)
    s.add_argument("--device", type=int, help="the broker device to train on (default: any it grants)")
    s.add_argument("--no-follow", action="store_true", help="print the job id and return")
    s.set_defaults(run=cmd_train)

    s = sub.add_parser("watch", help="follow a job to its end (re-attaches after a dropped connection)")
    s.add_argument("job_id")
    s.add_argument("--from-sequence", type=int, default=1)
    s.set_defaults(run=cmd_watch)
    sub.add_parser("jobs", help="the training jobs").set_defaults(run=cmd_jobs)
    s = sub.add_parser("stop", help="stop a job (saving its adapter unless --discard)")
    s.add_argument("job_id")
    s.add_argument("--discard", action="store_true")
    s.set_defaults(run=cmd_stop)
    sub.add_parser("adapters", help="the published adapters").set_defaults(run=cmd_adapters)
    sub.add_parser("status", help="the broker's devices, leases and queue").set_defaults(run=cmd_status)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except ClientError as e:
        err(f"error: {e}")
        return e.exit_code
    except ValueError as e:  # an option word that is not one of the enum's
        err(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
