"""A stand-in OpenTelemetry collector for tests: an OTLP/gRPC TraceService on loopback that keeps every span."""
from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int  # opentelemetry.proto.trace.v1.Span.SpanKind: 2 server, 3 client


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Export(self, request, context):
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope in resource_spans.scope_spans:
                    for s in scope.spans:
                        self.spans.append(Span(service, s.name, s.trace_id.hex(), s.span_id.hex(),
                                               s.parent_span_id.hex(), s.kind))
        return trace_service_pb2.ExportTraceServiceResponse()

    def env(self) -> dict[str, str]:
        """What a service needs to export here, promptly."""
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.port}", "OTEL_EXPORTER_OTLP_INSECURE": "true",
                "OTEL_BSP_SCHEDULE_DELAY": "100"}

    def wait_for(self, predicate, timeout: float = 30.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.2)
        raise AssertionError(f"the spans never showed it: {sorted({(s.service, s.name) for s in self.spans})}")

    def stop(self):
        self.server.stop(0)
