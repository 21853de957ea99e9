"""How long a training job takes to start its trainer, with the warm trainer and without it.

    python -m benchmarks.trainer_start --workdir /tmp/trainer-start --out docs/bench/trainer_start.jsonl

Starts the training service (no broker) once with --warm-trainer and once with --no-warm-trainer, and in each
runs --jobs one-step jobs on the tiny Z-Image one after another. Records per job the seconds from StartTraining
to its first step (the trainer's start-up: imports, loading the tiny model, one step). The first job of a warm service also pays for the warm trainer's own imports; the later ones are
what the warm trainer saves. Trainer start-up does not depend on the model's size, so the tiny model shows it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import grpc

from benchmarks.bench_record import Recorder, host_description
from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service

def run_jobs(address: str, model_dir: Path, data_dir: Path, jobs: int) -> list[float]:
    with grpc.insecure_channel(address, options=CLIENT_OPTIONS) as channel:
        stub = training_pb2_grpc.TrainingServiceStub(channel)
        out = []
        for i in range(jobs):
            t = time.perf_counter()
            job_id = stub.StartTraining(pb.StartTrainingRequest(
                family=c.FAMILY_ZIMAGE, base=c.ModelSource(local_dir=str(model_dir)),
                dataset=pb.Dataset(image_dir=str(data_dir), instance_prompt="a violet card"), rank=4,
                resolution=64, steps=1, seed=i)).job_id
            first_step = None
            for event in stub.WatchTraining(pb.WatchTrainingRequest(job_id=job_id), timeout=600):
                kind = event.WhichOneof("event")
                if kind == "step" and first_step is None:
                    first_step = time.perf_counter() - t
                if kind == "finished" and event.finished.state != pb.TRAINING_JOB_STATE_SUCCEEDED:
                    raise RuntimeError(f"job {job_id} ended {event.finished}")
            out.append(first_step)
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/trainer-start"))
    p.add_argument("--out", type=Path)
    p.add_argument("--jobs", type=int, default=3)
    args = p.parse_args()
    from demos.tiny_pipelines import save_tiny_pipeline
    from PIL import Image

    model_dir, data_dir = args.workdir / "zimage-tiny", args.workdir / "data"
    if not (model_dir / "model_index.json").exists():
        save_tiny_pipeline("zimage", model_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    for i in range(2):
        Image.new("RGB", (72, 64), (90 * i, 40, 160)).save(data_dir / f"{i}.png")
    record = Recorder("trainer_start", args.out, "zimage-tiny",
                      "python -m benchmarks.trainer_start " + " ".join(sys.argv[1:]), host_description())
    for flag in ("--warm-trainer", "--no-warm-trainer"):
        mode = flag.removeprefix("--")
        service = start_service("training_service", flag, "--model-root", str(args.workdir), "--dataset-root",
                                str(args.workdir), "--output-dir", str(args.workdir / mode), "--adapter-store",
                                str(args.workdir / mode / "adapters"), "--log-level", "WARNING", timeout=600)
        try:
            times = run_jobs(service.address, model_dir, data_dir, args.jobs)
        finally:
            service.stop()
        for i, step in enumerate(times):
            record(mode, "first_step_s", step, "s", job=i + 1)
        if len(times) > 1:
            record(mode, "later_jobs_first_step_median_s", statistics.median(times[1:]), "s", jobs=len(times) - 1)


if __name__ == "__main__":
    main()
