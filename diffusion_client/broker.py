"""The broker's state from Python: devices, leases and the queue (the services take leases themselves)."""
from __future__ import annotations

import grpc

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from diffusion_client import options as opt
from diffusion_client.errors import ClientError


class Broker:
    def __init__(self, address: "str | opt.Connection", *, token: str | None = None):
        self.connection = opt.Connection.of(address, token)
        self.channel = self.connection.channel()
        self.stub = broker_pb2_grpc.GpuBrokerServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def status(self) -> broker_pb2.BrokerState:
        try:
            return self.stub.Status(broker_pb2.StatusRequest(), timeout=30).state
        except grpc.RpcError as e:
            raise ClientError.from_rpc(e) from None
