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

from diffusion.v1 import common_pb2
from diffusion.v1 import inference_pb2 as pb
from diffusion.v1 import training_pb2 as tpb
from diffusion_client import Broker, Inference, Training
from service_kit.units import format_bytes
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


def train_an_adapter(training: Training, inference: Inference, model_dir: Path, prompt: str) -> str:
    """Makes a small dataset with the model itself, trains a LoRA for a few steps, returns the adapter id."""
    data = OUT / "dataset"
    for seed in (1, 2, 3):
        (image,) = inference.generate("demo-zimage", "a lighthouse", width=128, height=128, steps=4,
                                      seeds=[seed]).images
        data.mkdir(parents=True, exist_ok=True)
        (data / f"lighthouse-{seed}.png").write_bytes(image.data)
        (data / f"lighthouse-{seed}.txt").write_text("a lighthouse, sks style")
    print(f"\nTrain: a LoRA on {data.relative_to(ROOT)} (3 images the model just made), 12 steps, rank 8")
    adapter_id = f"demo-lighthouse-{int(time.time())}"
    job = training.start("zimage", str(model_dir), str(data), rank=8, steps=12, resolution=128, learning_rate=1e-3,
                         seed=0, priority=1, adapter_id=adapter_id)
    for ev in training.watch(job.job_id):
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
        with Inference(inference.address) as infer, Training(training.address) as train:
            gpu = Broker(broker.address)
            print("Load:")
            model = infer.load_model("demo-zimage", str(model_dir), priority=5, on_event=lambda ev: print(
                f"  {pb.LoadPhase.Name(ev.phase).removeprefix('LOAD_PHASE_'):<16} "
                f"{ev.elapsed.ToNanoseconds() / 1e6:7.1f} ms  {ev.message}"))
            print(f"  loaded {model.model_id} on device {model.device_index}")
            prompt = "a lighthouse at dusk, oil painting"
            print("\nGenerate:")
            bar = tqdm(total=12, unit="step", ncols=72)
            generation = infer.generate("demo-zimage", prompt, width=128, height=128, steps=12, seeds=[42],
                                        on_event=lambda ev: ev.WhichOneof("event") == "progress"
                                        and bar.update(ev.progress.step - bar.n))
            bar.close()
            image = generation.images[0]
            path = OUT / "demo-zimage-seed42.png"
            path.write_bytes(image.data)
            t = generation.timings
            print(f"  wrote {path.relative_to(ROOT)} ({len(image.data)} bytes, {image.width}x{image.height}, "
                  f"seed {image.seed})")
            ms = lambda d: f"{d.ToNanoseconds() / 1e6:.1f} ms"  # noqa: E731
            print(f"  timings: queued {ms(t.queued)}, prompt {ms(t.encode_prompt)}, denoise {ms(t.denoise)}, "
                  f"decode {ms(t.decode)}, encode {ms(t.encode_images)}, total {ms(t.total)}")
            print("\nResolved settings:")
            for r in generation.resolved:
                why = f"  ({r.reason})" if r.reason else ""
                print(f"  {r.control:<28} {r.requested or '-':<26} -> {r.applied:<26} {STATUS[r.status]}{why}")
            adapter_id = train_an_adapter(train, infer, model_dir, prompt)
            styled = infer.generate("demo-zimage", prompt, width=128, height=128, steps=12, seeds=[42],
                                    adapters=[(adapter_id, 1.0)]).images[0]
            path = OUT / "demo-zimage-seed42-lora.png"
            path.write_bytes(styled.data)
            print(f"  generated with the new adapter: {path.relative_to(ROOT)} "
                  f"({'differs from' if styled.data != image.data else 'SAME AS'} the base image)")
            print("\nBroker leases now:")
            for lease in gpu.status().leases:
                print(f"  {lease.lease_id} {lease.holder.client_id} device {lease.device_index} "
                      f"{format_bytes(lease.memory_bytes) if lease.memory_bytes else 'whole device'} "
                      f"({lease.holder.purpose})")
            infer.unload("demo-zimage")  # the trainer's lease went back before its job was recorded finished
            print(f"  after Unload: {len(gpu.status().leases)} leases")
            gpu.close()
    finally:
        training.stop()
        inference.stop()
        broker.stop()
    print("\nOK: broker, inference and training services stopped.")
    print("Next, the command line against services you start yourself: see the README's 'Command line'.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
