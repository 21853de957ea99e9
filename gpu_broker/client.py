"""The broker client the services use: `async with broker.lease(...) as lease:`.

It waits for the grant (retrying while the broker is unreachable), runs the holder's
preempt, abort and yield callbacks, releases on preempt and on exit, and re-acquires the
same budget when the broker restarts under a held lease (saying again that it is busy, if it was).
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, replace
from typing import Awaitable, Callable

import grpc
from google.protobuf import duration_pb2

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from service_kit.security import INSECURE, ClientSecurity, open_channel

log = logging.getLogger(__name__)

PreemptCallback = Callable[[broker_pb2.PreemptRequested], Awaitable[None]]
AbortCallback = Callable[[broker_pb2.AbortRequested], Awaitable[None]]
LostCallback = Callable[[grpc.RpcError], Awaitable[None]]
# A batch lease: True with the YieldRequested event (pause between steps), False with YieldWithdrawn (resume).
YieldCallback = Callable[[bool, "broker_pb2.YieldRequested | broker_pb2.YieldWithdrawn"], Awaitable[None]]
SET_BUSY_TIMEOUT_S = 2.0


class LeaseError(Exception):
    """Acquire failed; `code` and `details` are the broker's status."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@dataclass
class LeaseRequest:
    client_id: str
    purpose: str = ""
    priority: int = 0
    memory_bytes: int = 0
    device_index: int | None = None
    fail_fast: bool = False
    release_grace_s: float | None = None
    reclaim_lease_id: str = ""  # set by the library when it re-acquires after losing the broker
    batch: bool = False  # throughput work (training): yields compute to busy interactive holders on its device

    def to_proto(self) -> broker_pb2.AcquireRequest:
        req = broker_pb2.AcquireRequest(
            holder=broker_pb2.Holder(client_id=self.client_id, purpose=self.purpose, priority=self.priority,
                                     pid=os.getpid()),
            memory_bytes=self.memory_bytes,
            wait_policy=broker_pb2.WAIT_POLICY_FAIL_FAST if self.fail_fast else broker_pb2.WAIT_POLICY_QUEUE,
            reclaim_lease_id=self.reclaim_lease_id,
            compute_class=broker_pb2.COMPUTE_CLASS_BATCH if self.batch else broker_pb2.COMPUTE_CLASS_INTERACTIVE,
        )
        if self.device_index is not None:
            req.device_index = self.device_index
        if self.release_grace_s is not None:
            grace = duration_pb2.Duration()
            grace.FromNanoseconds(int(self.release_grace_s * 1e9))
            req.release_grace.CopyFrom(grace)
        return req


class HeldLease:
    """A granted lease. `valid` is cleared while the broker is unreachable and set again once re-granted."""

    def __init__(self, client: "BrokerClient", request: LeaseRequest, *, on_preempt: PreemptCallback | None,
                 on_abort: AbortCallback | None, on_lost: LostCallback | None, reconnect: bool,
                 on_queued: Callable[[broker_pb2.LeaseQueued], None] | None = None,
                 on_yield: YieldCallback | None = None):
        self._client = client
        self.request = request
        self._on_preempt = on_preempt
        self._on_abort = on_abort
        self._on_lost = on_lost
        self._on_queued = on_queued
        self._on_yield = on_yield
        self._busy = False  # what this holder last said with set_busy, said again after a re-claim
        self.yielding = asyncio.Event()  # a batch lease: set while asked to yield
        self._reconnect = reconnect
        self.lease: broker_pb2.Lease | None = None
        self.request_id = ""
        self.preempt_requested = asyncio.Event()
        self.abort_requested = asyncio.Event()
        self.released = asyncio.Event()
        self.valid = asyncio.Event()
        self.events: list[broker_pb2.AcquireResponse] = []
        self._call = None
        self._reader: asyncio.Task | None = None
        self._released_by_us = False
        self._release_task: asyncio.Future | None = None

    @property
    def lease_id(self) -> str:
        return self.lease.lease_id if self.lease else ""

    @property
    def device_index(self) -> int:
        return self.lease.device_index if self.lease else -1

    async def _open(self, connect_timeout_s: float | None) -> None:
        """Opens the Acquire stream and returns once granted. Retries while the broker is unavailable."""
        loop = asyncio.get_running_loop()
        give_up = None if connect_timeout_s is None else loop.time() + connect_timeout_s
        backoff = 0.05
        while True:
            self._call = self._client.stub.Acquire(self.request.to_proto(), wait_for_ready=True)
            try:
                async for event in self._call:
                    self.events.append(event)
                    self.request_id = event.request_id
                    kind = event.WhichOneof("event")
                    if kind == "queued" and self._on_queued:
                        self._on_queued(event.queued)
                    if kind == "granted":
                        self.lease = event.granted
                        self.valid.set()
                        self._reader = asyncio.get_running_loop().create_task(self._follow())
                        if self._busy:  # a re-claimed lease: the restarted broker did not keep it
                            try:
                                await self._say_busy(True)
                            except grpc.aio.AioRpcError as e:  # the lease holds; the next set_busy says it again
                                log.warning("busy not said again after re-claim",
                                            extra={"fields": {"lease_id": self.lease_id, "code": e.code().name}})
                        return
                raise LeaseError(grpc.StatusCode.UNKNOWN, "Acquire stream ended before a grant")
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or (give_up is not None and loop.time() >= give_up):
                    raise LeaseError(e.code(), e.details() or "") from e
                log.info("broker unavailable; retrying acquire", extra={"fields": {"details": e.details()}})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    async def _follow(self) -> None:
        """Reads the held lease's stream: preempt, withdraw, abort, release, or loss."""
        try:
            async for event in self._call:
                self.events.append(event)
                kind = event.WhichOneof("event")
                if kind == "preempt_requested":
                    self.preempt_requested.set()
                    if self._on_preempt:
                        await self._on_preempt(event.preempt_requested)
                        await self.release()
                        return
                if kind == "preempt_withdrawn":
                    self.preempt_requested.clear()
                elif kind in ("yield_requested", "yield_withdrawn"):
                    yielding = kind == "yield_requested"
                    (self.yielding.set if yielding else self.yielding.clear)()
                    if self._on_yield:
                        await self._on_yield(yielding, getattr(event, kind))
                elif kind == "abort_requested":
                    self.abort_requested.set()
                    if self._on_abort:
                        await self._on_abort(event.abort_requested)
                elif kind == "released":
                    self.released.set()
                    self.valid.clear()
                    return
        except grpc.aio.AioRpcError as e:
            if self._released_by_us or e.code() == grpc.StatusCode.CANCELLED:
                return
            self.valid.clear()
            log.warning("lease lost", extra={"fields": {"lease_id": self.lease_id, "code": e.code().name}})
            if self._on_lost:
                await self._on_lost(e)
            if self._reconnect and e.code() == grpc.StatusCode.UNAVAILABLE:
                # The holder still uses the memory: re-claim the same lease (a broker with a journal kept it), or
                # else ask for the same budget again.
                self.request = replace(self.request, reclaim_lease_id=self.lease_id)
                await self._open(connect_timeout_s=None)

    async def set_busy(self, busy: bool) -> list[str]:
        """An interactive lease says whether its latency-sensitive work is under way, so batch work on its device
        yields (or resumes). Returns the leases that yield to it now. Raises grpc.aio.AioRpcError as the broker
        answered (an older broker: UNIMPLEMENTED)."""
        self._busy = busy
        return await self._say_busy(busy)

    async def _say_busy(self, busy: bool) -> list[str]:
        reply = await self._client.stub.SetBusy(broker_pb2.SetBusyRequest(lease_id=self.lease_id, busy=busy),
                                                timeout=SET_BUSY_TIMEOUT_S)
        return list(reply.yielding_lease_ids)

    async def release(self) -> None:
        """Gives the lease back; safe to call twice and from several tasks at once.

        Every caller awaits the same release, shielded: a caller that is cancelled meanwhile (the
        preempt path racing `close`) can no longer cancel the Release RPC half-way and leave the
        Acquire stream, and so the lease, open.
        """
        if self._release_task is None:
            self._release_task = asyncio.ensure_future(self._release_once())
        await asyncio.shield(self._release_task)

    async def _release_once(self) -> None:
        self._released_by_us = True
        self.valid.clear()
        try:
            if self.lease is not None and not self.released.is_set():
                try:
                    await self._client.stub.Release(broker_pb2.ReleaseRequest(lease_id=self.lease_id), timeout=5)
                except grpc.aio.AioRpcError as e:
                    # NOT_FOUND: already freed (preempt raced, broker restarted); closing the stream frees it anyway.
                    if e.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                        raise
        finally:
            self.released.set()
            if self._call is not None:
                self._call.cancel()

    async def close(self) -> None:
        await self.release()
        if self._reader is not None and self._reader is not asyncio.current_task():
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass


class _LeaseContext:
    def __init__(self, held: HeldLease, connect_timeout_s: float | None):
        self.held = held
        self.connect_timeout_s = connect_timeout_s

    async def __aenter__(self) -> HeldLease:
        try:
            await self.held._open(self.connect_timeout_s)
        except BaseException:
            if self.held._call is not None:
                self.held._call.cancel()
            raise
        return self.held

    async def __aexit__(self, *exc) -> None:
        await self.held.close()


class BrokerClient:
    """A channel to the broker with keepalive; use as `async with BrokerClient(addr) as broker`.

    `security` carries this service's token for the broker and the TLS settings, when the broker wants them."""

    def __init__(self, target: str, security: ClientSecurity = INSECURE):
        self.target = target
        self.channel = open_channel(target, security)
        self.stub = broker_pb2_grpc.GpuBrokerServiceStub(self.channel)

    async def __aenter__(self) -> "BrokerClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        await self.channel.close()

    def lease(self, request: LeaseRequest, *, on_preempt: PreemptCallback | None = None,
              on_abort: AbortCallback | None = None, on_lost: LostCallback | None = None,
              on_queued: Callable[[broker_pb2.LeaseQueued], None] | None = None,
              on_yield: YieldCallback | None = None,
              reconnect: bool = True, connect_timeout_s: float | None = 10.0) -> _LeaseContext:
        """Acquires on enter, releases on exit.

        On a preempt event, `on_preempt` runs (stop work, unload) and then the lease is
        released. Without a callback only `preempt_requested` is set: the holder's own loop
        must stop and release before the deadline. A batch lease's `on_yield` runs with True when the broker asks
        it to pause between steps for busy interactive work on its device, and with False when it may resume
        (`yielding` follows the same). With `reconnect`, a lease lost because the broker became
        unavailable is re-acquired with the same request; `valid` is clear meanwhile.
        """
        held = HeldLease(self, request, on_preempt=on_preempt, on_abort=on_abort, on_lost=on_lost,
                         on_queued=on_queued, on_yield=on_yield, reconnect=reconnect)
        return _LeaseContext(held, connect_timeout_s)

    async def status(self) -> broker_pb2.BrokerState:
        return (await self.stub.Status(broker_pb2.StatusRequest())).state

    async def cancel(self, *, request_id: str = "", lease_id: str = "", reason: str = "") -> broker_pb2.CancelResponse:
        req = broker_pb2.CancelRequest(reason=reason)
        if request_id:
            req.request_id = request_id
        else:
            req.lease_id = lease_id
        return await self.stub.Cancel(req)
