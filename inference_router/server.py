"""Builds the router's server: the InferenceService API over a worker pool, with per-model readiness."""
from __future__ import annotations

from diffusion.v1 import inference_pb2_grpc
from inference_router.servicer import RouterServicer
from inference_router.workers import WorkerPool
from inference_service.readiness import SERVICE_NAME, set_model_ready
from inference_service.request_rules import RULES
from service_kit.security import ServerSecurity
from service_kit.server_runtime import RunningServer, create_server


async def create_router_server(listen: str, pool: WorkerPool, security: ServerSecurity | None = None) -> RunningServer:
    """The caller-facing edge (tokens, TLS, request limits) is the inference service's own, so a request the
    workers would refuse as malformed is refused here before it is forwarded."""
    def register(server):
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(RouterServicer(pool), server)
        return [SERVICE_NAME]

    running = await create_server(listen, register, rules=RULES, security=security)
    ready: set[str] = set()

    async def models_changed(loaded: set[str]) -> None:
        for model_id in loaded - ready:
            await set_model_ready(running.health, model_id, True)
        for model_id in ready - loaded:
            await set_model_ready(running.health, model_id, False)
        ready.clear()
        ready.update(loaded)

    pool.on_models_changed = models_changed
    await pool.start()
    running.on_drain.append(pool.close)
    return running
