"""The broker's state from Python: devices, leases and the queue (the services take leases themselves)."""
from __future__ import annotations

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from diffusion_client.service_client import ServiceClient


class Broker(ServiceClient):
    STUB = broker_pb2_grpc.GpuBrokerServiceStub

    def status(self) -> broker_pb2.BrokerState:
        return self._call(self.stub.Status, broker_pb2.StatusRequest()).state
