"""Builds and runs the broker server."""
from __future__ import annotations

from dataclasses import dataclass

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from gpu_broker.inventory import DeviceInfo
from gpu_broker.lease_book import BrokerPolicy, LeaseBook
from gpu_broker.lease_hub import LeaseHub
from gpu_broker.request_rules import RULES
from gpu_broker.servicer import BrokerServicer
from service_kit.security import ServerSecurity
from service_kit.server_runtime import RunningServer, create_server

SERVICE_NAME = broker_pb2.DESCRIPTOR.services_by_name["GpuBrokerService"].full_name


@dataclass
class BrokerServer:
    running: RunningServer
    hub: LeaseHub

    @property
    def port(self) -> int:
        return self.running.port


async def create_broker_server(listen: str, devices: list[DeviceInfo], policy: BrokerPolicy | None = None,
                               security: ServerSecurity | None = None) -> BrokerServer:
    """Starts a broker on `listen` (port 0 picks a free port) over the given inventory."""
    hub = LeaseHub(LeaseBook(devices, policy))

    def register(server):
        broker_pb2_grpc.add_GpuBrokerServiceServicer_to_server(BrokerServicer(hub), server)
        return [SERVICE_NAME]

    running = await create_server(listen, register, rules=RULES, security=security)
    hub.start()
    running.on_drain.append(hub.shutdown)
    return BrokerServer(running, hub)
