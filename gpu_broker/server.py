"""Builds and runs the broker server."""
from __future__ import annotations

import time
from dataclasses import dataclass

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from gpu_broker.inventory import DeviceInfo
from gpu_broker.lease_book import BrokerPolicy, LeaseBook
from gpu_broker.lease_hub import LeaseHub
from gpu_broker.lease_journal import LeaseJournal
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
                               security: ServerSecurity | None = None, journal: LeaseJournal | None = None,
                               usage=None, usage_interval_s: float = 2.0) -> BrokerServer:
    """Starts a broker on `listen` (port 0 picks a free port) over the given inventory. With a journal, the
    leases it holds are kept for their holders to re-claim (raises JournalError for one it cannot read). With a
    `usage` reader (usage_probe.NvmlUsage), holders using more than their lease are said on the Watch stream."""
    book = LeaseBook(devices, policy)
    if journal is not None:
        book.restore(LeaseBook.leases_from_journal(journal.load()), time.time())
    hub = LeaseHub(book, journal=journal, usage=usage, usage_interval_s=usage_interval_s)

    def register(server):
        broker_pb2_grpc.add_GpuBrokerServiceServicer_to_server(BrokerServicer(hub), server)
        return [SERVICE_NAME]

    running = await create_server(listen, register, rules=RULES, security=security)
    hub.start()
    running.on_drain.append(hub.shutdown)
    return BrokerServer(running, hub)
