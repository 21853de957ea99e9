"""Protos to typed requests on the way in, engine values to protos on the way out. No policy here."""
from __future__ import annotations

from diffusion.v1 import inference_pb2 as pb
from diffusion_kit import model_sources
from diffusion_kit.families import family_from_proto
from diffusion_kit.precision import Precision
from inference_service import requests as rq
from inference_service.engine import GenerationEvent, LoadedModel, LoadEvent
from service_kit.proto_time import duration, timestamp

IMAGE_FORMATS = {pb.IMAGE_FORMAT_UNSPECIFIED: "png", pb.IMAGE_FORMAT_PNG: "png", pb.IMAGE_FORMAT_WEBP: "webp",
                 pb.IMAGE_FORMAT_JPEG: "jpeg", pb.IMAGE_FORMAT_RAW_RGB8: "raw_rgb8"}
STEP_CACHE_MODES = {pb.STEP_CACHE_MODE_UNSPECIFIED: "off", pb.STEP_CACHE_MODE_OFF: "off",
                    pb.STEP_CACHE_MODE_FIRST_BLOCK: "first_block"}


# ---- in: the edge has already checked sizes and closed every enum ------------------------------

def load_request(msg: pb.LoadRequest) -> rq.LoadRequest:
    return rq.LoadRequest(
        model_id=msg.model_id, source=model_sources.from_proto(msg.source),
        family=family_from_proto(msg.family) if msg.family else None,
        compute_precision=Precision.of_proto(msg.compute_precision),
        transformer_precision=Precision.of_proto(msg.transformer_precision),
        text_encoder_precision=Precision.of_proto(msg.text_encoder_precision),
        memory_mode=msg.memory_mode, speed_mode=msg.speed_mode,
        fp8_fast_accumulate=msg.fp8_fast_accumulate if msg.HasField("fp8_fast_accumulate") else None,
        priority=msg.priority, device_index=msg.device_index if msg.HasField("device_index") else None,
        keep_alive_s=msg.keep_alive.ToNanoseconds() / 1e9 if msg.HasField("keep_alive") else None,
        max_pixels_per_call=msg.max_pixels_per_call)


def generate_request(msg: pb.GenerateRequest) -> rq.GenerateRequest:
    return rq.GenerateRequest(
        model_id=msg.model_id, prompt=msg.prompt, negative_prompt=msg.negative_prompt, width=msg.width,
        height=msg.height, steps=msg.steps,
        guidance_scale=msg.guidance_scale if msg.HasField("guidance_scale") else None,
        seeds=tuple(msg.seeds), num_images=msg.num_images,
        adapters=tuple(rq.AdapterUse(a.adapter_id, a.weight) for a in msg.adapters),
        output_format=IMAGE_FORMATS[msg.output_format],
        encode_quality=msg.encode_quality if msg.HasField("encode_quality") else None,
        generation_id=msg.generation_id,
        step_cache=rq.StepCacheRequest(
            STEP_CACHE_MODES[msg.step_cache.mode],
            msg.step_cache.threshold if msg.step_cache.HasField("threshold") else None)
        if msg.HasField("step_cache") else None)


# ---- out ---------------------------------------------------------------------------------------

LOAD_PHASES = {name.removeprefix("LOAD_PHASE_").lower(): value for name, value in pb.LoadPhase.items()}
GEN_PHASES = {name.removeprefix("GENERATION_PHASE_").lower(): value for name, value in pb.GenerationPhase.items()}


def loaded_model(model: LoadedModel) -> pb.LoadedModel:
    plan, limits = model.plan, model.built.limits
    return pb.LoadedModel(
        model_id=model.model_id, family=plan.family.proto, device_name=plan.device,
        device_index=model.device_index, estimated_footprint_bytes=plan.footprint_bytes,
        resolved=[r.to_proto() for r in model.built.resolved], loaded_time=timestamp(model.loaded_at),
        limits=pb.ModelLimits(size_multiple=limits.size_multiple, max_width=limits.max_width,
                              max_height=limits.max_height, max_prompt_tokens=limits.max_prompt_tokens,
                              max_pixels_per_call=limits.max_pixels_per_call),
        owner=model.owner)


def load_response(event: LoadEvent, sequence: int) -> pb.LoadResponse:
    msg = pb.LoadResponse(sequence=sequence, phase=LOAD_PHASES[event.phase], message=event.message,
                          bytes_done=event.bytes_done, bytes_total=event.bytes_total, elapsed=duration(event.elapsed_s))
    if event.model is not None:
        msg.result.CopyFrom(loaded_model(event.model))
    return msg


def step_progress(report) -> pb.StepProgress:
    return pb.StepProgress(step=report.step, total_steps=report.total, elapsed=duration(report.elapsed_s),
                           eta=duration(report.eta_s), attempt=report.attempt)


def generate_response(event: GenerationEvent, generation_id: str, sequence: int) -> pb.GenerateResponse:
    msg = pb.GenerateResponse(sequence=sequence, generation_id=generation_id, phase=GEN_PHASES[event.phase])
    if event.queued_position is not None:
        msg.queued.position = event.queued_position
    elif event.progress is not None:
        msg.progress.CopyFrom(step_progress(event.progress))
    elif event.image is not None:
        i = event.image
        msg.image.CopyFrom(pb.GeneratedImage(data=i.data, mime_type=i.mime_type, seed=i.seed, width=i.width,
                                             height=i.height))
    elif event.result is not None:
        r = event.result
        msg.result.image_count = r.image_count
        msg.result.timings.CopyFrom(pb.GenerationTimings(
            queued=duration(r.queued_s), encode_prompt=duration(r.encode_prompt_s), denoise=duration(r.denoise_s),
            decode=duration(r.decode_s), encode_images=duration(r.encode_images_s), total=duration(r.total_s)))
        msg.result.resolved.extend(x.to_proto() for x in r.resolved)
        msg.result.peak_memory_bytes = r.peak_memory_bytes
    return msg


def capabilities(caps, families) -> pb.GetCapabilitiesResponse:
    resp = pb.GetCapabilitiesResponse()
    kind = {"cuda": pb.DEVICE_KIND_CUDA, "rocm": pb.DEVICE_KIND_ROCM, "xpu": pb.DEVICE_KIND_XPU,
            "mps": pb.DEVICE_KIND_MPS, "cpu": pb.DEVICE_KIND_CPU}[caps.device_kind]
    resp.devices.add(kind=kind, name=caps.device_name, total_bytes=caps.total_bytes, free_bytes=caps.free_bytes,
                     native_bf16=caps.native_bf16,
                     compute_capability=f"{caps.capability[0]}.{caps.capability[1]}" if caps.capability else "")
    for info in families:
        resp.families.append(info)
    return resp


