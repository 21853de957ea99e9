"""Builds the inference server over an engine."""
from __future__ import annotations

from dataclasses import dataclass

from diffusion.v1 import inference_pb2_grpc
from inference_service.engine import InferenceEngine
from inference_service.readiness import SERVICE_NAME, set_model_ready
from inference_service.request_rules import RULES
from inference_service.servicer import InferenceServicer
from service_kit.security import ServerSecurity
from service_kit.server_runtime import RunningServer, create_server


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
        await set_model_ready(running.health, model_id, ready)

    engine.on_model_change = model_health
    engine.start()
    running.on_drain.append(lambda: engine.drain(drain_grace_s))
    return InferenceServer(running, engine)
