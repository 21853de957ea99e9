"""Blocking helpers for talking to a real broker process over loopback gRPC."""
from __future__ import annotations

import queue
import threading
import time

import grpc
from google.protobuf import duration_pb2

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS

GiB = 2**30
_END = object()


class AcquireStream:
    """An open Acquire call whose events are read on a thread; the test pulls them with a timeout."""

    def __init__(self, call):
        self.call = call
        self.events: queue.Queue = queue.Queue()
        self.error: grpc.RpcError | None = None
        self.request_id = ""
        self.lease: broker_pb2.Lease | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for event in self.call:
                self.events.put(event)
        except grpc.RpcError as e:
            self.error = e
        self.events.put(_END)

    def next(self, timeout: float = 5.0) -> broker_pb2.AcquireResponse:
        item = self.events.get(timeout=timeout)
        if item is _END:
            self.events.put(_END)
            if self.error is not None:
                raise self.error
            raise EOFError("stream ended")
        self.request_id = item.request_id
        if item.WhichOneof("event") == "granted":
            self.lease = item.granted
        return item

    def wait_for(self, kind: str, timeout: float = 5.0) -> broker_pb2.AcquireResponse:
        deadline = time.monotonic() + timeout
        while True:
            event = self.next(max(0.01, deadline - time.monotonic()))
            if event.WhichOneof("event") == kind:
                return event

    def kinds_so_far(self, settle: float = 0.2) -> list[str]:
        """Event kinds that arrived within `settle` seconds, without blocking longer."""
        out = []
        deadline = time.monotonic() + settle
        while True:
            try:
                item = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return out
            if item is _END:
                self.events.put(_END)
                out.append("<end>")
                return out
            out.append(item.WhichOneof("event"))

    def final_error(self, timeout: float = 5.0) -> grpc.RpcError:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.next(max(0.01, deadline - time.monotonic()))
            except grpc.RpcError as e:
                return e

    def close(self):
        self.call.cancel()


class Timeline:
    """A Watch stream collected on a thread."""

    def __init__(self, stub):
        self.call = stub.Watch(broker_pb2.WatchRequest())
        self.items: list[broker_pb2.WatchResponse] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_for("SNAPSHOT")  # the watch is live: later transitions will all be seen

    def _read(self):
        try:
            for item in self.call:
                with self._cond:
                    self.items.append(item)
                    self._cond.notify_all()
        except grpc.RpcError:
            pass

    def kinds(self) -> list[str]:
        with self._cond:
            return [broker_pb2.TransitionKind.Name(i.transition.kind).removeprefix("TRANSITION_KIND_")
                    for i in self.items]

    def wait_for(self, kind: str, timeout: float = 5.0, **match) -> broker_pb2.WatchResponse:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for item in self.items:
                    name = broker_pb2.TransitionKind.Name(item.transition.kind).removeprefix("TRANSITION_KIND_")
                    if name == kind and all(getattr(item.transition, k) == v for k, v in match.items()):
                        return item
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {kind} {match} in {self.kinds()}")
                self._cond.wait(left)

    def close(self):
        self.call.cancel()


class BrokerClientSync:
    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address, options=CLIENT_OPTIONS)
        self.stub = broker_pb2_grpc.GpuBrokerServiceStub(self.channel)
        self._streams: list[AcquireStream] = []

    def acquire(self, client_id: str, *, priority: int = 0, memory: int = 0, device: int | None = None,
                fail_fast: bool = False, grace: float | None = None, purpose: str = "") -> AcquireStream:
        req = broker_pb2.AcquireRequest(
            holder=broker_pb2.Holder(client_id=client_id, priority=priority, purpose=purpose),
            memory_bytes=memory,
            wait_policy=broker_pb2.WAIT_POLICY_FAIL_FAST if fail_fast else broker_pb2.WAIT_POLICY_QUEUE)
        if device is not None:
            req.device_index = device
        if grace is not None:
            d = duration_pb2.Duration()
            d.FromNanoseconds(int(grace * 1e9))
            req.release_grace.CopyFrom(d)
        stream = AcquireStream(self.stub.Acquire(req))
        self._streams.append(stream)
        return stream

    def granted(self, client_id: str, **kw) -> AcquireStream:
        stream = self.acquire(client_id, **kw)
        stream.wait_for("granted")
        return stream

    def release(self, stream: AcquireStream) -> broker_pb2.ReleaseResponse:
        return self.stub.Release(broker_pb2.ReleaseRequest(lease_id=stream.lease.lease_id))

    def status(self) -> broker_pb2.BrokerState:
        return self.stub.Status(broker_pb2.StatusRequest()).state

    def timeline(self) -> Timeline:
        return Timeline(self.stub)

    def close(self):
        for s in self._streams:
            s.close()
        self.channel.close()
