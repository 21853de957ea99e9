"""The one-GPU checks of the scale-out work, on the real device: where the lease is, what the metrics endpoints
show while generations run, and per-model readiness. Run on a GPU host:

    python -m benchmarks.scale_out_check --workdir /tmp/scale-out --out docs/bench/scale_out.jsonl

Starts a broker on the host's real NVML inventory, two inference workers under it and the router in front of
them, each with --metrics-listen. Builds a full-size random-weight Z-Image (--tiny: the tiny one, a CPU dry
run), checks the model's readiness name is NOT_SERVING at the router and at the worker, loads it through the
router, and checks it turns SERVING at both; checks the lease is on device 0 and that NVML shows the worker's
process on that device only; then runs --gens generations through the router while scraping every /metrics
endpoint twice a second, and records what the scrapes showed during the run and after it.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.bench_record import Recorder, host_description
from diffusion.v1 import broker_pb2, broker_pb2_grpc
from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import inference_pb2_grpc
from inference_service.readiness import model_health_name
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import ROOT, start_service

# The figures the scrapes look for: name -> the labels that pick one series ({} any).
WATCHED = ("diffusion_inference_queue_depth", "diffusion_denoise_steps_per_second", "diffusion_images_per_second",
           "diffusion_denoise_steps_total", "diffusion_images_generated_total", "diffusion_inference_leased_bytes",
           "diffusion_inference_device_used_bytes", "diffusion_broker_leased_bytes", "diffusion_broker_leases",
           "diffusion_router_worker_in_flight", "diffusion_rpc_calls_total")


def scrape(port: int) -> dict[str, float]:
    """Every sample of the watched families, keyed by its full series text (name and labels)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] in WATCHED:
            out[series] = float(value)
    return out


class Scraper:
    """Scrapes each endpoint every `every_s` on a thread; keeps, per series, the highest value seen."""

    def __init__(self, ports: dict[str, int], every_s: float = 0.5):
        self.ports, self.every_s = ports, every_s
        self.peak: dict[str, dict[str, float]] = {name: {} for name in ports}
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _once(self):
        for name, port in self.ports.items():
            for series, value in scrape(port).items():
                self.peak[name][series] = max(value, self.peak[name].get(series, value))
        self.scrapes += 1

    def _run(self):
        while not self._stop.is_set():
            self._once()
            self._stop.wait(self.every_s)

    def stop(self):
        """Stops, after one last scrape: the counters' final values."""
        self._stop.set()
        self._thread.join()
        self._once()


def health_status(address: str, name: str) -> str:
    """SERVING or NOT_SERVING; NOT_FOUND for a name the server has never set (a probe fails on it too)."""
    with grpc.insecure_channel(address) as ch:
        try:
            answer = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        except grpc.RpcError as e:
            if e.code() is grpc.StatusCode.NOT_FOUND:
                return "NOT_FOUND"
            raise
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


def nvml_devices_of(pid: int) -> list[int]:
    """The device indices whose NVML compute-process list holds `pid` (empty without NVML)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except (ImportError, OSError) as e:  # no NVML here (a CPU dry run)
        print(f"NVML not read: {e}", flush=True)
        return []
    except Exception as e:  # noqa: BLE001 - pynvml.NVMLError_LibraryNotFound and its kin
        print(f"NVML not read: {e}", flush=True)
        return []
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            if any(p.pid == pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)):
                found.append(index)
        return found
    finally:
        pynvml.nvmlShutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/scale-out"))
    p.add_argument("--out", type=Path)
    p.add_argument("--gens", type=int, default=6)
    p.add_argument("--tiny", action="store_true", help="the tiny pipeline on a fake inventory: a CPU dry run")
    args = p.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    model_dir = args.workdir / ("zimage-tiny" if args.tiny else "zimage")
    build = ("from demos.tiny_pipelines import save_tiny_pipeline as s" if args.tiny
             else "from benchmarks.full_size_pipelines import save_full_size as s")
    if not (model_dir / "model_index.json").exists():
        subprocess.run([sys.executable, "-c", f"{build}; s('zimage', {str(model_dir)!r})"], cwd=ROOT, check=True)
    record = Recorder("scale_out", args.out, "zimage", "python -m benchmarks.scale_out_check " + " ".join(sys.argv[1:]),
                      host_description())
    metrics = ("--metrics-listen", "127.0.0.1:0")
    started = []
    try:
        broker = start_service("gpu_broker", *metrics, *(["--fake-devices", "1x24GiB"] if args.tiny else []))
        started.append(broker)
        flags = ["--broker", broker.address, *metrics, "--model-root", str(args.workdir), "--log-level", "WARNING"]
        if args.tiny:
            flags += ["--compile-backend", "aot_eager", "--warmup-resolution", "64"]
        workers = [start_service("inference_service", *flags, "--client-id", f"inference-{i}", timeout=600)
                   for i in range(2)]
        started += workers
        router = start_service("inference_router", *metrics, *[a for w in workers for a in ("--worker", w.address)])
        started.append(router)

        name = model_health_name("z")
        before = {"router": health_status(router.address, name), "worker": health_status(workers[0].address, name)}
        stub = inference_pb2_grpc.InferenceServiceStub(grpc.insecure_channel(router.address, options=CLIENT_OPTIONS))
        t = time.perf_counter()
        call = stub.Load(pb.LoadRequest(model_id="z", source=c.ModelSource(local_dir=str(model_dir)),
                                        compute_precision=c.PRECISION_BF16, speed_mode=c.SPEED_MODE_OFF), timeout=900)
        loaded = list(call)[-1].result
        record("bf16-off", "load_s", time.perf_counter() - t, "s")
        holder = next(w for w in workers if w.address == dict(call.initial_metadata())["diffusion-worker"])
        time.sleep(1.5)  # the router's next poll
        after = {"router": health_status(router.address, name), "worker": health_status(holder.address, name)}
        record("bf16-off", "readiness_flips", int(set(before.values()) <= {"NOT_SERVING", "NOT_FOUND"}
                                                  and after == {"router": "SERVING", "worker": "SERVING"}), "bool",
               before=before, after=after)

        status = broker_pb2_grpc.GpuBrokerServiceStub(grpc.insecure_channel(broker.address)).Status(
            broker_pb2.StatusRequest(), timeout=10).state
        [lease] = [x for x in status.leases if x.holder.client_id.startswith("inference-")]
        nvml = nvml_devices_of(holder.proc.pid)
        record("bf16-off", "lease_on_device_0", int(lease.device_index == 0 and loaded.device_index == 0
                                                    and nvml in ([0], [])), "bool",
               lease_device=lease.device_index, model_device=loaded.device_index, nvml_devices_of_worker=nvml,
               lease_gib=round(lease.memory_bytes / 2**30, 2), device_name=loaded.device_name)

        ports = {"broker": broker.metrics_port, "worker": holder.metrics_port, "router": router.metrics_port}
        scraper = Scraper(ports)
        gen = dict(width=64, height=64, steps=2) if args.tiny else dict(width=1024, height=1024, steps=9,
                                                                         guidance_scale=0.0)
        t = time.perf_counter()
        threads = [threading.Thread(target=lambda: list(stub.Generate(pb.GenerateRequest(
            model_id="z", prompt="a lighthouse at dusk", **gen), timeout=900))) for _ in range(args.gens)]
        for th in threads:  # all at once: the queue fills and the gauges move
            th.start()
        for th in threads:
            th.join()
        record("bf16-off", "generations_s", time.perf_counter() - t, "s", gens=args.gens, **{k: v for k, v in gen.items()})
        scraper.stop()
        for endpoint, peaks in scraper.peak.items():
            for series, value in sorted(peaks.items()):
                if "rpc_calls_total" in series and "Generate" not in series:
                    continue
                record("bf16-off", f"metrics_peak:{endpoint}", value, "", series=series, scrapes=scraper.scrapes)
    finally:
        for proc in reversed(started):
            proc.stop()


if __name__ == "__main__":
    main()
