"""The router's view of its inference workers: a channel each, the models each has, the calls in flight.

What each worker has is read with ListModels: every `refresh_s` in the background, at once when a call
names a model no worker is known to have, and after every Load the router forwards. A worker that does
not answer is marked unreachable (its last known models kept, so their callers are told to retry) until
it answers again.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

import grpc

from diffusion.v1 import inference_pb2, inference_pb2_grpc
from inference_router import metrics
from inference_router.worker_choice import WorkerView
from service_kit.security import ClientSecurity, open_channel

log = logging.getLogger("inference_router.workers")

POLL_TIMEOUT_S = 2.0


@dataclass
class Worker:
    address: str
    channel: grpc.aio.Channel
    stub: inference_pb2_grpc.InferenceServiceStub
    view: WorkerView
    live_generations: set[str] = field(default_factory=set)


class WorkerPool:
    def __init__(self, addresses: list[str], security: ClientSecurity, refresh_s: float = 2.0):
        # Forwarded calls carry their caller's own token; the router's token (if any) is only for its polling.
        channel_security = replace(security, token=None)
        self._own_metadata = security.metadata()
        self.refresh_s = refresh_s
        self.workers: list[Worker] = []
        for address in addresses:
            channel = open_channel(address, channel_security)
            self.workers.append(Worker(address, channel, inference_pb2_grpc.InferenceServiceStub(channel),
                                       WorkerView(address, reachable=False)))
        self._picks = itertools.count(1)
        self._task: asyncio.Task | None = None
        self.on_models_changed: Callable[[set[str]], Awaitable[None]] | None = None
        self._published: set[str] = set()

    def views(self) -> list[WorkerView]:
        return [w.view for w in self.workers]

    def by_address(self, address: str) -> Worker:
        return next(w for w in self.workers if w.address == address)

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for w in self.workers:
            await w.channel.close()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - the poller must outlive any one bad answer
                log.exception("refreshing the workers failed")

    async def refresh(self, only: Worker | None = None) -> None:
        """Asks each worker (or just `only`) what it has loaded."""
        targets = [only] if only is not None else self.workers
        await asyncio.gather(*(self._refresh_one(w) for w in targets))
        loaded = {m for w in self.workers if w.view.reachable for m in w.view.models}
        if loaded != self._published and self.on_models_changed is not None:
            self._published = loaded
            await self.on_models_changed(loaded)

    async def _refresh_one(self, worker: Worker) -> None:
        try:
            answer = await worker.stub.ListModels(inference_pb2.ListModelsRequest(), metadata=self._own_metadata,
                                                  timeout=POLL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            if worker.view.reachable:
                log.warning("worker stopped answering", extra={"fields": {
                    "event": "router.worker_unreachable", "worker": worker.address, "code": e.code().name}})
            self.set_reachable(worker, False)
            return
        if not worker.view.reachable:
            log.info("worker answering", extra={"fields": {"event": "router.worker_reachable",
                                                           "worker": worker.address}})
        worker.view = replace(worker.view, models=frozenset(m.model_id for m in answer.models), reachable=True)
        metrics.set_worker(worker.address, worker.view)

    def set_reachable(self, worker: Worker, reachable: bool) -> None:
        worker.view = replace(worker.view, reachable=reachable)
        metrics.set_worker(worker.address, worker.view)

    def forget_models(self, worker: Worker) -> None:
        """The worker said it no longer has its model: route nothing there for it until a poll says otherwise."""
        worker.view = replace(worker.view, models=frozenset())
        metrics.set_worker(worker.address, worker.view)

    def picked(self, worker: Worker) -> None:
        worker.view = replace(worker.view, last_picked=next(self._picks))

    @contextlib.contextmanager
    def in_flight(self, worker: Worker, loading: str = ""):
        """Counts a forwarded call against `worker` while it runs (and, for a Load, what it is loading)."""
        worker.view = replace(worker.view, in_flight=worker.view.in_flight + 1,
                              loading=loading or worker.view.loading)
        metrics.set_worker(worker.address, worker.view)
        try:
            yield
        finally:
            worker.view = replace(worker.view, in_flight=worker.view.in_flight - 1,
                                  loading="" if loading else worker.view.loading)
            metrics.set_worker(worker.address, worker.view)
