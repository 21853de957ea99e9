"""The two-GPU run: one broker on the host's NVML inventory, two inference workers and one training service;
where the broker places two models, both generating at once, a training job pinned to device 1 beside
inference there, and a whole-device preemption of device 1 that touches no holder of device 0. On a host with
two GPUs:

    python -m benchmarks.multigpu_run --workdir /tmp/mg --out docs/bench/multigpu.jsonl

--tiny: the tiny pipelines on a fake two-device inventory (2x24GiB), a CPU dry run; NVML is not read there, and
the rows that need it say so.

1. placement: Z-Image on worker 0 and FLUX.1-dev on worker 1, no device named; the device each lease names,
   the model's device, and the devices NVML shows each worker's process on.
2. concurrency: --gens generations of each model alone, then of both at once from two threads, as placed:
   images/s of each and of the two together.
3. pinned: Z-Image on device 0 and FLUX.1-dev on device 1 (a model that best fit put elsewhere is loaded again
   with device_index), both at once again; then a bf16 Z-Image LoRA job pinned to device 1 (device_index); once it steps, both models
   generate at once while NVML is sampled; per holder (each worker; the training service with its trainer),
   the devices its processes used and its peak against its lease.
4. preemption: a whole-device Acquire on device 1 at a priority above every holder: which leases the broker
   asked to go and on which device, the seconds to the grant, how the FLUX worker and the job ended, and that
   Z-Image's lease on device 0 is the same lease and still generates.

The last row, `confined`, is 1 when no holder used memory outside its lease's device or above its lease and the
preemption asked only holders of device 1 to go.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import grpc

from benchmarks.bench_record import Recorder, host_description
from benchmarks.nvml_sampler import NvmlSampler, descendants, nvml_reader
from benchmarks.training_bench import ensure_base, make_dataset
from diffusion.v1 import broker_pb2, broker_pb2_grpc
from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as ipb
from diffusion.v1 import inference_pb2_grpc
from diffusion.v1 import training_pb2 as tpb
from diffusion.v1 import training_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service

GiB = 2**30
MODELS = {"z": "zimage", "flux": "flux1"}  # model id -> family; worker i serves the i-th
TOP_PRIORITY = 1000  # above every holder this run starts (they ask at 0)


class Run:
    def __init__(self, args):
        self.args, self.tiny = args, args.tiny
        self.size = 64 if args.tiny else 1024
        self.steps = 2 if args.tiny else 0  # 0: the family's default
        self.record = Recorder("multigpu", args.out, "zimage+flux1",
                               "python -m benchmarks.multigpu_run " + " ".join(sys.argv[1:]), host_description())
        read = None if args.tiny else nvml_reader()
        self.sampler = NvmlSampler(read) if read is not None else None
        self.started = []

    def start(self, module: str, *flags: str):
        proc = start_service(module, *flags, "--log-level", "WARNING", timeout=600)
        self.started.append(proc)
        return proc

    def close(self):
        if self.sampler is not None:
            self.sampler.close()
        for proc in reversed(self.started):
            proc.stop()

    # ---- the broker's view -------------------------------------------------------------------

    def leases(self) -> dict[str, broker_pb2.Lease]:
        """Holder client id -> its lease (one each in this run)."""
        state = self.broker.Status(broker_pb2.StatusRequest(), timeout=10).state
        return {lease.holder.client_id: lease for lease in state.leases}

    def model_device(self, worker: int) -> int:
        status = self.workers[worker].GetInferenceStatus(ipb.GetInferenceStatusRequest(), timeout=10)
        return status.models[0].device_index if status.models else -1

    # ---- inference --------------------------------------------------------------------------

    def load(self, worker: int, model_id: str, device: int | None = None) -> float:
        base = self.bases[MODELS[model_id]]
        req = ipb.LoadRequest(model_id=model_id, source=c.ModelSource(local_dir=str(base)),
                              compute_precision=c.PRECISION_BF16 if not self.tiny else c.PRECISION_UNSPECIFIED,
                              speed_mode=c.SPEED_MODE_OFF)
        if device is not None:
            req.device_index = device
        t0 = time.perf_counter()
        list(self.workers[worker].Load(req, timeout=900))
        return time.perf_counter() - t0

    def generate(self, worker: int, model_id: str, count: int, seed: int = 1) -> float:
        """Seconds for `count` single-image generations, one after another."""
        t0 = time.perf_counter()
        for i in range(count):
            list(self.workers[worker].Generate(ipb.GenerateRequest(
                model_id=model_id, prompt="a lighthouse at dusk", width=self.size, height=self.size, steps=self.steps,
                seeds=[seed + i]), timeout=900))
        return time.perf_counter() - t0

    def both(self, count: int) -> dict[str, float]:
        """Both models generating at once, one thread each: seconds per model."""
        took: dict[str, float] = {}
        errors: list[BaseException] = []

        def one(worker, model_id):
            try:
                took[model_id] = self.generate(worker, model_id, count, seed=100)
            except BaseException as e:  # noqa: BLE001 - said below, in the main thread
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i, m)) for i, m in enumerate(MODELS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return took

    # ---- phases -----------------------------------------------------------------------------

    def placement(self) -> None:
        for worker, model_id in enumerate(MODELS):
            load_s = self.load(worker, model_id)
            lease = self.leases()[f"inference-{worker}"]
            nvml = (self.sampler.devices_of([self.inference[worker].proc.pid]) if self.sampler else "not read")
            self.record(f"placement {model_id}", "lease_device", lease.device_index, "index",
                        lease_gib=round(lease.memory_bytes / GiB, 2), model_device=self.model_device(worker),
                        nvml_devices=nvml, load_s=round(load_s, 1), note="no device named: the broker's best fit")

    def concurrency(self, phase: str) -> None:
        """Each model alone (measured once), then both at once, as the models are placed now."""
        n = self.args.gens
        if not hasattr(self, "alone"):
            for worker, model_id in enumerate(MODELS):
                self.generate(worker, model_id, 1, seed=50)  # untimed: first-call costs
            self.alone = {model_id: self.generate(worker, model_id, n) for worker, model_id in enumerate(MODELS)}
            for model_id in MODELS:
                self.record(f"alone {model_id}", "images_per_s", n / self.alone[model_id], "images/s", images=n)
        devices = {m: self.leases()[f"inference-{i}"].device_index for i, m in enumerate(MODELS)}
        took = self.both(n)
        for model_id in MODELS:
            self.record(f"{phase} {model_id}", "images_per_s", n / took[model_id], "images/s", images=n,
                        vs_alone=round(self.alone[model_id] / took[model_id], 3), device=devices[model_id])
        wall = max(took.values())
        self.record(f"{phase} total", "images_per_s", 2 * n / wall, "images/s", devices=devices,
                    vs_sum_of_alone=round((2 * n / wall) / sum(n / s for s in self.alone.values()), 3))

    def pin(self) -> None:
        """Z-Image on device 0, FLUX.1-dev on device 1."""
        for worker, (model_id, device) in enumerate(zip(MODELS, (0, 1))):
            where = self.leases()[f"inference-{worker}"].device_index
            if where != device:
                load_s = self.load(worker, model_id, device)
                self.record(f"pinned {model_id}", "reloaded_on_device", device, "index", was_on=where,
                            load_s=round(load_s, 1))

    def train_beside_inference(self) -> str:
        req = tpb.StartTrainingRequest(
            family=c.FAMILY_ZIMAGE, base=c.ModelSource(local_dir=str(self.bases["zimage"])),
            dataset=tpb.Dataset(image_dir=str(self.data), instance_prompt="a lighthouse"), rank=16,
            steps=2000 if self.tiny else 4000, resolution=64 if self.tiny else 768, device_index=1, seed=0,
            base_precision=c.PRECISION_UNSPECIFIED if self.tiny else c.PRECISION_BF16)
        job_id = self.trainer.StartTraining(req, timeout=600).job_id
        stepped = threading.Event()
        self.job_events: list[tpb.WatchTrainingResponse] = []

        def watch():
            for event in self.trainer.WatchTraining(tpb.WatchTrainingRequest(job_id=job_id), timeout=1800):
                self.job_events.append(event)
                if event.WhichOneof("event") == "step":
                    stepped.set()
                if event.WhichOneof("event") == "finished":
                    break
            stepped.set()

        self.job_watch = threading.Thread(target=watch, daemon=True)
        self.job_watch.start()
        if not stepped.wait(600):
            raise RuntimeError("the training job did not reach its first step")
        if self.sampler is not None:
            self.sampler.reset()
        t0 = time.perf_counter()
        took = self.both(self.args.gens)
        leases = self.leases()
        holders = {"inference-0": [self.inference[0].proc.pid], "inference-1": [self.inference[1].proc.pid],
                   "training-0": [self.training.proc.pid, *descendants(self.training.proc.pid)]}
        for holder, pids in holders.items():
            lease = leases.get(holder)
            if lease is None:
                self.record(f"beside training {holder}", "leased", 0, "bool", note="no lease while the job ran")
                self.confined = False
                continue
            if self.sampler is None:
                self.record(f"beside training {holder}", "lease_device", lease.device_index, "index",
                            lease_gib=round(lease.memory_bytes / GiB, 2), nvml="not read (no NVML on this host)")
                continue
            devices = self.sampler.devices_of(pids)
            peak = self.sampler.peak(pids, index=lease.device_index)
            outside = [d for d in devices if d != lease.device_index]
            self.confined &= not outside and peak <= lease.memory_bytes
            self.record(f"beside training {holder}", "peak_over_lease", peak / lease.memory_bytes, "ratio",
                        lease_device=lease.device_index, nvml_devices=devices, peak_gib=round(peak / GiB, 2),
                        lease_gib=round(lease.memory_bytes / GiB, 2))
        steps = [e.step for e in self.job_events if e.WhichOneof("event") == "step"]
        for model_id in MODELS:
            self.record(f"beside training {model_id}", "images_per_s", self.args.gens / took[model_id], "images/s",
                        images=self.args.gens)
        self.record("beside training job", "steps_seen", len(steps), "steps", seconds=round(time.perf_counter() - t0, 1),
                    lease_device=leases["training-0"].device_index if "training-0" in leases else -1)
        return job_id

    def preempt_device_1(self, job_id: str) -> None:
        before = self.leases()
        seen: list[broker_pb2.WatchResponse] = []
        watch = self.broker.Watch(broker_pb2.WatchRequest())

        def follow():
            try:
                for item in watch:
                    seen.append(item)
            except grpc.RpcError:  # cancelled at the end of the phase
                pass

        threading.Thread(target=follow, daemon=True).start()
        time.sleep(0.5)
        t0 = time.perf_counter()
        acquire = self.broker.Acquire(broker_pb2.AcquireRequest(
            holder=broker_pb2.Holder(client_id="whole-device-1", purpose="top-priority whole device",
                                     priority=TOP_PRIORITY), device_index=1, memory_bytes=0), timeout=600)
        granted = None
        for event in acquire:
            if event.WhichOneof("event") == "granted":
                granted = event.granted
                break
        grant_s = time.perf_counter() - t0
        asked = [(x.transition.holder.client_id, x.transition.device_index) for x in seen
                 if x.transition.kind == broker_pb2.TRANSITION_KIND_PREEMPT_REQUESTED]
        self.confined &= bool(asked) and all(device == 1 for _, device in asked)
        self.record("preempt device 1", "preempted_holders", len(asked), "holders", holders=sorted(asked),
                    grant_s=round(grant_s, 2), granted_device=granted.device_index if granted else -1,
                    held_before={h: l.device_index for h, l in before.items()})
        self.job_watch.join(120)
        finished = [e.finished for e in self.job_events if e.WhichOneof("event") == "finished"]
        self.record("preempt device 1 job", "ended", 1 if finished else 0, "bool",
                    state=tpb.TrainingJobState.Name(finished[0].state) if finished else "still running",
                    message=finished[0].message[:200] if finished else "")
        flux_loaded = self.model_device(1) >= 0
        z_lease = self.leases().get("inference-0")
        same = z_lease is not None and z_lease.lease_id == before["inference-0"].lease_id
        z_s = self.generate(0, "z", 1, seed=7)
        self.confined &= same and not flux_loaded
        self.record("preempt device 1 after", "z_same_lease", int(same), "bool", z_generate_s=round(z_s, 2),
                    flux_still_loaded=flux_loaded, z_device=z_lease.device_index if z_lease else -1)
        self.broker.Release(broker_pb2.ReleaseRequest(lease_id=granted.lease_id), timeout=10)
        acquire.cancel()
        watch.cancel()

    def main(self) -> None:
        args = self.args
        args.workdir.mkdir(parents=True, exist_ok=True)
        self.bases = {family: ensure_base(args.workdir, family, args.tiny) for family in MODELS.values()}
        self.data = make_dataset(args.workdir / "data", 64 if args.tiny else 768)
        broker = self.start("gpu_broker", *(["--fake-devices", "2x24GiB"] if args.tiny else []))
        flags = ("--broker", broker.address, "--model-root", str(args.workdir))
        self.inference = [self.start("inference_service", *flags, "--client-id", f"inference-{i}") for i in range(2)]
        self.training = self.start("training_service", *flags, "--dataset-root", str(args.workdir), "--output-dir",
                                   str(args.workdir / "out"), "--adapter-store", str(args.workdir / "adapters"))
        channel = lambda proc: grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)  # noqa: E731
        self.broker = broker_pb2_grpc.GpuBrokerServiceStub(channel(broker))
        self.workers = [inference_pb2_grpc.InferenceServiceStub(channel(p)) for p in self.inference]
        self.trainer = training_pb2_grpc.TrainingServiceStub(channel(self.training))
        devices = self.broker.Status(broker_pb2.StatusRequest(), timeout=10).state.devices
        self.record("inventory", "devices", len(devices), "devices",
                    totals_gib=[round(d.total_bytes / GiB, 1) for d in devices])
        if len(devices) < 2:
            raise SystemExit("this run needs two devices in the broker's inventory")
        self.confined = True
        self.placement()
        self.concurrency("together, as placed")
        self.pin()
        self.concurrency("together, one a device")
        job_id = self.train_beside_inference()
        self.preempt_device_1(job_id)
        self.record("confined", "confined", int(self.confined), "bool",
                    note="every holder within its lease and on its lease's device (where NVML was read), and the "
                         "preemption asked only holders of device 1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/multigpu"))
    p.add_argument("--out", type=Path)
    p.add_argument("--gens", type=int, default=3, help="generations per model in each timed phase")
    p.add_argument("--tiny", action="store_true", help="tiny pipelines on a fake two-device inventory (CPU dry run)")
    run = Run(p.parse_args())
    try:
        run.main()
    finally:
        run.close()


if __name__ == "__main__":
    main()
