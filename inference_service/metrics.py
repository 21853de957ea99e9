"""The inference service's Prometheus figures: the queue, phase latencies, steps and images, loads, the lease
against the device memory this process really holds, preemptions and idle unloads."""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from service_kit.metrics import LATENCY_BUCKETS

QUEUE_DEPTH = Gauge("diffusion_inference_queue_depth", "Generations waiting for the GPU worker")
PHASE_SECONDS = Histogram("diffusion_generation_phase_seconds", "Time in each phase of a generation",
                          ["phase"], buckets=LATENCY_BUCKETS)
STEPS = Counter("diffusion_denoise_steps_total", "Denoising steps run", ["model"])
IMAGES = Counter("diffusion_images_generated_total", "Images delivered", ["model"])
STEP_RATE = Gauge("diffusion_denoise_steps_per_second", "Denoising steps per second of the last generation", ["model"])
IMAGE_RATE = Gauge("diffusion_images_per_second", "Images per second of the last generation, end to end", ["model"])
LOAD_SECONDS = Histogram("diffusion_model_load_seconds", "Time to load a model, request to ready", ["family"],
                         buckets=LATENCY_BUCKETS)
LOADED = Gauge("diffusion_inference_model_loaded", "1 while the model is loaded", ["model"])
LEASED_BYTES = Gauge("diffusion_inference_leased_bytes", "Bytes the loaded model's broker lease holds", ["device"])
DEVICE_USED = Gauge("diffusion_inference_device_used_bytes",
                    "Device memory this process holds (torch's reserved memory; 0 on the CPU)", ["device"])
PROMPT_ENCODINGS = Counter("diffusion_prompt_encodings_total",
                           "Text-encoder calls of generations, by whether a repeated prompt's result was reused",
                           ["model", "outcome"])
MODEL_MOVES = Counter("diffusion_model_moves_total",
                      "Models moved onto the device for a generation (the low_vram tier)", ["model"])
MODEL_MOVE_BYTES = Counter("diffusion_model_move_bytes_total", "Bytes of the models moved onto the device", ["model"])
MODEL_MOVE_SECONDS = Counter("diffusion_model_move_seconds_total",
                             "Seconds spent moving models onto the device", ["model"])
RETRACES = Counter("diffusion_compile_retraces_total",
                   "Generations during which a compiled model traced new graphs (a size its graphs did not cover)",
                   ["model"])
UNLOADS = Counter("diffusion_inference_unloads_total", "Models unloaded, by why", ["reason"])


def watch_queue(length) -> None:
    QUEUE_DEPTH.set_function(length)


def prompt_encodings(model_id: str, reused: int, encoded: int) -> None:
    if reused:
        PROMPT_ENCODINGS.labels(model_id, "reused").inc(reused)
    if encoded:
        PROMPT_ENCODINGS.labels(model_id, "encoded").inc(encoded)


def model_moves(model_id: str, moves) -> None:
    """`moves`: inference_service.pinned_offload.Moves of one generation."""
    if moves.names:
        MODEL_MOVES.labels(model_id).inc(len(moves.names))
        MODEL_MOVE_BYTES.labels(model_id).inc(moves.bytes)
        MODEL_MOVE_SECONDS.labels(model_id).inc(moves.seconds)


def generation_done(model_id: str, result, steps: int) -> None:
    for phase in ("queued", "encode_prompt", "denoise", "decode", "encode_images", "total"):
        PHASE_SECONDS.labels(phase).observe(getattr(result, f"{phase}_s"))
    STEPS.labels(model_id).inc(steps)
    IMAGES.labels(model_id).inc(result.image_count)
    if result.denoise_s > 0:
        STEP_RATE.labels(model_id).set(steps / result.denoise_s)
    if result.total_s > 0:
        IMAGE_RATE.labels(model_id).set(result.image_count / result.total_s)


def model_loaded(model_id: str, family: str, seconds: float, device: str, device_index: int,
                 lease_bytes: int) -> None:
    """`device` is where torch placed it (cuda:N, cpu); `device_index` the broker's device, the label."""
    LOAD_SECONDS.labels(family).observe(seconds)
    LOADED.labels(model_id).set(1)
    index = str(device_index)
    LEASED_BYTES.clear()
    LEASED_BYTES.labels(index).set(lease_bytes)
    DEVICE_USED.clear()
    if device.startswith("cuda"):
        import torch

        DEVICE_USED.labels(index).set_function(lambda: torch.cuda.memory_reserved(device))
    else:
        DEVICE_USED.labels(index).set(0)


def model_unloaded(model_id: str, reason: str) -> None:
    LOADED.labels(model_id).set(0)
    LEASED_BYTES.clear()
    UNLOADS.labels(reason).inc()
