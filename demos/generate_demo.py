"""`make demo`: broker, inference and training on loopback, a locally built model, images and a LoRA over gRPC.

Builds a tiny random-weight Z-Image pipeline in code (no download), starts a broker with a
fake one-device inventory and the inference service under it, loads the model (streaming
its phases), generates with a progress bar, writes the PNG, prints the resolved settings, trains a
LoRA for a few steps on images the model itself just made, generates again with the new adapter,
shows the broker's leases, then stops everything it started.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import grpc

from diffusion.v1 import broker_pb2, broker_pb2_grpc, common_pb2
from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import inference_pb2_grpc
from service_kit.units import format_bytes
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import ROOT, start_service

OUT = ROOT / "demo-output"
STATUS = {common_pb2.SETTING_STATUS_APPLIED: "applied", common_pb2.SETTING_STATUS_FELL_BACK: "FELL BACK",
          common_pb2.SETTING_STATUS_UNSUPPORTED: "unsupported"}


def build_model() -> Path:
    from demos.tiny_pipelines import save_tiny_pipeline

    target = OUT / "models" / "tiny-zimage"
    if not (target / "model_index.json").exists():
        print(f"Building a tiny random-weight Z-Image pipeline in {target} (no download)...")
        save_tiny_pipeline("zimage", target)
    return target


def train_an_adapter(address: str, model_dir: Path, stub, request: pb.GenerateRequest) -> str:
    """Makes a small dataset with the model itself, trains a LoRA for a few steps, returns the adapter id."""
    from diffusion.v1 import training_pb2 as tpb
    from diffusion.v1 import training_pb2_grpc

    data = OUT / "dataset"
    data.mkdir(parents=True, exist_ok=True)
    for seed in (1, 2, 3):
        result = list(stub.Generate(pb.GenerateRequest(model_id="demo-zimage", prompt="a lighthouse", width=128,
                                                       height=128, steps=4, seeds=[seed])))[-1].result
        (data / f"lighthouse-{seed}.png").write_bytes(result.images[0].data)
        (data / f"lighthouse-{seed}.txt").write_text("a lighthouse, sks style")
    print(f"\nTrain: a LoRA on {data.relative_to(ROOT)} (3 images the model just made), 12 steps, rank 8")
    adapter_id = f"demo-lighthouse-{int(time.time())}"
    with grpc.insecure_channel(address, options=CLIENT_OPTIONS) as channel:
        tstub = training_pb2_grpc.TrainingServiceStub(channel)
        job = tstub.StartTraining(tpb.StartTrainingRequest(
            family=common_pb2.FAMILY_ZIMAGE, base=common_pb2.ModelSource(local_dir=str(model_dir)),
            dataset=tpb.Dataset(image_dir=str(data)), rank=8, steps=12, resolution=128, learning_rate=1e-3,
            seed=0, priority=1, adapter_id=adapter_id))
        for ev in tstub.WatchTraining(tpb.WatchTrainingRequest(job_id=job.job_id)):
            kind = ev.WhichOneof("event")
            if kind == "step" and ev.step.step % 4 == 0:
                print(f"  step {ev.step.step:>2}/{ev.step.total_steps}  loss {ev.step.loss:.4f}  "
                      f"lr {ev.step.learning_rate:.1e}  grad norm {ev.step.grad_norm:.3f}")
            elif kind == "phase":
                print(f"  phase {tpb.TrainingPhase.Name(ev.phase.phase).removeprefix('TRAINING_PHASE_').lower()}")
            elif kind == "finished":
                print(f"  job {job.job_id}: {tpb.TrainingJobState.Name(ev.finished.state)}, adapter "
                      f"{ev.finished.adapter_id} published")
    return adapter_id


def main() -> int:
    from tqdm import tqdm

    model_dir = build_model()
    print("Starting the GPU broker (fake inventory 1x24GiB) and the inference service on loopback...")
    broker = start_service("gpu_broker", "--fake-devices", "1x24GiB")
    # The services read models and datasets only under the roots they are given: here the demo's own folders.
    inference = start_service("inference_service", "--broker", broker.address, "--compile-backend", "aot_eager",
                              "--adapter-store", str(OUT / "adapters"), "--model-root", str(OUT / "models"),
                              timeout=180)
    training = start_service("training_service", "--broker", broker.address, "--output-dir", str(OUT / "training"),
                             "--adapter-store", str(OUT / "adapters"), "--model-root", str(OUT / "models"),
                             "--dataset-root", str(OUT / "dataset"), timeout=180)
    print(f"  broker {broker.address}, inference {inference.address}, training {training.address}\n")
    try:
        with grpc.insecure_channel(inference.address, options=CLIENT_OPTIONS) as ch, \
                grpc.insecure_channel(broker.address, options=CLIENT_OPTIONS) as bch:
            stub = inference_pb2_grpc.InferenceServiceStub(ch)
            broker_stub = broker_pb2_grpc.GpuBrokerServiceStub(bch)
            print("Load:")
            for ev in stub.Load(pb.LoadRequest(model_id="demo-zimage", priority=5,
                                               source=common_pb2.ModelSource(local_dir=str(model_dir)))):
                print(f"  {pb.LoadPhase.Name(ev.phase).removeprefix('LOAD_PHASE_'):<16} "
                      f"{ev.elapsed.ToNanoseconds() / 1e6:7.1f} ms  {ev.message}")
            request = pb.GenerateRequest(model_id="demo-zimage", prompt="a lighthouse at dusk, oil painting",
                                         width=128, height=128, steps=12, seeds=[42])
            print("\nGenerate:")
            bar = tqdm(total=request.steps, unit="step", ncols=72)
            for ev in stub.Generate(request):
                if ev.WhichOneof("event") == "progress":
                    bar.update(ev.progress.step - bar.n)
                elif ev.WhichOneof("event") == "result":
                    result = ev.result
            bar.close()
            image = result.images[0]
            path = OUT / "demo-zimage-seed42.png"
            path.write_bytes(image.data)
            t = result.timings
            print(f"  wrote {path.relative_to(ROOT)} ({len(image.data)} bytes, {image.width}x{image.height}, "
                  f"seed {image.seed})")
            print(f"  timings: queued {t.queued.ToNanoseconds() / 1e6:.1f} ms, prompt {t.encode_prompt.ToNanoseconds() / 1e6:.1f} ms, "
                  f"denoise {t.denoise.ToNanoseconds() / 1e6:.1f} ms, decode {t.decode.ToNanoseconds() / 1e6:.1f} ms, "
                  f"encode {t.encode_images.ToNanoseconds() / 1e6:.1f} ms, total {t.total.ToNanoseconds() / 1e6:.1f} ms")
            print("\nResolved settings:")
            for r in result.resolved:
                why = f"  ({r.reason})" if r.reason else ""
                print(f"  {r.control:<28} {r.requested or '-':<26} -> {r.applied:<26} {STATUS[r.status]}{why}")
            adapter_id = train_an_adapter(training.address, model_dir, stub, request)
            styled = [ev for ev in stub.Generate(pb.GenerateRequest(
                model_id="demo-zimage", prompt=request.prompt, width=128, height=128, steps=12, seeds=[42],
                adapters=[pb.AdapterRef(adapter_id=adapter_id, weight=1.0)]))][-1].result
            path = OUT / "demo-zimage-seed42-lora.png"
            path.write_bytes(styled.images[0].data)
            print(f"  generated with the new adapter: {path.relative_to(ROOT)} "
                  f"({'differs from' if styled.images[0].data != image.data else 'SAME AS'} the base image)")
            state = broker_stub.Status(broker_pb2.StatusRequest()).state
            print("\nBroker leases now:")
            for lease in state.leases:
                print(f"  {lease.lease_id} {lease.holder.client_id} device {lease.device_index} "
                      f"{format_bytes(lease.memory_bytes) if lease.memory_bytes else 'whole device'} "
                      f"({lease.holder.purpose})")
            stub.Unload(pb.UnloadRequest(model_id="demo-zimage"))
            deadline = time.monotonic() + 10  # the trainer's lease goes back when its child process has exited
            while broker_stub.Status(broker_pb2.StatusRequest()).state.leases and time.monotonic() < deadline:
                time.sleep(0.1)
            print(f"  after Unload and the trainer's exit: "
                  f"{len(broker_stub.Status(broker_pb2.StatusRequest()).state.leases)} leases")
    finally:
        training.stop()
        inference.stop()
        broker.stop()
    print("\nOK: broker, inference and training services stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
