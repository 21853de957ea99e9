"""Broker latency over loopback gRPC: uncontended acquire->grant, and a full preempt->release->grant handoff.

    python -m benchmarks.broker_bench --out docs/bench/broker.jsonl   (or: make bench-broker)

Starts a real broker process with a fake inventory, drives it from this process, and
appends one JSON object per figure (bench, metric, value, unit, host, command, date).
Targets (issue 2): p99 grant under 2 ms; handoff under 20 ms plus the holder's own release time.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import grpc

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from gpu_broker.client import BrokerClient, LeaseRequest
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def host_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {platform.python_version()}"


async def raw_acquire_grant(address: str, iterations: int) -> tuple[list[float], list[float]]:
    """Acquire->granted and Release round trips with the bare aio stub."""
    grants, releases = [], []
    async with grpc.aio.insecure_channel(address, options=CLIENT_OPTIONS) as channel:
        stub = broker_pb2_grpc.GpuBrokerServiceStub(channel)
        req = broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="bench"), memory_bytes=2**30)
        for _ in range(iterations):
            t0 = time.perf_counter()
            call = stub.Acquire(req)
            async for event in call:
                if event.WhichOneof("event") == "granted":
                    lease_id = event.granted.lease_id
                    break
            grants.append(time.perf_counter() - t0)
            t1 = time.perf_counter()
            await stub.Release(broker_pb2.ReleaseRequest(lease_id=lease_id))
            releases.append(time.perf_counter() - t1)
            async for _ in call:  # the `released` event, then the end of the stream
                pass
    return grants, releases


async def client_acquire_grant(address: str, iterations: int) -> list[float]:
    """`async with broker.lease(...)` entry time, as the services see it."""
    out = []
    async with BrokerClient(address) as broker:
        for _ in range(iterations):
            t0 = time.perf_counter()
            async with broker.lease(LeaseRequest("bench", memory_bytes=2**30)):
                out.append(time.perf_counter() - t0)
    return out


async def handoffs(address: str, iterations: int, unload_s: float) -> tuple[list[float], list[float]]:
    """High-priority request -> holder gets the preempt event -> holder unloads for `unload_s` and releases
    -> waiter granted. Returns (total handoff, time until the holder saw the preempt event)."""
    totals, notify = [], []
    async with BrokerClient(address) as broker:
        for _ in range(iterations):
            async with broker.lease(LeaseRequest("holder", priority=1)) as low:
                async def holder_side():
                    await low.preempt_requested.wait()
                    seen = time.perf_counter()
                    if unload_s:
                        await asyncio.sleep(unload_s)
                    await low.release()
                    return seen

                holder_task = asyncio.create_task(holder_side())
                t0 = time.perf_counter()
                async with broker.lease(LeaseRequest("waiter", priority=5)):
                    granted = time.perf_counter()
                seen = await holder_task
            totals.append(granted - t0)
            notify.append(seen - t0)
    return totals, notify


def figures(name: str, samples: list[float]) -> list[tuple[str, float, str]]:
    ms = [s * 1000 for s in samples]
    return [(f"{name}_p50", percentile(ms, 0.5), "ms"), (f"{name}_p99", percentile(ms, 0.99), "ms"),
            (f"{name}_mean", statistics.fmean(ms), "ms"), (f"{name}_samples", float(len(ms)), "count")]


async def run(args) -> list[tuple[str, float, str]]:
    broker = start_service("gpu_broker", "--fake-devices", "1x24GiB", "--log-level", "WARNING")
    try:
        await raw_acquire_grant(broker.address, 50)  # warm the channel and the server
        grants, releases = await raw_acquire_grant(broker.address, args.iterations)
        via_client = await client_acquire_grant(broker.address, args.iterations // 2)
        totals, notify = await handoffs(broker.address, args.handoffs, 0.0)
        slow_totals, _ = await handoffs(broker.address, max(20, args.handoffs // 10), args.unload_ms / 1000)
    finally:
        broker.stop()
    # With a holder that unloads for U ms, what the broker and the wire add on top of U.
    slow_overhead = [t - args.unload_ms / 1000 for t in slow_totals]
    return (figures("acquire_to_grant", grants) + figures("release_rpc", releases)
            + figures("client_lease_enter", via_client) + figures("handoff_immediate_release", totals)
            + figures("handoff_preempt_event_latency", notify)
            + figures(f"handoff_minus_{args.unload_ms}ms_unload", slow_overhead))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--handoffs", type=int, default=300)
    parser.add_argument("--unload-ms", type=int, default=50, help="simulated holder unload time for the second handoff run")
    parser.add_argument("--out", type=Path, help="append JSON lines here")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    command = "python -m benchmarks.broker_bench " + " ".join(sys.argv[1:])
    lines = [json.dumps({"bench": "broker", "metric": m, "value": round(v, 4), "unit": u, "host": host_description(),
                         "command": command, "date": date}) for m, v, u in results]
    for m, v, u in results:
        print(f"{m:<32} {v:10.3f} {u}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
