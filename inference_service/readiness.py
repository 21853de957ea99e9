"""Readiness per model: the gRPC health service name that is SERVING only while a model is loaded, so a
Kubernetes gRPC readiness probe (or a load balancer) can send a model's traffic only where it is. The
inference service sets it for its one model; the router for every model some worker has."""
from __future__ import annotations

from grpc_health.v1 import health_pb2

from diffusion.v1 import inference_pb2

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name


def model_health_name(model_id: str) -> str:
    """The health service name that is SERVING while `model_id` is loaded: a readiness probe per model."""
    return f"{SERVICE_NAME}/{model_id}"


async def set_model_ready(health, model_id: str, ready: bool) -> None:
    """`health`: the server's grpc_health aio HealthServicer."""
    status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
    await health.set(model_health_name(model_id), status)
