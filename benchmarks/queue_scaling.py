"""How the broker's queue scales: thousands of waiting Acquires over loopback gRPC, then all of them gone at once.

    python -m benchmarks.queue_scaling --waiters 1000,3000 --out docs/bench/broker.jsonl

A real broker process (one fake 24 GiB device, --max-waiters above the largest count) with the device
held; N Acquire streams that must wait, opened together, 500 to a connection. Records the time until every
stream heard its place, a Status call's latency with N waiting, and the time from cancelling every
stream at once until Status shows an empty queue (with the slowest Status answered meanwhile).
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import grpc

from benchmarks.bench_record import Recorder
from benchmarks.broker_bench import host_description
from diffusion.v1 import broker_pb2, broker_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service

GiB = 2**30


async def run(address: str, n: int, record) -> None:
    channel = grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS)
    stub = broker_pb2_grpc.GpuBrokerServiceStub(channel)
    holder = stub.Acquire(broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="holder", priority=100)))
    async for event in holder:
        if event.WhichOneof("event") == "granted":
            break
    # 500 streams a connection, as from many client processes (one connection refused more than about 1,000).
    channels = [grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS) for _ in range((n + 499) // 500)]
    stubs = [broker_pb2_grpc.GpuBrokerServiceStub(ch) for ch in channels]
    calls = [stubs[i // 500].Acquire(broker_pb2.AcquireRequest(
        holder=broker_pb2.Holder(client_id=f"w{i}", priority=i % 7), memory_bytes=8 * GiB)) for i in range(n)]
    started = time.perf_counter()
    # Each stream's first event: its place in the queue. A few streams of a large burst end CANCELLED before
    # the broker's handler runs (a gRPC-level effect, seen with the old queue too); they are counted.
    firsts = await asyncio.gather(*(call.read() for call in calls), return_exceptions=True)
    lost = sum(1 for f in firsts if isinstance(f, BaseException))
    record(n, "enqueue_all_s", time.perf_counter() - started, "s", streams_cancelled_before_queued=lost)
    t = time.perf_counter()
    state = (await stub.Status(broker_pb2.StatusRequest(), timeout=120)).state
    record(n, "status_ms_with_queue", (time.perf_counter() - t) * 1e3, "ms", queued=len(state.queue))
    started = time.perf_counter()
    for call in calls:
        call.cancel()
    slowest = 0.0
    while True:
        t = time.perf_counter()
        state = (await stub.Status(broker_pb2.StatusRequest(), timeout=300)).state
        slowest = max(slowest, time.perf_counter() - t)
        if not state.queue:
            break
        await asyncio.sleep(0.01)
    record(n, "drain_all_s", time.perf_counter() - started, "s", slowest_status_ms=round(slowest * 1e3, 2))
    holder.cancel()
    for ch in (channel, *channels):
        await ch.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--waiters", default="1000,3000")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    counts = [int(x) for x in args.waiters.split(",")]
    broker = start_service("gpu_broker", "--fake-devices", "1x24GiB", "--max-waiters", str(max(counts) + 10),
                           "--log-level", "WARNING")
    recorder = Recorder("broker-queue", args.out, "", "python -m benchmarks.queue_scaling " + " ".join(sys.argv[1:]),
                        host_description())

    def record(n, metric, value, unit, **extra):
        recorder.write({"bench": "broker-queue", "waiters": n, "metric": metric, "value": round(value, 4),
                        "unit": unit, **recorder.stamp(), **extra})

    try:
        for n in counts:
            asyncio.run(run(broker.address, n, record))
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
