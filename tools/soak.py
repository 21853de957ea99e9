"""Soak: minutes of concurrent Generate on a tiny model, with cancels, disconnects, tight deadlines and a
broker SIGKILLed and restarted in the middle; RSS and open file descriptors of every process at the start
and the end. Not a test: it runs for minutes and writes one JSON line with what it saw.

    python -m tools.soak --minutes 10 --out docs/bench/soak.jsonl

It fails (exit 1) if any call answers UNKNOWN or INTERNAL, if the service stops answering, or if the
inference service did not re-claim its own lease from the restarted broker (it runs with a lease journal).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import grpc

from diffusion.v1 import common_pb2, inference_pb2 as pb, inference_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import free_port, start_service

ROOT = Path(__file__).resolve().parent.parent


def usage(pid: int) -> dict:
    """Resident memory (MiB) and open file descriptors of a process, from /proc."""
    rss_kib = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kib = int(line.split()[1])
    return {"rss_mib": round(rss_kib / 1024, 1), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.examples: dict[str, str] = {}  # the first answer of each unexpected kind, for the record

    def add(self, what: str, details: str = "") -> None:
        with self.lock:
            self.counts[what] += 1
            if details and what not in self.examples:
                self.examples[what] = details[:300]


def worker(address: str, stop: threading.Event, tally: Tally, seed: int) -> None:
    """One client in a loop: a plain Generate, or one it cancels, abandons or gives too little time."""
    rng = random.Random(seed)
    channel = grpc.insecure_channel(address, options=CLIENT_OPTIONS)
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    while not stop.is_set():
        kind = rng.choice(["plain", "plain", "cancel", "disconnect", "deadline"])
        gen_id = f"soak-{seed}-{rng.getrandbits(40):x}"
        req = pb.GenerateRequest(model_id="soak", prompt="a lighthouse at dusk", width=64, height=64,
                                 steps=rng.choice([2, 4, 8]), seeds=[rng.getrandbits(31)], generation_id=gen_id)
        timeout = 0.05 if kind == "deadline" else 60
        try:
            call = stub.Generate(req, timeout=timeout)
            for i, _ in enumerate(call):
                if kind == "cancel" and i == 1:
                    try:
                        stub.CancelGeneration(pb.CancelGenerationRequest(generation_id=gen_id), timeout=10)
                    except grpc.RpcError as e:
                        tally.add(f"cancel-call:{e.code().name}", e.details() or "")
                if kind == "disconnect" and i == 1:
                    call.cancel()
            tally.add(f"{kind}:OK")
        except grpc.RpcError as e:
            expected = e.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                                    grpc.StatusCode.UNAVAILABLE)
            tally.add(f"{kind}:{e.code().name}", "" if expected else e.details() or "")
            if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
                time.sleep(0.2)  # NO_LEASE while the broker is away, QUEUE_FULL: what a client backs off on
    channel.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    from demos.tiny_pipelines import save_tiny_pipeline

    work = Path(tempfile.mkdtemp(prefix="soak-"))
    model = save_tiny_pipeline("zimage", work / "tiny-zimage")
    journal = work / "leases.json"
    broker_address = f"127.0.0.1:{free_port()}"
    broker_flags = ("--fake-devices", "1x24GiB", "--lease-journal", str(journal))
    broker = start_service("gpu_broker", *broker_flags, listen=broker_address)
    service = start_service("inference_service", "--broker", broker_address, "--model-root", str(work),
                            "--max-queue-depth", "8", timeout=180)
    channel = grpc.insecure_channel(service.address, options=CLIENT_OPTIONS)
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    list(stub.Load(pb.LoadRequest(model_id="soak", source=common_pb2.ModelSource(local_dir=str(model))), timeout=300))
    list(stub.Generate(pb.GenerateRequest(model_id="soak", prompt="warm", width=64, height=64, steps=2), timeout=60))
    lease_before = stub.GetInferenceStatus(pb.GetInferenceStatusRequest(), timeout=10).lease_id
    start = {"broker": usage(broker.proc.pid), "inference": usage(service.proc.pid), "soak": usage(os.getpid())}
    tally, stop = Tally(), threading.Event()
    threads = [threading.Thread(target=worker, args=(service.address, stop, tally, i), daemon=True)
               for i in range(args.clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    duration = args.minutes * 60
    time.sleep(duration / 2)
    broker.stop(signal.SIGKILL)
    broker = start_service("gpu_broker", *broker_flags, listen=broker_address)
    restarted_at = time.monotonic() - t0
    time.sleep(max(0.0, duration - (time.monotonic() - t0)))
    stop.set()
    for t in threads:
        t.join(120)
    healthy = bool(list(stub.Generate(pb.GenerateRequest(model_id="soak", prompt="after", width=64, height=64,
                                                         steps=2), timeout=120)))
    end = {"broker (restarted)": usage(broker.proc.pid), "inference": usage(service.proc.pid),
           "soak": usage(os.getpid())}
    lease_after = stub.GetInferenceStatus(pb.GetInferenceStatusRequest(), timeout=10).lease_id
    channel.close()
    service.stop()
    broker.stop()
    bad = {k: v for k, v in tally.counts.items() if k.endswith((":UNKNOWN", ":INTERNAL"))}
    record = {"bench": "soak", "command": "python -m tools.soak " + " ".join(sys.argv[1:]),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "code": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                     text=True).stdout.strip(),
              "host": f"{os.cpu_count()} CPUs, no GPU (fake 24 GiB device)", "minutes": args.minutes,
              "clients": args.clients, "broker_restarted_at_s": round(restarted_at, 1),
              "calls": dict(sorted(tally.counts.items())), "unexpected_examples": tally.examples, "unknown_or_internal": sum(bad.values()),
              "healthy_after": healthy,
              "lease_reclaimed": bool(lease_before) and lease_after == lease_before, "start": start, "end": end}
    line = json.dumps(record)
    print(line)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    return 0 if healthy and not bad and record["lease_reclaimed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
