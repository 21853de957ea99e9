"""The broker's gRPC servicer: convert, delegate to the lease hub, convert back."""
from __future__ import annotations

from dataclasses import replace

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from gpu_broker import convert
from gpu_broker.lease_hub import LeaseHub
from service_kit.auth import bound_client_id, current_caller


class BrokerServicer(broker_pb2_grpc.GpuBrokerServiceServicer):
    def __init__(self, hub: LeaseHub):
        self.hub = hub

    async def Acquire(self, request, context):
        caller = current_caller()
        bound_client_id(caller, request.holder.client_id)
        caller.check_priority(request.holder.priority, "holder.priority")
        spec = replace(convert.acquire_spec(request), owner=caller.identity)
        sequence = 0
        async for notice in self.hub.acquire(spec):
            sequence += 1
            yield convert.acquire_response(notice, sequence)

    async def Release(self, request, context):
        return convert.release_response(self.hub.release(request.lease_id, current_caller()))

    async def Cancel(self, request, context):
        target = request.WhichOneof("target")
        outcome = self.hub.cancel(request_id=request.request_id if target == "request_id" else "",
                                  lease_id=request.lease_id if target == "lease_id" else "", reason=request.reason,
                                  caller=current_caller())
        return convert.cancel_response(outcome)

    async def SetBusy(self, request, context):
        yielding = self.hub.set_busy(request.lease_id, request.busy, current_caller())
        return broker_pb2.SetBusyResponse(yielding_lease_ids=yielding)

    async def Status(self, request, context):
        return broker_pb2.StatusResponse(state=convert.broker_state(self.hub.status()))

    async def Watch(self, request, context):
        async for event in self.hub.watch():
            yield convert.watch_response(event)
