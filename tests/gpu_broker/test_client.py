"""The async client library against a real broker process."""
import asyncio
import time

import grpc
import pytest

from gpu_broker.client import BrokerClient, LeaseError, LeaseRequest
from tests.gpu_broker.harness import GiB
from service_kit.service_process import free_port, start_service


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_preempt_callback_runs_then_lease_is_released(start_broker):
    proc, _ = start_broker()

    async def scenario():
        unloaded = []
        async with BrokerClient(proc.address) as broker:
            async def unload(ev):
                unloaded.append(ev.for_holder.client_id)
                await asyncio.sleep(0.05)  # the holder's own unload time

            async with broker.lease(LeaseRequest("trainer", priority=1), on_preempt=unload) as low:
                async with broker.lease(LeaseRequest("inference", priority=5)) as high:
                    assert high.valid.is_set() and high.device_index == 0
                    await asyncio.wait_for(low.released.wait(), 5)
                    assert unloaded == ["inference"] and not low.valid.is_set()
                    state = await broker.status()
                    assert [l.holder.client_id for l in state.leases] == ["inference"]
            assert list((await broker.status()).leases) == []

    run(scenario())


def test_release_on_exit_even_when_the_body_raises(start_broker):
    proc, _ = start_broker()

    async def scenario():
        async with BrokerClient(proc.address) as broker:
            with pytest.raises(RuntimeError):
                async with broker.lease(LeaseRequest("x", memory_bytes=GiB)):
                    raise RuntimeError("work failed")
            assert list((await broker.status()).leases) == []

    run(scenario())


def test_rejection_surfaces_as_lease_error(start_broker):
    proc, _ = start_broker()

    async def scenario():
        async with BrokerClient(proc.address) as broker:
            with pytest.raises(LeaseError) as e:
                async with broker.lease(LeaseRequest("x", memory_bytes=100 * GiB)):
                    pass
            assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "never fit" in e.value.details

    run(scenario())


def test_abort_callback_receives_cancel(start_broker):
    proc, _ = start_broker()

    async def scenario():
        reasons = []

        async def abort(ev):
            reasons.append(ev.reason)

        async with BrokerClient(proc.address) as broker:
            async with broker.lease(LeaseRequest("loader"), on_abort=abort) as held:
                await broker.cancel(lease_id=held.lease_id, reason="superseded")
                await asyncio.wait_for(held.abort_requested.wait(), 5)
                assert reasons == ["superseded"]

    run(scenario())


def test_acquire_waits_for_a_broker_that_starts_late_and_reacquires_after_restart():
    port = free_port()
    address = f"127.0.0.1:{port}"

    async def scenario():
        procs = []
        try:
            async with BrokerClient(address) as broker:
                lost = []

                async def on_lost(err):
                    lost.append(err.code())

                async def start_later():
                    await asyncio.sleep(0.5)
                    procs.append(await asyncio.to_thread(start_service, "gpu_broker", "--fake-devices", "1x24GiB",
                                                         listen=address))

                starter = asyncio.create_task(start_later())
                async with broker.lease(LeaseRequest("inference", memory_bytes=8 * GiB), on_lost=on_lost,
                                        connect_timeout_s=20) as held:
                    await starter
                    first = held.lease_id
                    assert first
                    await asyncio.to_thread(procs[0].stop)
                    procs.append(await asyncio.to_thread(start_service, "gpu_broker", "--fake-devices", "1x24GiB",
                                                         listen=address))
                    deadline = time.monotonic() + 15
                    while not (held.valid.is_set() and held.lease_id != first):
                        assert time.monotonic() < deadline, "lease was not re-acquired"
                        await asyncio.sleep(0.05)
                    assert lost == [grpc.StatusCode.UNAVAILABLE]
                    state = await broker.status()
                    assert [(l.holder.client_id, l.memory_bytes) for l in state.leases] == [("inference", 8 * GiB)]
        finally:
            for p in procs:
                p.stop()

    run(scenario())


def test_batch_lease_hears_yield_and_resume_when_an_interactive_one_says_it_is_busy(start_broker):
    proc, _ = start_broker()

    async def scenario():
        heard = []

        async def on_yield(yielding, event):
            heard.append((yielding, getattr(event, "for_holder", None) and event.for_holder.client_id))

        async with BrokerClient(proc.address) as broker:
            async with broker.lease(LeaseRequest("training", memory_bytes=4 * GiB, batch=True),
                                    on_yield=on_yield) as train:
                async with broker.lease(LeaseRequest("inference", memory_bytes=4 * GiB)) as inf:
                    assert await inf.set_busy(True) == [train.lease_id]
                    await asyncio.wait_for(train.yielding.wait(), 5)
                    state = await broker.status()
                    by_id = {l.lease_id: l for l in state.leases}
                    assert by_id[inf.lease_id].busy and by_id[train.lease_id].yielding_to_lease_id == inf.lease_id
                    assert await inf.set_busy(False) == []
                    deadline = time.monotonic() + 5
                    while train.yielding.is_set():
                        assert time.monotonic() < deadline, "the batch lease was not told to resume"
                        await asyncio.sleep(0.02)
                    assert heard == [(True, "inference"), (False, None)]
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await train.set_busy(True)
                    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                released = inf.lease_id
                with pytest.raises(grpc.aio.AioRpcError) as gone:
                    await inf.set_busy(True)
                assert gone.value.code() == grpc.StatusCode.NOT_FOUND and released in gone.value.details()

    run(scenario())


def test_a_busy_lease_is_said_busy_again_after_the_broker_restarts():
    port = free_port()
    address = f"127.0.0.1:{port}"

    async def scenario():
        procs = [await asyncio.to_thread(start_service, "gpu_broker", "--fake-devices", "1x24GiB", listen=address)]
        try:
            async with BrokerClient(address) as broker:
                async with broker.lease(LeaseRequest("inference", memory_bytes=8 * GiB), connect_timeout_s=20) as held:
                    await held.set_busy(True)
                    first = held.lease_id
                    await asyncio.to_thread(procs[0].stop)
                    procs.append(await asyncio.to_thread(start_service, "gpu_broker", "--fake-devices", "1x24GiB",
                                                         listen=address))
                    deadline = time.monotonic() + 15
                    while True:
                        assert time.monotonic() < deadline, "the lease was not said busy again"
                        if held.valid.is_set() and held.lease_id != first:
                            leases = (await broker.status()).leases
                            if [x.busy for x in leases] == [True]:
                                break
                        await asyncio.sleep(0.05)
        finally:
            for p in procs:
                p.stop()

    run(scenario())
