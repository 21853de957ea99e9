"""A broker restarted with its lease journal keeps the held memory for the holders: real broker processes,
SIGKILLed and started again on the same address, and the client library re-claiming its lease."""
import asyncio
import signal
import time

import grpc
import pytest

from diffusion.v1 import broker_pb2
from gpu_broker.client import BrokerClient, LeaseRequest
from gpu_broker.lease_journal import JournalError, LeaseJournal
from service_kit.error_interceptor import error_info
from service_kit.service_process import free_port, start_service
from tests.gpu_broker.harness import BrokerClientSync, GiB


def broker(address: str, journal, window: float = 30.0):
    return start_service("gpu_broker", "--fake-devices", "1x24GiB", "--lease-journal", str(journal),
                         "--reclaim-window", str(window), listen=address)


def test_a_restarted_broker_keeps_held_memory_for_its_holder(tmp_path):
    """Before the journal, the restarted broker's books were empty and a newcomer that asked first got the
    memory the holder was still computing in."""
    address, journal = f"127.0.0.1:{free_port()}", tmp_path / "leases.json"
    procs = [broker(address, journal)]

    async def scenario():
        async with BrokerClient(address) as client:
            async with client.lease(LeaseRequest("inference-0", memory_bytes=16 * GiB)) as held:
                first_id = held.lease_id
                await asyncio.to_thread(procs[0].stop, signal.SIGKILL)
                procs.append(await asyncio.to_thread(broker, address, journal))
                newcomer = BrokerClientSync(address)
                try:
                    # Whether it asks before or after the holder re-claims, 16 of the 24 GiB are not its to take.
                    refused = newcomer.acquire("newcomer", memory=16 * GiB, fail_fast=True).final_error()
                    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    assert error_info(refused).reason == "WOULD_HAVE_TO_WAIT"
                    deadline = time.monotonic() + 15
                    while not held.valid.is_set() or held.lease.state != broker_pb2.LEASE_STATE_ACTIVE:
                        assert time.monotonic() < deadline, "the holder did not re-claim its lease"
                        await asyncio.sleep(0.05)
                    assert held.lease_id == first_id  # the same lease, re-claimed, not a new one
                    state = newcomer.status()
                    assert [(x.lease_id, x.holder.client_id, x.memory_bytes, x.state) for x in state.leases] == [
                        (first_id, "inference-0", 16 * GiB, broker_pb2.LEASE_STATE_ACTIVE)]
                    # Memory nobody held is still lent at once during the window.
                    assert newcomer.granted("small", memory=8 * GiB).lease.memory_bytes == 8 * GiB
                finally:
                    newcomer.close()

    try:
        asyncio.run(scenario())
    finally:
        for p in procs:
            p.stop()


def test_a_lease_nobody_reclaims_is_freed_when_the_window_ends(tmp_path):
    address, journal = f"127.0.0.1:{free_port()}", tmp_path / "leases.json"
    first = broker(address, journal, window=2)
    holder = BrokerClientSync(address)
    second = None
    try:
        held = holder.granted("training-0", memory=0)  # the whole device
        first.stop(signal.SIGKILL)
        holder.close()  # this holder never comes back
        second = broker(address, journal, window=2)
        client = BrokerClientSync(address)
        try:
            [kept] = client.status().leases
            assert (kept.lease_id, kept.state, kept.exclusive) == (
                held.lease.lease_id, broker_pb2.LEASE_STATE_AWAITING_RECLAIM, True)
            assert kept.HasField("reclaim_deadline")
            timeline = client.timeline()
            stream = client.acquire("newcomer", memory=4 * GiB)
            stream.wait_for("granted", timeout=15)
            timeline.wait_for("GRANTED")
            kinds = timeline.kinds()
            assert kinds.index("RECLAIM_EXPIRED") < kinds.index("GRANTED")  # not before the window ended
        finally:
            client.close()
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_an_unreadable_journal_stops_the_broker_from_starting(tmp_path):
    journal = tmp_path / "leases.json"
    journal.write_text("{not json")
    with pytest.raises(JournalError, match="unreadable"):
        LeaseJournal(journal).load()
    with pytest.raises(RuntimeError, match="lease journal"):
        broker(f"127.0.0.1:{free_port()}", journal)
