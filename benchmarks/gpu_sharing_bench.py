"""Generate while a training job shares the GPU: inference first, measured. Run on a GPU host.

    python -m benchmarks.gpu_sharing_bench --family zimage --workdir /tmp/b --out docs/bench/gpu_sharing.jsonl

One broker (real NVML inventory), the inference service and the training service under it, and one
random-weight pipeline both use (full size; --tiny for the tiny one, a check of the bench itself). In order:

1. `solo`: the model alone on the GPU: one untimed Generate, then --gens timed ones.
2. `training-solo`: a LoRA job (bf16, eager) alone for --train-window seconds: its step rate.
3. `mixed`: the same job while a Generate is sent every --every seconds for --window seconds: each Generate's
   end-to-end time against solo, and the job's rate over that window against its solo rate. The job yields
   between its steps while the inference service is busy (the broker's SetBusy).
4. `unshared`: a second job with a priority above the inference service's, which the broker does not ask to
   yield, and --gens Generates beside it: what sharing costs a generation without inference first.

Generate times are client-side wall times of the whole stream over loopback gRPC, PNG included.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import grpc

from benchmarks.bench_record import Recorder, host_description
from benchmarks.inference_bench import GEN, MODES as LOAD_MODES, TINY_GEN
from benchmarks.training_bench import FAMILY, MODES as TRAIN_MODES, RESOLUTION, ensure_base, make_dataset
from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as ipb
from diffusion.v1 import inference_pb2_grpc
from diffusion.v1 import training_pb2 as tpb
from diffusion.v1 import training_pb2_grpc
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service


class JobWatch:
    """A training job's step and phase events as they arrive, with the local time each came."""

    def __init__(self, stub, job_id: str):
        self.job_id, self.steps, self.phases = job_id, [], []
        self.first_step = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(stub,), daemon=True)
        self._thread.start()

    def _watch(self, stub) -> None:
        try:
            for event in stub.WatchTraining(tpb.WatchTrainingRequest(job_id=self.job_id)):
                kind = event.WhichOneof("event")
                if kind == "step":
                    self.steps.append((time.perf_counter(), event.step))
                    self.first_step.set()
                elif kind == "phase":
                    self.phases.append((time.perf_counter(), event.phase))
                elif kind == "finished":
                    self.finished = event.finished
                    return
        except grpc.RpcError:
            return

    def rate(self, t0: float, t1: float) -> float:
        """Steps per second that finished between t0 and t1."""
        return sum(1 for t, _ in self.steps if t0 <= t < t1) / (t1 - t0)

    def yielded_between(self, t0: float, t1: float) -> float:
        """Seconds the job said it yielded in the steps that finished between t0 and t1 (a step's `yielded` is the
        job's total so far)."""
        before = [s.yielded.ToNanoseconds() for t, s in self.steps if t < t0]
        upto = [s.yielded.ToNanoseconds() for t, s in self.steps if t < t1]
        return ((upto[-1] if upto else 0) - (before[-1] if before else 0)) / 1e9


def generate_once(stub, model_id: str, fields: dict, seed: int) -> tuple[float, ipb.GenerationResult]:
    t0 = time.perf_counter()
    result = None
    for event in stub.Generate(ipb.GenerateRequest(model_id=model_id, prompt="a lighthouse at dusk", seeds=[seed],
                                                   **fields), timeout=300):
        if event.WhichOneof("event") == "result":
            result = event.result
    return time.perf_counter() - t0, result


def start_job(stub, family: str, base_dir: Path, data_dir: Path, resolution: int, priority: int, tag: str,
              precision: str) -> str:
    req = tpb.StartTrainingRequest(family=FAMILY[family], base=c.ModelSource(local_dir=str(base_dir)),
                                   dataset=tpb.Dataset(image_dir=str(data_dir)), rank=16, steps=100000,
                                   resolution=resolution, seed=0, priority=priority,
                                   adapter_id=f"sharing-{tag}-{int(time.time())}",
                                   **TRAIN_MODES[precision])
    return stub.StartTraining(req, timeout=60).job_id


def stop_job(stub, watch: JobWatch) -> None:
    stub.StopTraining(tpb.StopTrainingRequest(job_id=watch.job_id, mode=tpb.STOP_MODE_DISCARD), timeout=30)
    watch._thread.join(120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=["zimage", "flux1"], default="zimage")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/sharing-bench"))
    p.add_argument("--out", type=Path)
    p.add_argument("--load-mode", default="bf16-off", choices=sorted(LOAD_MODES))
    p.add_argument("--gens", type=int, default=4)
    p.add_argument("--train-window", type=float, default=20.0)
    p.add_argument("--window", type=float, default=60.0)
    p.add_argument("--every", type=float, default=6.0)
    p.add_argument("--busy-linger", type=float, default=0.5)
    p.add_argument("--tiny", action="store_true")
    args = p.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    record = Recorder("gpu-sharing", args.out, args.family, "python -m benchmarks.gpu_sharing_bench " +
                      " ".join(sys.argv[1:]), host_description())
    base_dir = ensure_base(args.workdir, args.family, args.tiny)
    resolution = 64 if args.tiny else RESOLUTION[args.family]
    data_dir = make_dataset(args.workdir / f"data-{resolution}", resolution)
    gen_fields = TINY_GEN if args.tiny else GEN[args.family]

    import torch

    gpu = torch.cuda.is_available()
    inventory = [] if gpu else ["--fake-devices", "1x64GiB"]
    precision = "bf16" if gpu else "fp32"  # fp32: the CPU's, a check of the bench itself
    broker = start_service("gpu_broker", "--log-level", "WARNING", *inventory)
    roots = ("--model-root", str(args.workdir))
    services = [broker]
    try:
        inference = start_service("inference_service", "--broker", broker.address, "--busy-linger",
                                  str(args.busy_linger), "--log-level", "WARNING", *roots,
                                  *(("--quant-min-features", "16", "--warmup-resolution", "64") if args.tiny else ()),
                                  timeout=600)
        services.append(inference)
        training = start_service("training_service", "--broker", broker.address, "--log-level", "WARNING",
                                 "--output-dir", str(args.workdir / "out"), "--adapter-store",
                                 str(args.workdir / "adapters"), *roots, "--dataset-root", str(args.workdir),
                                 timeout=300)
        services.append(training)
        ich = grpc.insecure_channel(inference.address, options=CLIENT_OPTIONS)
        tch = grpc.insecure_channel(training.address, options=CLIENT_OPTIONS)
        infer, train = inference_pb2_grpc.InferenceServiceStub(ich), training_pb2_grpc.TrainingServiceStub(tch)
        for _ in infer.Load(ipb.LoadRequest(model_id="m", source=c.ModelSource(local_dir=str(base_dir)), priority=0,
                                            **LOAD_MODES[args.load_mode]), timeout=900):
            pass
        load = f"{args.load_mode}, {gen_fields['width']}x{gen_fields['height']}, {gen_fields['steps']} steps"

        generate_once(infer, "m", gen_fields, 0)  # untimed: first-call work
        solo = [generate_once(infer, "m", gen_fields, i)[0] for i in range(args.gens)]
        solo_ms = statistics.median(solo) * 1e3
        record("solo", "generate_e2e_ms", solo_ms, "ms", runs=[round(x * 1e3, 1) for x in solo], load=load)

        watch = JobWatch(train, start_job(train, args.family, base_dir, data_dir, resolution, 0, "shared", precision))
        assert watch.first_step.wait(600), "the training job never stepped"
        time.sleep(3)  # past the first steps' warm-up
        t0 = time.perf_counter()
        time.sleep(args.train_window)
        solo_rate = watch.rate(t0, time.perf_counter())
        record("training-solo", "steps_per_s", solo_rate, "steps/s", resolution=resolution, precision=f"{precision} eager")

        mixed, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < args.window:
            sent = time.perf_counter()
            mixed.append(generate_once(infer, "m", gen_fields, 100 + len(mixed)))
            time.sleep(max(0.0, args.every - (time.perf_counter() - sent)))
        t1 = time.perf_counter()
        mixed_ms = statistics.median(m[0] for m in mixed) * 1e3
        sharing = [r.applied for r in mixed[-1][1].resolved if r.control == "gpu_sharing"]
        record("mixed", "generate_e2e_ms", mixed_ms, "ms", runs=[round(m[0] * 1e3, 1) for m in mixed],
               every_s=args.every, gpu_sharing=sharing)
        record("mixed", "generate_vs_solo", mixed_ms / solo_ms, "x", target="<= 1.15")
        rate = watch.rate(t0, t1)
        record("mixed", "training_steps_per_s", rate, "steps/s", window_s=round(t1 - t0, 1))
        record("mixed", "training_share_of_solo", rate / solo_rate, "fraction", target=">= 0.60",
               yielded_s=round(watch.yielded_between(t0, t1 + 5), 2))
        stop_job(train, watch)

        # what sharing costs without inference first: a job the broker does not ask to yield
        watch = JobWatch(train, start_job(train, args.family, base_dir, data_dir, resolution, 1, "unshared", precision))
        assert watch.first_step.wait(600), "the training job never stepped"
        time.sleep(3)
        unshared = [generate_once(infer, "m", gen_fields, 200 + i)[0] for i in range(args.gens)]
        unshared_ms = statistics.median(unshared) * 1e3
        record("unshared", "generate_e2e_ms", unshared_ms, "ms", runs=[round(x * 1e3, 1) for x in unshared],
               note="the training job's priority (1) is above the inference service's (0): it does not yield")
        record("unshared", "generate_vs_solo", unshared_ms / solo_ms, "x")
        stop_job(train, watch)
        ich.close()
        tch.close()
    finally:
        for service in reversed(services):
            service.stop()


if __name__ == "__main__":
    main()
