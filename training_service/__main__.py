"""python -m training_service --listen 127.0.0.1:PORT [--broker 127.0.0.1:PORT]"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

from diffusion_kit.compile_cache import configure_compile_cache
from training_service.nf4_weights import BACKENDS as NF4_BACKENDS, DEFAULT_BACKEND as NF4_DEFAULT
from training_service.server import create_training_server
from training_service.trainer_launcher import fork_warm_trainer
from diffusion_kit.path_roots import Roots, default_data_dir, hub_cache_dir
from service_kit import structured_log, tracing
from service_kit.security import add_client_flags, add_server_flags, client_security, server_security
from service_kit.metrics import add_metrics_flag, maybe_serve_metrics
from service_kit.server_runtime import announce, parse_listen, serve_until_signalled, stop_signals

log = logging.getLogger("training_service")


def non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def trace_window(text: str) -> tuple[int, int]:
    from training_service.step_trace import parse_window

    try:
        return parse_window(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m training_service", description="The training service over gRPC.")
    p.add_argument("--listen", required=True, type=parse_listen, help="HOST:PORT to serve on; port 0 picks a free one")
    p.add_argument("--broker", type=parse_listen, help="the GPU broker's HOST:PORT; without it jobs take no lease")
    p.add_argument("--client-id", default="training-0", help="this instance's name at the broker")
    p.add_argument("--output-dir", type=Path, default=default_data_dir() / "training",
                   help="where jobs keep checkpoints and outputs")
    p.add_argument("--adapter-store", type=Path, default=default_data_dir() / "adapters",
                   help="the LoRA adapter store finished jobs publish to (the inference service reads it)")
    p.add_argument("--model-root", type=Path, action="append", metavar="DIR",
                   help="a directory a job's local base may be read from (repeatable). Default: the Hugging Face "
                        "cache and ~/.local/share/diffusion-services/models")
    p.add_argument("--dataset-root", type=Path, action="append", metavar="DIR",
                   help="a directory datasets may be read from (repeatable). Default: "
                        "~/.local/share/diffusion-services/datasets")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend for SPEED_MODE_DEFAULT runs (aot_eager in CPU tests)")
    p.add_argument("--compile-cache-dir", type=Path,
                   default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "diffusion-services" / "inductor",
                   help="persistent compile cache the trainer processes share, so a second run compiles warm")
    p.add_argument("--aot-blocks", action=argparse.BooleanOptionalAction, default=True,
                   help="compiled jobs keep the repeated blocks' training graphs (forward and backward), compiled "
                        "ahead of time, under the compile cache and load them instead of tracing again: only the "
                        "first job of a base and its settings pays the compile (--no-aot-blocks: every job traces "
                        "the blocks with the regular regional compile)")
    p.add_argument("--warm-trainer", action=argparse.BooleanOptionalAction, default=True,
                   help="fork each job's trainer from one process that imported the trainer's libraries once "
                        "(forked at start, it imports them when the first job asks); --no-warm-trainer starts each trainer as a fresh process")
    p.add_argument("--drain-timeout", type=float, default=120.0, metavar="SECONDS",
                   help="on SIGTERM, how long running jobs have to reach a step boundary and checkpoint")
    p.add_argument("--checkpoint-minutes", type=non_negative, default=10.0, metavar="MINUTES",
                   help="every job also checkpoints when this long has passed since its last save, so a crash "
                        "loses at most this much training (0: only what the request's checkpoint_every asks)")
    p.add_argument("--trace-steps", type=trace_window, metavar="FIRST:COUNT",
                   help="run steps FIRST to FIRST+COUNT-1 of every job under torch.profiler and keep the trace and "
                        "its summary in the job folder's trace/ (where a job's step time goes); those steps run "
                        "slower, and the job's record says which they were")
    p.add_argument("--nf4-backend", choices=NF4_BACKENDS, default=NF4_DEFAULT,
                   help="what holds an nf4 job's frozen base weights: bitsandbytes' Linear4bit (its matmul splits "
                        "the compiled block graphs) or torchao's NF4Tensor (the compiler traces its dequantise into "
                        "them); every nf4 job's record says which")
    p.add_argument("--shutdown-grace", type=float, default=5.0, metavar="SECONDS")
    p.add_argument("--log-level", default="INFO")
    add_server_flags(p)
    add_metrics_flag(p)
    add_client_flags(p)
    return p


async def _main(args: argparse.Namespace, security, broker_security, warm_trainer) -> None:
    stop = stop_signals()  # before the service listens
    from diffusion_kit.host_caps import nvml_free_bytes, probe_host, probe_host_in_child

    # On an NVIDIA host the probe runs in a child: this process computes nothing on the device (each job runs in
    # its own process), and a CUDA context here would hold memory no lease covers. Elsewhere there is no context
    # to keep out, and the child would only cost a second start-up.
    probe = probe_host_in_child if nvml_free_bytes(0) is not None else probe_host
    caps = await asyncio.to_thread(probe, optimizers=True)
    broker = None
    if args.broker:
        from gpu_broker.client import BrokerClient

        broker = BrokerClient(args.broker, broker_security)
    probe_free = None
    if caps.device_kind == "cuda":  # AUTO and the memory note read the device as it is at each request (NVML)
        probe_free = nvml_free_bytes(0)
        if probe_free is None:
            log.warning("NVML is not available: AUTO and the memory note use the free memory measured at start",
                        extra={"fields": {"event": "training.no_nvml"}})
    running = await create_training_server(args.listen, caps, args.output_dir, args.adapter_store, broker,
                                           args.client_id, args.compile_backend, args.drain_timeout,
                                           args.checkpoint_minutes, probe_free,
                                           Roots.of(args.model_root or [hub_cache_dir(), default_data_dir() / "models"],
                                                    "--model-root"),
                                           Roots.of(args.dataset_root or [default_data_dir() / "datasets"],
                                                    "--dataset-root"), security, warm_trainer,
                                           args.compile_cache_dir / "aot-blocks" if args.aot_blocks else None,
                                           args.trace_steps, nf4_backend=args.nf4_backend)
    log.info("training service started", extra={"fields": {"event": "training.started", "port": running.port,
                                                          "broker": args.broker}})
    announce("training_service", args.listen, running.port, maybe_serve_metrics(args))
    await serve_until_signalled(running, args.shutdown_grace, stop)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    security, broker_security = server_security(args, parser), client_security(args, parser)
    configure_compile_cache(args.compile_cache_dir)  # inherited by every trainer child
    # Before anything starts a thread (tracing's exporter, the server): see fork_warm_trainer.
    warm_trainer = fork_warm_trainer() if args.warm_trainer else None
    structured_log.configure(args.log_level)
    tracing.configure("training_service")
    asyncio.run(_main(args, security, broker_security, warm_trainer))


if __name__ == "__main__":
    main()
