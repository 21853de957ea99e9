"""The training gRPC servicer: preflight, then delegate to the job manager; convert back.

The caller (service_kit.auth) owns what it starts: jobs are looked up, listed and acted on through it.
"""
from __future__ import annotations

import asyncio

from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from diffusion_kit.adapter_store import AdapterStore
from diffusion_kit.families import BY_PROTO as FAMILIES_BY_PROTO
from diffusion_kit.families import FAMILIES
from diffusion_kit.path_roots import Roots
from service_kit.auth import current_caller
from service_kit.pagination import page
from training_service import convert
from training_service.info import training_info
from training_service.jobs import JobManager
from training_service.training_plan import resolve


class TrainingServicer(training_pb2_grpc.TrainingServiceServicer):
    def __init__(self, caps, output_root, jobs: JobManager, probe_free_memory=None, model_roots: Roots | None = None,
                 dataset_roots: Roots | None = None):
        self.caps = caps
        self._probe_free = probe_free_memory  # free device bytes now; AUTO and the memory note use it
        self.output_root = output_root
        self.jobs = jobs
        self.adapters = AdapterStore(jobs.adapter_store_root)
        self.model_roots = model_roots or Roots.of([], "--model-root")
        self.dataset_roots = dataset_roots or Roots.of([], "--dataset-root")

    def _caps_now(self):
        return self.caps.with_free(self._probe_free()) if self._probe_free else self.caps

    async def GetTrainingInfo(self, request, context):
        return training_info(self._caps_now(), FAMILIES.values())

    async def StartTraining(self, request, context):
        caller = current_caller()
        req = convert.start_training(request)
        caller.check_priority(req.priority)
        # Off the event loop: decoding every dataset image, or fetching a hub base's index, takes a while,
        # and watchers of other jobs must not wait behind it.
        plan = await asyncio.to_thread(resolve, req, self._caps_now(), self.output_root, self.model_roots,
                                       self.dataset_roots)
        record = await self.jobs.start(plan, caller)
        return pb.StartTrainingResponse(job_id=record.job_id, job=convert.job(record))

    async def WatchTraining(self, request, context):
        async for event in self.jobs.watch(request.job_id, request.from_sequence, current_caller()):
            yield convert.watch_response(request.job_id, event)

    async def StopTraining(self, request, context):
        record = await self.jobs.stop(request.job_id, request.mode == pb.STOP_MODE_DISCARD, current_caller())
        return pb.StopTrainingResponse(job=convert.job(record))

    async def GetTrainingJob(self, request, context):
        return pb.GetTrainingJobResponse(job=convert.job(self.jobs.store.get(request.job_id, current_caller())))

    async def ListTrainingJobs(self, request, context):
        converted: dict[str, pb.TrainingJob] = {}

        def message(record) -> pb.TrainingJob:
            if record.job_id not in converted:
                converted[record.job_id] = convert.job(record)
            return converted[record.job_id]

        records, token = page(self.jobs.store.visible(current_caller()), lambda r: [r.created, r.job_id],
                              request.page_size, request.page_token, descending=True,
                              size_of=lambda r: message(r).ByteSize())
        return pb.ListTrainingJobsResponse(jobs=[message(r) for r in records], next_page_token=token)

    async def DeleteTrainingJob(self, request, context):
        return pb.DeleteTrainingJobResponse(job=convert.job(self.jobs.delete(request.job_id, current_caller())))

    async def ListAdapters(self, request, context):
        wanted = FAMILIES_BY_PROTO.get(request.family) if request.family else None
        adapters = [a for a in await asyncio.to_thread(self.adapters.list)
                    if wanted is None or a.family == wanted.key]
        shown, token = page(adapters, lambda a: [a.adapter_id], request.page_size, request.page_token)
        return pb.ListAdaptersResponse(adapters=[convert.adapter(a) for a in shown], next_page_token=token)

    async def DeleteAdapter(self, request, context):
        return pb.DeleteAdapterResponse(adapter=convert.adapter(self.adapters.delete(request.adapter_id,
                                                                                     current_caller())))
