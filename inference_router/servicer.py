"""The router's InferenceService: the same API as one worker, each call forwarded to the worker that should
answer it (inference_router.worker_choice). A worker's answer, error details included, reaches the caller
unchanged; the caller's token goes with the call, so a worker sees the same identity the router checked.
The initial metadata of Load and Generate names the worker (`diffusion-worker`)."""
from __future__ import annotations

import asyncio

import grpc

from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import inference_pb2_grpc
from inference_router import metrics
from diffusion_client.errors import ClientError
from inference_router.worker_choice import Refusal, WorkerView, for_generate, for_load
from inference_router.workers import Worker, WorkerPool
from service_kit.errors import FailedPrecondition, NotFound, Relayed, Unavailable, clip

WORKER_HEADER = "diffusion-worker"
FORWARDED_HEADERS = ("authorization",)


def _refuse(refusal: Refusal, model_id: str):
    if refusal.reason == "WORKER_UNAVAILABLE":
        return Unavailable(refusal.message, reason=refusal.reason, metadata={"model_id": model_id})
    return FailedPrecondition(refusal.message, reason=refusal.reason, metadata={"model_id": model_id})


class RouterServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(self, pool: WorkerPool):
        self.pool = pool
        self._generations: dict[str, Worker] = {}  # live generation id -> the worker running it

    @staticmethod
    def _call_options(context) -> dict:
        metadata = tuple((k, v) for k, v in context.invocation_metadata() or () if k in FORWARDED_HEADERS)
        return {"metadata": metadata, "timeout": context.time_remaining()}

    async def _unary(self, worker: Worker, method: str, request, context):
        metrics.routed(worker.address, method)
        try:
            with self.pool.in_flight(worker):
                return await getattr(worker.stub, method)(request, **self._call_options(context))
        except grpc.aio.AioRpcError as e:
            if e.code() is grpc.StatusCode.UNAVAILABLE:
                self.pool.set_reachable(worker, False)
            raise Relayed(e) from None

    def _take(self, choice: WorkerView | Refusal, model_id: str, method: str) -> Worker:
        """The chosen worker, counted as picked; a refusal raised as the caller's error."""
        if isinstance(choice, Refusal):
            raise _refuse(choice, model_id)
        worker = self.pool.by_address(choice.address)
        self.pool.picked(worker)
        metrics.routed(worker.address, method)
        return worker

    async def Generate(self, request, context):
        tried: set[str] = set()
        while True:
            choice = for_generate(self.pool.views(), request.model_id, frozenset(tried))
            if isinstance(choice, Refusal) and choice.reason == "MODEL_NOT_LOADED" and not tried:
                await self.pool.refresh()  # a Load straight to a worker, or a keep-alive unload, since the last poll
                choice = for_generate(self.pool.views(), request.model_id)
            worker = self._take(choice, request.model_id, "Generate")
            call = worker.stub.Generate(request, **self._call_options(context))
            answered, generation_id = False, ""
            try:
                with self.pool.in_flight(worker):
                    async for event in call:
                        if not answered:
                            answered, generation_id = True, event.generation_id
                            self._generations[generation_id] = worker
                            await context.send_initial_metadata(((WORKER_HEADER, worker.address),))
                        yield event
                return
            except grpc.aio.AioRpcError as e:
                if answered or not self._worth_another_worker(e, worker):
                    raise Relayed(e) from None
                tried.add(worker.address)  # nothing was sent yet: the next worker with the model takes it
            finally:
                call.cancel()  # the caller went away: so does the worker's generation
                self._generations.pop(generation_id, None)

    def _worth_another_worker(self, error: grpc.aio.AioRpcError, worker: Worker) -> bool:
        """Before any answer: the worker is gone or stopping, its queue is full, or it no longer has the model
        (keep-alive unloaded it). Another worker with the model may take the call."""
        reason = ClientError.from_rpc(error).reason
        if reason in ("MODEL_NOT_LOADED", "MODEL_UNLOADED", "MODEL_UNLOADED_IDLE"):
            self.pool.forget_models(worker)
            return True
        if error.code() is grpc.StatusCode.UNAVAILABLE:
            self.pool.set_reachable(worker, False)
            return True
        return reason == "QUEUE_FULL"

    async def Load(self, request, context):
        await self.pool.refresh()  # loads are rare and slow: decide on what each worker has now, not at the last poll
        worker = self._take(for_load(self.pool.views(), request.model_id), request.model_id, "Load")
        call = worker.stub.Load(request, **self._call_options(context))
        answered = False
        try:
            with self.pool.in_flight(worker, loading=request.model_id):
                async for event in call:
                    if not answered:
                        answered = True
                        await context.send_initial_metadata(((WORKER_HEADER, worker.address),))
                    yield event
        except grpc.aio.AioRpcError as e:
            if e.code() is grpc.StatusCode.UNAVAILABLE and not answered:
                self.pool.set_reachable(worker, False)
            raise Relayed(e) from None
        finally:
            call.cancel()
            await self.pool.refresh(only=worker)

    async def CancelGeneration(self, request, context):
        worker = self._generations.get(request.generation_id)
        if worker is None:
            raise NotFound(f"no queued or running generation {clip(request.generation_id)}",
                           reason="GENERATION_NOT_FOUND")
        return await self._unary(worker, "CancelGeneration", request, context)

    async def Unload(self, request, context):
        holders = [w for w in self.pool.workers if request.model_id in w.view.models]
        if not holders:
            await self.pool.refresh()
            holders = [w for w in self.pool.workers if request.model_id in w.view.models]
        if not holders:
            raise NotFound(f"model {clip(request.model_id)} is not loaded on any worker", reason="MODEL_NOT_LOADED")
        freed = 0
        try:
            for worker in holders:  # a model served by several workers is unloaded from each
                freed += (await self._unary(worker, "Unload", request, context)).freed_bytes
        finally:
            await asyncio.gather(*(self.pool.refresh(only=w) for w in holders))
        return pb.UnloadResponse(freed_bytes=freed)

    async def _each_reachable(self, method: str, request, context) -> list:
        workers = [w for w in self.pool.workers if w.view.reachable]
        if not workers:
            raise Unavailable("no inference worker is answering; retry", reason="WORKER_UNAVAILABLE")
        return await asyncio.gather(*(self._unary(w, method, request, context) for w in workers))

    async def GetInferenceStatus(self, request, context):
        """Every worker's models; queue depths added up; the running generation and lease of the first worker
        that has one."""
        merged = pb.GetInferenceStatusResponse()
        for answer in await self._each_reachable("GetInferenceStatus", request, context):
            merged.models.extend(answer.models)
            merged.queue_depth += answer.queue_depth
            merged.max_queue_depth += answer.max_queue_depth
            if answer.running_generation_id and not merged.running_generation_id:
                merged.running_generation_id = answer.running_generation_id
                merged.running_progress.CopyFrom(answer.running_progress)
            merged.lease_id = merged.lease_id or answer.lease_id
        return merged

    async def GetCapabilities(self, request, context):
        """The first answering worker's: the workers of one router run on one kind of host."""
        workers = [w for w in self.pool.workers if w.view.reachable]
        if not workers:
            raise Unavailable("no inference worker is answering; retry", reason="WORKER_UNAVAILABLE")
        return await self._unary(workers[0], "GetCapabilities", request, context)

    async def ListModels(self, request, context):
        merged = pb.ListModelsResponse()
        for answer in await self._each_reachable("ListModels", request, context):
            merged.models.extend(answer.models)
        return merged

