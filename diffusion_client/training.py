"""The training service from Python: start a job, follow it (reconnecting), list, stop, adapters."""
from __future__ import annotations

import time
from typing import Iterator

import grpc

from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from diffusion_client import options as opt
from diffusion_client.errors import ClientError
from diffusion_client.service_client import ServiceClient

ENDED = (pb.TRAINING_JOB_STATE_SUCCEEDED, pb.TRAINING_JOB_STATE_FAILED, pb.TRAINING_JOB_STATE_CANCELLED)
# A watch reconnects on these; anything else (NOT_FOUND, PERMISSION_DENIED, ...) is the caller's to see.
RECONNECT_ON = (grpc.StatusCode.UNAVAILABLE,)


class Training(ServiceClient):
    STUB = training_pb2_grpc.TrainingServiceStub

    def start_request(self, family, base, image_dir: str, instance_prompt: str = "", *, base_precision=None,
                      optimizer=None, speed_mode=None, **fields) -> pb.StartTrainingRequest:
        """A StartTrainingRequest from option words ('zimage', 'nf4', 'adamw_8bit'); other fields pass through."""
        return pb.StartTrainingRequest(
            family=opt.family(family), base=opt.model_source(base),
            dataset=pb.Dataset(image_dir=image_dir, instance_prompt=instance_prompt),
            base_precision=opt.precision(base_precision), speed_mode=opt.speed_mode(speed_mode),
            optimizer=opt.enum_value(pb.Optimizer, "OPTIMIZER", optimizer), **fields)

    def start(self, family, base, image_dir: str, instance_prompt: str = "", **options) -> pb.TrainingJob:
        """Starts a job (it waits for its lease in the service, not here); returns it, PENDING or RUNNING."""
        req = self.start_request(family, base, image_dir, instance_prompt, **options)
        return self._call(self.stub.StartTraining, req).job

    def watch(self, job_id: str, from_sequence: int = 1, *, give_up_after_s: float = 120.0,
              on_reconnect=None) -> Iterator[pb.WatchTrainingResponse]:
        """Every event of the job from `from_sequence` to `finished`. A dropped connection or a restarting service
        is reconnected with backoff, resuming after the last event seen (sequences are stable across restarts),
        so no event is lost or repeated; gives up after `give_up_after_s` without a connection."""
        next_sequence, backoff, lost_at = max(1, from_sequence), 0.25, None
        while True:
            try:
                stream = self.stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id, from_sequence=next_sequence))
                for event in stream:
                    lost_at, backoff = None, 0.25
                    if event.sequence < next_sequence:
                        continue
                    next_sequence = event.sequence + 1
                    yield event
                    if event.WhichOneof("event") == "finished":
                        return
                raise ClientError(grpc.StatusCode.UNAVAILABLE, "the watch ended before the job finished")
            except (grpc.RpcError, ClientError) as e:
                error = e if isinstance(e, ClientError) else ClientError.from_rpc(e)
                if error.code not in RECONNECT_ON:
                    raise error from None
                lost_at = lost_at or time.monotonic()
                if time.monotonic() - lost_at > give_up_after_s:
                    raise error from None
                if on_reconnect is not None:
                    on_reconnect(error, next_sequence)
                time.sleep(backoff)
                backoff = min(backoff * 2, 4.0)

    def job(self, job_id: str) -> pb.TrainingJob:
        return self._call(self.stub.GetTrainingJob, pb.GetTrainingJobRequest(job_id=job_id)).job

    def jobs(self) -> list[pb.TrainingJob]:
        return self._pages(self.stub.ListTrainingJobs, pb.ListTrainingJobsRequest(page_size=100), "jobs")

    def stop(self, job_id: str, *, discard: bool = False) -> pb.TrainingJob:
        mode = pb.STOP_MODE_DISCARD if discard else pb.STOP_MODE_SAVE
        return self._call(self.stub.StopTraining, pb.StopTrainingRequest(job_id=job_id, mode=mode)).job

    def adapters(self, family=None) -> list[pb.Adapter]:
        req = pb.ListAdaptersRequest(family=opt.family(family), page_size=100)
        return self._pages(self.stub.ListAdapters, req, "adapters")

    def delete_adapter(self, adapter_id: str) -> None:
        self._call(self.stub.DeleteAdapter, pb.DeleteAdapterRequest(adapter_id=adapter_id))

    def _pages(self, method, request, field: str) -> list:
        out = []
        while True:
            page = self._call(method, request)
            out.extend(getattr(page, field))
            if not page.next_page_token:
                return out
            request.page_token = page.next_page_token



