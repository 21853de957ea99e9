"""Prometheus metrics: the calls every service answers, and the scrape endpoint (`--metrics-listen`).

Each service adds its own figures (queue depth, phase latencies, leases, steps) next to its engine; this
module holds what they share. Names follow Prometheus conventions: `_total` counters, `_seconds` and
`_bytes` units, labels with bounded values only (method, code, device, holder, model, phase).
"""
from __future__ import annotations

import time

from prometheus_client import REGISTRY, Counter, Histogram, start_http_server

# Up to a FLUX generation or a full-size load; streams count to their last message.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

RPC_CALLS = Counter("diffusion_rpc_calls_total", "Calls answered, by method and final status code",
                    ["service", "method", "code"])
RPC_SECONDS = Histogram("diffusion_rpc_duration_seconds", "Time from a call's arrival to its answer (a stream: its end)",
                        ["service", "method"], buckets=LATENCY_BUCKETS)


def split_method(full: str) -> tuple[str, str]:
    """'/diffusion.v1.InferenceService/Generate' -> ('diffusion.v1.InferenceService', 'Generate')."""
    service, _, method = full.lstrip("/").rpartition("/")
    return service, method


def observe_call(full_method: str, code: str, started: float) -> None:
    service, method = split_method(full_method)
    RPC_CALLS.labels(service, method, code).inc()
    RPC_SECONDS.labels(service, method).observe(time.monotonic() - started)


def add_metrics_flag(parser) -> None:
    parser.add_argument("--metrics-listen", metavar="HOST:PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks one, announced as "
                             "metrics_port on the listening line); off unless given")


def maybe_serve_metrics(args) -> int | None:
    return serve_metrics(args.metrics_listen) if getattr(args, "metrics_listen", None) else None


def serve_metrics(listen: str) -> int:
    """Serves /metrics over HTTP on HOST:PORT (port 0 picks one); returns the bound port."""
    host, port = listen.rsplit(":", 1)
    server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=REGISTRY)
    return server.server_port
