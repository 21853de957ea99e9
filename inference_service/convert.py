"""Engine values to proto messages. No policy here."""
from __future__ import annotations

from diffusion.v1 import inference_pb2 as pb
from inference_service.engine import GenerationEvent, LoadedModel, LoadEvent
from service_kit.proto_time import duration, timestamp

LOAD_PHASES = {name.removeprefix("LOAD_PHASE_").lower(): value for name, value in pb.LoadPhase.items()}
GEN_PHASES = {name.removeprefix("GENERATION_PHASE_").lower(): value for name, value in pb.GenerationPhase.items()}


def loaded_model(model: LoadedModel) -> pb.LoadedModel:
    plan, limits = model.plan, model.built.limits
    return pb.LoadedModel(
        model_id=model.model_id, family=plan.family.proto, device_name=plan.device,
        device_index=model.device_index, estimated_footprint_bytes=plan.footprint_bytes,
        resolved=[r.to_proto() for r in model.built.resolved], loaded_time=timestamp(model.loaded_at),
        limits=pb.ModelLimits(size_multiple=limits.size_multiple, max_width=limits.max_width,
                              max_height=limits.max_height, max_prompt_tokens=limits.max_prompt_tokens),
        owner=model.owner)


def load_response(event: LoadEvent, sequence: int) -> pb.LoadResponse:
    msg = pb.LoadResponse(sequence=sequence, phase=LOAD_PHASES[event.phase], message=event.message,
                          bytes_done=event.bytes_done, bytes_total=event.bytes_total, elapsed=duration(event.elapsed_s))
    if event.model is not None:
        msg.result.CopyFrom(loaded_model(event.model))
    return msg


def step_progress(report) -> pb.StepProgress:
    return pb.StepProgress(step=report.step, total_steps=report.total, elapsed=duration(report.elapsed_s),
                           eta=duration(report.eta_s))


def generate_response(event: GenerationEvent, generation_id: str, sequence: int) -> pb.GenerateResponse:
    msg = pb.GenerateResponse(sequence=sequence, generation_id=generation_id, phase=GEN_PHASES[event.phase])
    if event.queued_position is not None:
        msg.queued.position = event.queued_position
    elif event.progress is not None:
        msg.progress.CopyFrom(step_progress(event.progress))
    elif event.result is not None:
        r = event.result
        msg.result.images.extend(pb.GeneratedImage(data=i.data, mime_type=i.mime_type, seed=i.seed, width=i.width,
                                                   height=i.height) for i in r.images)
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


