"""The inference gRPC servicer: delegate to the engine, convert back. No torch here."""
from __future__ import annotations

from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import inference_pb2_grpc
from diffusion_kit.families import FAMILIES
from inference_service import convert
from inference_service.capabilities import family_capabilities
from inference_service.engine import InferenceEngine


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, engine: InferenceEngine):
        self.engine = engine

    async def Load(self, request, context):
        sequence = 0
        async for event in self.engine.load(convert.load_request(request)):
            sequence += 1
            yield convert.load_response(event, sequence)

    async def Generate(self, request, context):
        generation_id = request.generation_id or self.engine.new_generation_id()
        sequence = 0
        async for event in self.engine.generate(convert.generate_request(request), generation_id,
                                                deadline_s=context.time_remaining()):
            sequence += 1
            yield convert.generate_response(event, generation_id, sequence)

    async def CancelGeneration(self, request, context):
        return pb.CancelGenerationResponse(was_running=self.engine.cancel_generation(request.generation_id))

    async def Unload(self, request, context):
        return pb.UnloadResponse(freed_bytes=await self.engine.unload(request.model_id))

    async def GetInferenceStatus(self, request, context):
        s = self.engine.status()
        resp = pb.GetInferenceStatusResponse(queue_depth=s.queue_depth, max_queue_depth=s.max_queue_depth,
                                             lease_id=s.lease_id, running_generation_id=s.running_generation_id)
        if s.model is not None:
            resp.models.append(convert.loaded_model(s.model))
        if s.running_progress is not None:
            resp.running_progress.CopyFrom(convert.step_progress(s.running_progress))
        return resp

    async def GetCapabilities(self, request, context):
        caps = self.engine.caps
        return convert.capabilities(caps, [family_capabilities(caps, f) for f in FAMILIES.values()])

    async def ListModels(self, request, context):
        model = self.engine.status().model
        return pb.ListModelsResponse(models=[convert.loaded_model(model)] if model else [])
