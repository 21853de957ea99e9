"""OpenTelemetry traces across the services: off unless an exporter is configured.

Configured with OpenTelemetry's own environment variables, as every OTel SDK is:
- `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`): export OTLP over gRPC there
  (`OTEL_EXPORTER_OTLP_INSECURE=true` for a plaintext collector);
- `OTEL_TRACES_EXPORTER=console`: print spans to stderr, beside the logs, instead;
  `none` (or `OTEL_SDK_DISABLED=true`): off;
- `OTEL_SERVICE_NAME` names the service (default: the module, e.g. inference_service); batching follows
  `OTEL_BSP_*`.
When on, every server gets OpenTelemetry's gRPC server interceptor and every channel our code opens its
client interceptors, so the trace context travels in `traceparent` metadata: one trace per Load, Generate or
StartTraining, with the broker calls it makes (and, through the router, the worker's spans) inside it.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys

log = logging.getLogger(__name__)

_provider = None


def configured() -> bool:
    """Whether the environment asks for traces."""
    env = os.environ.get
    if env("OTEL_SDK_DISABLED", "").lower() == "true" or env("OTEL_TRACES_EXPORTER", "").lower() == "none":
        return False
    return bool(env("OTEL_TRACES_EXPORTER") or env("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(service_name: str) -> bool:
    """Sets up the tracer provider and exporter once per process; returns whether traces are on."""
    global _provider
    if _provider is not None or not configured():
        return _provider is not None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower()
    if exporter_name == "console":
        exporter = ConsoleSpanExporter(out=sys.stderr)  # stdout carries the listening line a parent reads
    elif exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        raise SystemExit(f"OTEL_TRACES_EXPORTER={exporter_name!r}: this service exports otlp, console or none")
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    _provider = TracerProvider(resource=resource)
    _provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(_provider)
    atexit.register(_provider.shutdown)  # the last spans are exported when the service stops
    log.info("traces on", extra={"fields": {"event": "tracing.on", "exporter": exporter_name}})
    return True


def server_interceptors() -> list:
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor(tracer_provider=_provider)]


def client_interceptors() -> list:
    """For an aio channel; empty when traces are off."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_client_interceptors

    return list(aio_client_interceptors(tracer_provider=_provider))
