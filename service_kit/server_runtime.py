"""The shared server runtime: keepalive, health checking, reflection and graceful shutdown."""
from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import logging
import os
import signal
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable, Mapping

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service_kit import tracing
from service_kit.error_interceptor import ErrorInterceptor
from service_kit.request_limits import Limit, Rules
from service_kit.security import ServerSecurity

log = logging.getLogger(__name__)

# Leases live as long as a stream, so a half-open connection must be noticed in seconds:
# ping every 2 s, give up 2 s after an unanswered ping (a dead peer is seen within ~4 s).
# Recent gRPC cores time out unanswered pings by ping_timeout_ms, not keepalive_timeout_ms:
# without it a frozen (SIGSTOPped) holder kept its lease for a minute.
KEEPALIVE_MS = 2000
# The largest request any method accepts. Every field is bounded by the services' request limits,
# and the largest valid request is far below this (a test computes it); 64 MiB let one caller make
# a server hold and parse tens of megabytes per call.
MAX_REQUEST_BYTES = 4 * 2**20
# The largest response: one image per Generate event, at most 4096x4096 RGB8 (48 MiB) or a PNG about that size.
MAX_RESPONSE_BYTES = 64 * 2**20
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Accept the clients' own 2 s pings instead of answering them with GOAWAY.
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_MS),
    ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
    ("grpc.max_send_message_length", MAX_RESPONSE_BYTES),
)
CLIENT_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_MS),
    ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
    ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
)


# The standard health service's request: each distinct service name costs the server a watcher entry.
HEALTH_RULES = {"grpc.health.v1.HealthCheckRequest": Rules({"service": Limit(max_len=256)})}


@dataclass
class RunningServer:
    """A started server: its bound port, its health servicer and what to run on shutdown."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: tuple[str, ...]
    on_drain: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Drains: NOT_SERVING first, then the services' own drain hooks, then stop with grace."""
        await self.set_serving(False)
        for hook in self.on_drain:
            await hook()
        await self.server.stop(grace_s)


async def create_server(
    listen: str,
    register: Callable[[grpc.aio.Server], Iterable[str]],
    *,
    rules: Mapping[str, Rules] | None = None,
    security: ServerSecurity | None = None,
) -> RunningServer:
    """Builds and starts an aio server on `listen` (port 0 picks one) with health and reflection.

    `register` adds the servicers and returns their full service names; `rules` are the service's
    request limits; `security` its tokens and TLS (none: plaintext, every caller an anonymous admin).
    """
    security = security or ServerSecurity()
    interceptor = ErrorInterceptor({**HEALTH_RULES, **(rules or {})}, security.tokens)
    # The trace span (when traces are on) wraps the edge, so it sees the final status of every call.
    server = grpc.aio.server(interceptors=[*tracing.server_interceptors(), interceptor], options=SERVER_OPTIONS)
    service_names = tuple(register(server))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    credentials = security.credentials()
    port = server.add_secure_port(listen, credentials) if credentials else server.add_insecure_port(listen)
    security.warn_if_open(listen)
    if port == 0:
        raise OSError(f"could not bind {listen}")
    await server.start()
    running = RunningServer(server=server, port=port, health=health_servicer, service_names=service_names)
    await running.set_serving(True)
    return running


def announce(service: str, listen: str, port: int, metrics_port: int | None = None) -> None:
    """Prints the one line a parent process reads to learn the bound port (port 0 picks one)."""
    host = listen.rsplit(":", 1)[0]
    line = {"event": "listening", "service": service, "address": f"{host}:{port}", "port": port}
    if metrics_port is not None:
        line["metrics_port"] = metrics_port
    print(json.dumps(line), flush=True)


# Set by service_kit.service_process to the pid of the process that started this service (a test, the demo, a
# benchmark): the service then stops, draining, when that process dies, however it died.
STOP_WITH_PARENT_ENV = "DIFFUSION_STOP_WITH_PARENT"


def stop_signals() -> asyncio.Event:
    """An event SIGTERM or SIGINT sets. A service calls it first thing, before it listens: a stop that arrives
    once it is ready (its listening line, its SERVING health answer) then drains, instead of the signal's
    default action killing it. Under STOP_WITH_PARENT_ENV the parent's death sends this process SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.environ.pop(STOP_WITH_PARENT_ENV, "")  # popped: the service's own children do not inherit it
    if parent.isdigit() and not stop_with_parent(int(parent)):
        stop.set()  # the parent died before the line above ran
    return stop


def stop_with_parent(parent_pid: int) -> bool:
    """SIGTERM to this process when `parent_pid`, its parent, dies (Linux's PR_SET_PDEATHSIG); False when it has
    died already. Elsewhere there is no such signal and nothing is asked."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return True
    return os.getppid() == parent_pid


async def serve_until_signalled(running: RunningServer, grace_s: float, stop: asyncio.Event) -> None:
    """Runs until `stop` (stop_signals) is set, then drains and stops gracefully."""
    await stop.wait()
    log.info("shutting down", extra={"fields": {"grace_s": grace_s}})
    await running.stop(grace_s)


def parse_listen(value: str) -> str:
    """Validates HOST:PORT for --listen."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"wants HOST:PORT (e.g. 127.0.0.1:50051), got {value!r}")
    return value

