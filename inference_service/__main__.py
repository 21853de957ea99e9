"""python -m inference_service --listen 127.0.0.1:PORT [--broker 127.0.0.1:PORT]"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path

from diffusion_kit.compile_cache import configure_compile_cache
from diffusion_kit.path_roots import Roots, default_data_dir, hub_cache_dir
from service_kit import structured_log, tracing
from service_kit.heap_freeze import freeze_imported
from service_kit.security import add_client_flags, add_server_flags, client_security, server_security
from service_kit.metrics import add_metrics_flag, maybe_serve_metrics
from service_kit.server_runtime import announce, parse_listen, serve_until_signalled, stop_signals

log = logging.getLogger("inference_service")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m inference_service", description="Diffusion inference over gRPC.")
    p.add_argument("--listen", required=True, type=parse_listen, help="HOST:PORT to serve on; port 0 picks a free one")
    p.add_argument("--broker", type=parse_listen, help="the GPU broker's HOST:PORT; without it no lease is taken")
    p.add_argument("--client-id", default="inference-0", help="this instance's name at the broker")
    p.add_argument("--max-queue-depth", type=int, default=8, help="generations that may wait; more get RESOURCE_EXHAUSTED")
    p.add_argument("--reload-after-preempt", action="store_true",
                   help="a Generate for a model the broker preempted re-acquires and reloads it instead of UNAVAILABLE")
    p.add_argument("--keep-alive", type=float, default=-1.0, metavar="SECONDS",
                   help="how long a model stays loaded with no generation when its Load does not say (negative: "
                        "forever; 0: unload after each generation); an idle unload releases the GPU lease")
    p.add_argument("--busy-linger", type=float, default=0.5, metavar="SECONDS",
                   help="with a broker: how long after the last generation the model's lease stays marked busy, so "
                        "training sharing the GPU resumes only when no request followed (it yields while marked)")
    p.add_argument("--prompt-cache-mib", type=int, default=1024, metavar="MIB",
                   help="host memory for the text encoders' results of recent prompts, reused when a prompt repeats "
                        "with the same settings (the same embeddings); 0: encode every time")
    p.add_argument("--reload-on-demand", action="store_true",
                   help="a Generate for a model that keep-alive unloaded loads it again instead of FAILED_PRECONDITION")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend (tests use aot_eager)")
    p.add_argument("--compile-cache-dir", type=Path,
                   default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "diffusion-services" / "inductor",
                   help="persistent compile cache, so a restart does not pay the full compile again")
    p.add_argument("--aot-blocks", action=argparse.BooleanOptionalAction, default=True,
                   help="compiled loads keep the repeated blocks' graphs (and Z-Image's and FLUX.1's VAE decoder's), "
                        "compiled ahead of time, under the compile cache and load them instead of tracing again: "
                        "only the first process pays the compile (--no-aot-blocks: every process compiles, and "
                        "speed mode DEFAULT leaves the decoder eager)")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="a compiled, resident denoiser replays each call shape's kernels as one CUDA graph from its "
                        "second call on (--no-cuda-graphs: every call launches its kernels)")
    p.add_argument("--quant-min-features", type=int, default=1024,
                   help="quantise only linear layers with at least this many input and output features")
    p.add_argument("--adapter-store", type=Path, default=default_data_dir() / "adapters",
                   help="the LoRA adapter store the training service publishes to")
    p.add_argument("--model-root", type=Path, action="append", metavar="DIR",
                   help="a directory Load may read local models from (repeatable); a path outside every root is "
                        "refused. Default: the Hugging Face cache and ~/.local/share/diffusion-services/models")
    p.add_argument("--lora-max-rank", type=int, default=64,
                   help="the highest adapter rank a compiled model can hotswap without recompiling")
    p.add_argument("--warmup-resolution", type=int, default=1024, help="resolution of the compile warm-up call (cut to what the model's lease covers)")
    p.add_argument("--shutdown-grace", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM, how long running and queued generations have to finish (new ones answer "
                        "UNAVAILABLE meanwhile)")
    p.add_argument("--log-level", default="INFO")
    add_server_flags(p)
    add_metrics_flag(p)
    add_client_flags(p)
    return p


async def _main(args: argparse.Namespace, security, broker_security) -> None:
    stop = stop_signals()  # before the service listens
    from diffusion_kit.adapter_store import AdapterStore
    from diffusion_kit.host_caps import probe_host
    from inference_service.engine import InferenceEngine
    from inference_service.load_plan import EngineSettings
    from inference_service.server import create_inference_server

    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()  # the service streams progress; bars would only fill the log
    transformers.utils.logging.disable_progress_bar()
    caps = await asyncio.to_thread(probe_host)
    broker = None
    if args.broker:
        from gpu_broker.client import BrokerClient

        broker = BrokerClient(args.broker, broker_security)
    probe_free = None
    if caps.device_kind == "cuda":
        import torch

        probe_free = lambda index: torch.cuda.mem_get_info(index)[0]  # noqa: E731
    engine = InferenceEngine(caps, EngineSettings(args.quant_min_features, args.compile_backend, args.warmup_resolution,
                                                   args.lora_max_rank, args.keep_alive, args.busy_linger,
                                                   args.prompt_cache_mib * 2**20,
                                                   str(args.compile_cache_dir / "aot-blocks") if args.aot_blocks else "",
                                                   args.cuda_graphs),
                             broker=broker, client_id=args.client_id, max_queue_depth=args.max_queue_depth,
                             reload_after_preempt=args.reload_after_preempt, probe_free_memory=probe_free,
                             reload_on_demand=args.reload_on_demand,
                             adapter_store=AdapterStore(args.adapter_store),
                             model_roots=Roots.of(args.model_root or [hub_cache_dir(), default_data_dir() / "models"],
                                                  "--model-root"))
    # Imports done, no model loaded: frozen, they are not walked by the collection an unload runs, nor by
    # Python's own full collections, each of which held the interpreter lock for as long (0.4 s on a CPU) while
    # other models generated.
    freeze_imported()
    server = await create_inference_server(args.listen, engine, security, args.shutdown_grace)
    log.info("inference service started", extra={"fields": {
        "event": "inference.started", "port": server.running.port, "broker": args.broker,
        "device": caps.device_name, "device_kind": caps.device_kind, "quant_schemes": sorted(caps.quant_schemes)}})
    announce("inference_service", args.listen, server.running.port, maybe_serve_metrics(args))
    try:
        await serve_until_signalled(server.running, args.shutdown_grace, stop)
    finally:
        if broker is not None:
            await broker.close()


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    security, broker_security = server_security(args, parser), client_security(args, parser)
    structured_log.configure(args.log_level)
    tracing.configure("inference_service")
    configure_compile_cache(args.compile_cache_dir)
    asyncio.run(_main(args, security, broker_security))


if __name__ == "__main__":
    main()
