"""Builds the inference server. Until the engine lands every RPC answers UNIMPLEMENTED (the generated base servicer)."""
from __future__ import annotations

from diffusion.v1 import inference_pb2, inference_pb2_grpc
from service_kit.server_runtime import RunningServer, create_server

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name


async def create_inference_server(listen: str) -> RunningServer:
    def register(server):
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(inference_pb2_grpc.InferenceServiceServicer(), server)
        return [SERVICE_NAME]

    return await create_server(listen, register)
