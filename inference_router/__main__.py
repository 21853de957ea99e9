"""python -m inference_router --listen HOST:PORT --worker HOST:PORT [--worker HOST:PORT ...]

One address for several inference workers (each `python -m inference_service` with its own --client-id and
lease): a Generate goes to the least busy worker that has the model, a Load to a worker with no model."""
from __future__ import annotations

import argparse
import asyncio
import logging

from service_kit import structured_log, tracing
from service_kit.metrics import add_metrics_flag, maybe_serve_metrics
from service_kit.security import add_client_flags, add_server_flags, client_security, server_security
from service_kit.server_runtime import announce, parse_listen, serve_until_signalled, stop_signals

log = logging.getLogger("inference_router")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m inference_router",
                                description="Routes InferenceService calls to the workers that have the model.")
    p.add_argument("--listen", required=True, type=parse_listen, help="HOST:PORT to serve on; port 0 picks a free one")
    p.add_argument("--worker", required=True, action="append", type=parse_listen, metavar="HOST:PORT",
                   help="an inference worker (repeatable)")
    p.add_argument("--refresh", type=float, default=2.0, metavar="SECONDS",
                   help="how often each worker is asked what it has loaded (also asked at once on a miss)")
    p.add_argument("--shutdown-grace", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM, how long forwarded calls have to finish")
    p.add_argument("--log-level", default="INFO")
    add_server_flags(p)
    add_metrics_flag(p)
    add_client_flags(p, "worker", "the workers")
    return p


async def _main(args: argparse.Namespace, security, worker_security) -> None:
    stop = stop_signals()  # before the service listens
    from inference_router.server import create_router_server
    from inference_router.workers import WorkerPool

    pool = WorkerPool(args.worker, worker_security, args.refresh)
    running = await create_router_server(args.listen, pool, security)
    log.info("inference router started", extra={"fields": {
        "event": "router.started", "port": running.port, "workers": args.worker}})
    announce("inference_router", args.listen, running.port, maybe_serve_metrics(args))
    await serve_until_signalled(running, args.shutdown_grace, stop)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if len(set(args.worker)) != len(args.worker):
        parser.error("name each --worker once")
    security, worker_security = server_security(args, parser), client_security(args, parser, "worker")
    structured_log.configure(args.log_level)
    tracing.configure("inference_router")
    asyncio.run(_main(args, security, worker_security))


if __name__ == "__main__":
    main()
