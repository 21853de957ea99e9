"""Traces are off unless the OpenTelemetry environment asks for an exporter."""
import pytest

from service_kit import tracing

OTEL_VARS = ("OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


@pytest.mark.parametrize("env, on", [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, False),
])
def test_traces_follow_the_otel_environment(monkeypatch, env, on):
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing.configured() is on


def test_without_an_exporter_no_interceptor_is_added(monkeypatch):
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    assert tracing.configure("test") is False
    assert tracing.server_interceptors() == [] and tracing.client_interceptors() == []
