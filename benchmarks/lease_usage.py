"""What each holder really uses on the GPU, against its broker lease. Run on a GPU host.

    python -m benchmarks.lease_usage --family zimage --workdir /tmp/bench --out docs/bench/lease_usage.jsonl

Starts a broker on the real NVML inventory, the inference and the training service under it, and for
each mode loads (or trains) a full-size random-weight model while a thread samples NVML every 50 ms:
the memory of every process on the device, and the device's used memory. Per mode it records the
peak of each service process (the inference service, the training service's parent, the trainer
child) against the bytes its lease holds, and the ratio; the promise is that no ratio exceeds 1.0.
Also the memory each service process holds with no lease at all (its CUDA context, if any).

An inference mode may name the images of its one Generate: `bf16-off@2048x2048` loads with room for one
2048x2048 image (`max_pixels_per_call`) and generates it; `bf16-off@1024x1024:4` loads with room for four and
generates them in one call. Plain modes generate one 1024x1024 image under the family's default room.

    python -m benchmarks.lease_usage --family zimage --workdir /tmp/lu --training-modes '' \
        --inference-modes bf16-off@2048x2048,bf16-off@1024x1024:4,fp8-default@1024x1024:4
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import grpc

from benchmarks.bench_record import Recorder, host_description
from benchmarks import inference_bench, training_bench
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

# The modes of the two benches, so every mode they time is also checked against its lease.
INFERENCE_MODES = inference_bench.MODES
TRAINING_MODES = {k: v for k, v in training_bench.MODES.items() if k != "fp32" and not k.endswith("-warm")}


def images_of(mode: str) -> tuple[str, int, int, int]:
    """(mode, width, height, images) of NAME[@WxH[:N]]; 0 images: one image under the family's default room."""
    name, _, shape = mode.partition("@")
    if not shape:
        return name, 1024, 1024, 0
    size, _, count = shape.partition(":")
    width, height = map(int, size.lower().split("x"))
    return name, width, height, int(count or 1)


def lease_bytes(broker, client_id: str) -> int:
    state = broker.Status(broker_pb2.StatusRequest(), timeout=10).state
    return sum(x.memory_bytes for x in state.leases if x.holder.client_id == client_id)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="zimage")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/lease-usage"))
    p.add_argument("--out", type=Path)
    p.add_argument("--inference-modes", default=",".join(INFERENCE_MODES),
                   help="comma-separated NAME[@WxH[:N]]; empty for none")
    p.add_argument("--training-modes", default=",".join(TRAINING_MODES), help="comma-separated; empty for none")
    p.add_argument("--deadline-s", type=float, default=1e9, help="stop starting modes after this many seconds")
    args = p.parse_args()
    started = time.monotonic()
    args.workdir.mkdir(parents=True, exist_ok=True)
    base = ensure_base(args.workdir, args.family, tiny=False)
    resolution = 768 if args.family in ("zimage", "qwen_image") else 512
    data = make_dataset(args.workdir / f"data-{resolution}", resolution)
    record = Recorder("lease-usage", args.out, args.family,
                      "python -m benchmarks.lease_usage " + " ".join(sys.argv[1:]), host_description())
    read = nvml_reader()
    if read is None:
        raise SystemExit("lease_usage reads NVML: run it on a GPU host")
    sampler = NvmlSampler(read)
    baseline = sampler.device_used()
    broker_proc = start_service("gpu_broker", "--log-level", "WARNING")
    flags = ("--broker", broker_proc.address, "--log-level", "WARNING", "--model-root", str(args.workdir))
    inference = start_service("inference_service", *flags, "--compile-cache-dir", str(args.workdir / "inductor"),
                              timeout=600)
    training = start_service("training_service", *flags, "--dataset-root", str(args.workdir),
                             "--output-dir", str(args.workdir / "out"), "--adapter-store",
                             str(args.workdir / "adapters"), timeout=600)
    broker = broker_pb2_grpc.GpuBrokerServiceStub(grpc.insecure_channel(broker_proc.address, options=CLIENT_OPTIONS))
    infer = inference_pb2_grpc.InferenceServiceStub(grpc.insecure_channel(inference.address, options=CLIENT_OPTIONS))
    train = training_pb2_grpc.TrainingServiceStub(grpc.insecure_channel(training.address, options=CLIENT_OPTIONS))
    try:
        time.sleep(1.0)
        idle = sampler.now()
        record("idle", "unleased_bytes", sum(idle.get(x, 0) for x in (inference.proc.pid, training.proc.pid)) / GiB,
               "GiB", inference_service=idle.get(inference.proc.pid, 0) / GiB,
               training_service=idle.get(training.proc.pid, 0) / GiB,
               device_used_over_baseline=(sampler.device_used() - baseline) / GiB,
               note="what the service processes hold on the device with no lease (CUDA contexts)")
        for mode in filter(None, args.inference_modes.split(",")):
            if time.monotonic() - started > args.deadline_s:
                break
            sampler.reset()
            name, width, height, images = images_of(mode)
            model_id = mode.replace("@", "-").replace(":", "-")
            room = {"max_pixels_per_call": width * height * images} if images else {}
            req = ipb.LoadRequest(model_id=model_id, source=c.ModelSource(local_dir=str(base)),
                                  **INFERENCE_MODES[name], **room)
            try:
                list(infer.Load(req, timeout=900))
                lease = lease_bytes(broker, "inference-0")
                list(infer.Generate(ipb.GenerateRequest(model_id=model_id, prompt="a lighthouse at dusk", width=width,
                                                        height=height, steps=4, seeds=range(1, 1 + max(1, images))),
                                    timeout=900))
            except grpc.RpcError as e:
                record(f"inference {mode}", "ran", 0, "bool", detail=f"{e.code().name}: {e.details()}")
                continue
            used = sampler.peak([inference.proc.pid])
            record(f"inference {mode}", "usage_over_lease", used / lease if lease else float("inf"), "ratio",
                   used_gib=round(used / GiB, 2), lease_gib=round(lease / GiB, 2),
                   device_peak_over_baseline_gib=round((sampler.device_peak() - baseline) / GiB, 2))
            infer.Unload(ipb.UnloadRequest(model_id=model_id), timeout=300)
        after = sampler.now()
        record("after inference", "unleased_bytes", after.get(inference.proc.pid, 0) / GiB, "GiB",
               note="the inference service with no model loaded and no lease: its CUDA context (and cached blocks), "
                    "which the broker's --context-reserve sets aside")
        seen_children: set[int] = set()
        for mode in filter(None, args.training_modes.split(",")):
            if time.monotonic() - started > args.deadline_s:
                break
            sampler.reset()
            req = tpb.StartTrainingRequest(
                family=c.Family.Value(f"FAMILY_{args.family.upper()}"), base=c.ModelSource(local_dir=str(base)),
                dataset=tpb.Dataset(image_dir=str(data), instance_prompt="a lighthouse"),
                rank=16, steps=6, resolution=resolution, **TRAINING_MODES[mode])
            try:
                job = train.StartTraining(req, timeout=600).job_id
                lease, child_pids = 0, set()
                for event in train.WatchTraining(tpb.WatchTrainingRequest(job_id=job), timeout=1800):
                    lease = lease or lease_bytes(broker, "training-0")
                    child_pids.update(set(descendants(training.proc.pid)) - seen_children)
                    if event.WhichOneof("event") == "finished":
                        finished = event.finished
                        break
                seen_children.update(child_pids)
                deadline = time.monotonic() + 120  # the next mode starts once this job's child is gone and its
                while lease_bytes(broker, "training-0") and time.monotonic() < deadline:  # lease given back
                    time.sleep(0.2)
            except grpc.RpcError as e:
                record(f"training {mode}", "ran", 0, "bool", detail=f"{e.code().name}: {e.details()}")
                continue
            if finished.state != tpb.TRAINING_JOB_STATE_SUCCEEDED:
                record(f"training {mode}", "ran", 0, "bool", detail=finished.message[:300])
                continue
            used = sampler.peak([training.proc.pid, *child_pids])
            record(f"training {mode}", "usage_over_lease", used / lease if lease else float("inf"), "ratio",
                   used_gib=round(used / GiB, 2), lease_gib=round(lease / GiB, 2),
                   parent_gib=round(sampler.peak([training.proc.pid]) / GiB, 2),
                   device_peak_over_baseline_gib=round((sampler.device_peak() - baseline) / GiB, 2))
    finally:
        sampler.close()
        for proc in (training, inference, broker_proc):
            proc.stop()
    print(f"done in {time.monotonic() - started:.0f}s; pid namespace {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
