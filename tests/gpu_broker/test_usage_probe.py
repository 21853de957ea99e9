"""Holders' real device usage against their leases: attribution by process tree, reported once per crossing."""
import asyncio
import os

import pytest

from gpu_broker.client import BrokerClient, LeaseRequest
from gpu_broker.inventory import DeviceInfo
from gpu_broker.lease_book import AcquireSpec, BrokerPolicy, Holder, LeaseBook, TransitionKind
from gpu_broker.lease_hub import LeaseHub
from gpu_broker.usage_probe import attribute, parent_of

G = 2**30
# 100 is the training service (holder of lease-t), 101 its trainer child; 200 the inference service (lease-i);
# 300 a process no lease covers.
PARENTS = {101: 100, 100: 1, 200: 1, 300: 1, 102: 101}


@pytest.mark.parametrize("on_device, expected", [
    ({0: {101: 30 * G}}, {"lease-t": 30 * G, "lease-i": 0}),  # the child counts for its parent's lease
    ({0: {101: 30 * G, 102: G, 200: 20 * G}}, {"lease-t": 31 * G, "lease-i": 20 * G}),  # grandchildren too
    ({0: {300: 5 * G}}, {"lease-t": 0, "lease-i": 0}),  # nobody's
    ({1: {200: 7 * G}}, {"lease-t": 0, "lease-i": 0}),  # on another device than the lease's
])
def test_usage_is_attributed_by_process_tree_and_device(on_device, expected):
    holders = [("lease-t", 0, 100), ("lease-i", 0, 200), ("lease-anon", 0, 0)]
    assert attribute(on_device, holders, lambda pid: PARENTS.get(pid, 0)) == expected


def test_parent_of_reads_this_host():
    assert parent_of(os.getpid()) == os.getppid()
    assert parent_of(2**22 + 12345) == 0  # no such process


def test_a_holder_over_its_lease_is_said_once_per_crossing():
    book = LeaseBook([DeviceInfo(0, "fake", "fake-0", 24 * G)], BrokerPolicy())
    request = book.submit(AcquireSpec(Holder("training-0", pid=100), memory_bytes=10 * G), now=0)
    lease_id = book.lease_for_request(request).lease_id
    for t, used in enumerate([9 * G, 11 * G, 12 * G, 9 * G, 11 * G], start=1):
        book.report_usage({lease_id: used}, now=t)
    over = [x for x in book.transitions if x.kind is TransitionKind.OVER_LEASE]
    assert [x.time for x in over] == [2, 5] and "holds 10.0 GiB" in over[0].detail


def test_the_hub_reads_usage_and_says_it_on_the_watch_stream():
    async def scenario():
        readings = {0: {}}
        hub = LeaseHub(LeaseBook([DeviceInfo(0, "fake", "fake-0", 24 * G)], BrokerPolicy()),
                       usage=lambda: readings, usage_interval_s=0.05)
        hub.start()
        watch = hub.watch()
        await watch.__anext__()  # the opening snapshot
        stream = hub.acquire(AcquireSpec(Holder("inference-0", pid=os.getpid()), memory_bytes=4 * G))
        lease = None
        async for notice in stream:
            if hasattr(notice.event, "lease"):
                lease = notice.event.lease
                break
        readings[0] = {os.getpid(): 6 * G}
        while True:
            event = await asyncio.wait_for(watch.__anext__(), 5)
            if event.transition.kind is TransitionKind.OVER_LEASE:
                assert event.transition.lease_id == lease.lease_id
                break
        await hub.shutdown()

    asyncio.run(scenario())


def test_the_client_library_names_its_process(start_broker):
    proc, client = start_broker(fake_devices="1x24GiB")

    async def scenario():
        async with BrokerClient(proc.address) as broker:
            async with broker.lease(LeaseRequest("inference-0", memory_bytes=G)):
                state = await broker.status()
                assert [x.holder.pid for x in state.leases] == [os.getpid()]

    asyncio.run(scenario())
