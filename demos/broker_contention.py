"""`make demo`: a broker on loopback and two services contending for one device.

A trainer holds the GPU; an inference service with higher priority asks for it; the
trainer is preempted, saves and releases; inference is granted; when inference is done
the trainer, which queued again straight away, is re-granted. Prints the lease timeline
as the broker's Watch stream reported it, then stops everything it started.
"""
from __future__ import annotations

import asyncio
import time

import grpc

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from gpu_broker.client import BrokerClient, LeaseRequest
from service_kit.units import format_bytes
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service

DEVICES = "1x24GiB"


def say(t0: float, who: str, text: str) -> None:
    print(f"  [{(time.monotonic() - t0) * 1000:7.1f} ms] {who:<12} {text}", flush=True)


async def watch_timeline(address: str, into: list[broker_pb2.WatchResponse], ready: asyncio.Event) -> None:
    async with grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS) as channel:
        stub = broker_pb2_grpc.GpuBrokerServiceStub(channel)
        try:
            async for item in stub.Watch(broker_pb2.WatchRequest()):
                into.append(item)
                ready.set()
        except grpc.aio.AioRpcError:
            pass


async def trainer(address: str, t0: float, preempted: asyncio.Event, done: asyncio.Event) -> None:
    async with BrokerClient(address) as broker:
        async def save_and_unload(ev: broker_pb2.PreemptRequested) -> None:
            say(t0, "trainer-0", f"preempt event for {ev.for_holder.client_id!r}: saving checkpoint, unloading")
            await asyncio.sleep(0.2)  # the holder's own save time
            preempted.set()

        request = LeaseRequest("trainer-0", purpose="train LoRA (demo)", priority=1, release_grace_s=5)
        async with broker.lease(request, on_preempt=save_and_unload) as lease:
            say(t0, "trainer-0", f"granted {lease.lease_id} on device {lease.device_index} "
                                  f"({format_bytes(lease.lease.memory_bytes)}, exclusive)")
            await lease.released.wait()
            say(t0, "trainer-0", "released; queueing again to resume")
        async with broker.lease(request, on_queued=lambda q: say(t0, "trainer-0", f"queued at position {q.position}")) as lease:
            say(t0, "trainer-0", f"re-granted {lease.lease_id}: resuming from the checkpoint")
            await asyncio.sleep(0.1)
        say(t0, "trainer-0", "finished and released")
    done.set()


async def inference(address: str, t0: float, preempted: asyncio.Event) -> None:
    async with BrokerClient(address) as broker:
        say(t0, "inference-0", "asks for the device at priority 5")
        async with broker.lease(LeaseRequest("inference-0", purpose="load Z-Image (demo)", priority=5)) as lease:
            assert preempted.is_set(), "granted before the trainer let go"
            say(t0, "inference-0", f"granted {lease.lease_id}: loading, generating")
            await asyncio.sleep(0.3)
        say(t0, "inference-0", "released")


async def main() -> int:
    print(f"Starting the GPU broker with a fake inventory of {DEVICES} on loopback...")
    broker = start_service("gpu_broker", "--fake-devices", DEVICES)
    print(f"  broker listening on {broker.address}\n")
    timeline: list[broker_pb2.WatchResponse] = []
    try:
        ready = asyncio.Event()
        watcher = asyncio.create_task(watch_timeline(broker.address, timeline, ready))
        await asyncio.wait_for(ready.wait(), 10)
        t0 = time.monotonic()
        preempted, done = asyncio.Event(), asyncio.Event()
        train_task = asyncio.create_task(trainer(broker.address, t0, preempted, done))
        await asyncio.sleep(0.3)
        await inference(broker.address, t0, preempted)
        await asyncio.wait_for(done.wait(), 10)
        await train_task
        await asyncio.sleep(0.1)
        watcher.cancel()
    finally:
        broker.stop()

    print("\nLease timeline from the broker's Watch stream:")
    start = timeline[0].time.ToNanoseconds()
    for item in timeline[1:]:
        t = item.transition
        kind = broker_pb2.TransitionKind.Name(t.kind).removeprefix("TRANSITION_KIND_")
        print(f"  #{item.sequence:<3} +{(item.time.ToNanoseconds() - start) / 1e6:8.1f} ms  {kind:<18} "
              f"{t.holder.client_id:<12} {t.lease_id or t.request_id:<19} {t.detail}")
    kinds = [broker_pb2.TransitionKind.Name(i.transition.kind).removeprefix("TRANSITION_KIND_") for i in timeline[1:]]
    expected = ["GRANTED", "PREEMPT_REQUESTED", "RELEASED", "GRANTED", "QUEUED", "RELEASED", "GRANTED", "RELEASED"]
    ok = kinds == expected
    print(f"\n{'OK' if ok else 'UNEXPECTED'}: grant, preempt, release, regrant; broker stopped.")
    if not ok:
        print(f"  expected {expected}\n  got      {kinds}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
