"""Builds the inference server over an engine."""
from __future__ import annotations

from dataclasses import dataclass

from grpc_health.v1 import health_pb2

from diffusion.v1 import inference_pb2, inference_pb2_grpc
from inference_service.engine import InferenceEngine
from inference_service.request_rules import RULES
from inference_service.servicer import InferenceServicer
from service_kit.security import ServerSecurity
from service_kit.server_runtime import RunningServer, create_server

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name


def model_health_name(model_id: str) -> str:
    """The health service name that is SERVING while `model_id` is loaded: a readiness probe per model."""
    return f"{SERVICE_NAME}/{model_id}"


@dataclass
class InferenceServer:
    running: RunningServer
    engine: InferenceEngine


async def create_inference_server(listen: str, engine: InferenceEngine, security: ServerSecurity | None = None,
                                  drain_grace_s: float = 5.0) -> InferenceServer:
    """`drain_grace_s`: on SIGTERM, how long running and queued generations have to finish."""
    def register(server):
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(InferenceServicer(engine), server)
        return [SERVICE_NAME]

    running = await create_server(listen, register, rules=RULES, security=security)

    async def model_health(model_id: str, ready: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        await running.health.set(model_health_name(model_id), status)

    engine.on_model_change = model_health
    engine.start()
    running.on_drain.append(lambda: engine.drain(drain_grace_s))
    return InferenceServer(running, engine)
