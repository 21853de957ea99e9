"""The StartTraining proto to a typed request on the way in; stored job events and records to protos on the
way out. No policy here."""
from __future__ import annotations

from google.protobuf import json_format

from diffusion.v1 import common_pb2
from diffusion.v1 import training_pb2 as pb
from diffusion_kit import model_sources
from diffusion_kit.families import FAMILIES, family_from_proto
from diffusion_kit.precision import Precision
from service_kit.proto_time import duration, timestamp
from training_service.job_store import JobRecord
from training_service.requests import StartTraining

PHASES = {n.removeprefix("TRAINING_PHASE_").lower(): v for n, v in pb.TrainingPhase.items()}
STATES = {n.removeprefix("TRAINING_JOB_STATE_"): v for n, v in pb.TrainingJobState.items()}


def start_training(msg: pb.StartTrainingRequest) -> StartTraining:
    return StartTraining(
        family=family_from_proto(msg.family) if msg.family else None, base=model_sources.from_proto(msg.base),
        image_dir=msg.dataset.image_dir, instance_prompt=msg.dataset.instance_prompt,
        aspect_ratio_buckets=msg.dataset.aspect_ratio_buckets, base_precision=Precision.of_proto(msg.base_precision),
        rank=msg.rank, alpha=msg.alpha if msg.HasField("alpha") else None,
        learning_rate=msg.learning_rate if msg.HasField("learning_rate") else None, steps=msg.steps,
        batch_size=msg.batch_size, gradient_accumulation_steps=msg.gradient_accumulation_steps,
        resolution=msg.resolution, optimizer=msg.optimizer, lr_schedule=msg.lr_schedule, speed_mode=msg.speed_mode,
        warmup_steps=msg.warmup_steps, gradient_checkpointing=msg.gradient_checkpointing,
        gradient_checkpointing_interval=msg.gradient_checkpointing_interval, seed=msg.seed,
        checkpoint_every=msg.checkpoint_every, sample_every=msg.sample_every,
        sample_prompts=tuple(msg.sample_prompts), adapter_id=msg.adapter_id, trigger_words=tuple(msg.trigger_words),
        resume_job_id=msg.resume_job_id, priority=msg.priority,
        device_index=msg.device_index if msg.HasField("device_index") else None,
        as_sent=json_format.MessageToJson(msg))


def watch_response(job_id: str, event: dict) -> pb.WatchTrainingResponse:
    msg = pb.WatchTrainingResponse(sequence=event["sequence"], job_id=job_id)
    msg.time.CopyFrom(timestamp(event["time"]))
    kind, data = event["kind"], event["data"]
    if kind == "resolved":
        msg.resolved.resolved.extend(json_format.ParseDict(r, common_pb2.ResolvedSetting()) for r in data["resolved"])
    elif kind == "phase":
        msg.phase.phase = PHASES.get(data["phase"], pb.TRAINING_PHASE_UNSPECIFIED)
        msg.phase.message = data.get("message", "")
    elif kind == "step":
        step = msg.step
        step.step, step.total_steps, step.loss, step.avg_loss = data["step"], data["total"], data["loss"], data["avg_loss"]
        step.learning_rate, step.grad_norm = data["lr"], data["grad_norm"]
        step.samples_per_second, step.peak_memory_bytes = data["samples_per_s"], data["peak_memory_bytes"]
        step.elapsed.CopyFrom(duration(data.get("elapsed_s", 0)))
        step.eta.CopyFrom(duration(data.get("eta_s", 0)))
        step.yielded.CopyFrom(duration(data.get("yielded_s", 0)))
        step.peak_reserved_bytes = data.get("peak_reserved_bytes", 0)  # absent from jobs logged before it existed
    elif kind == "sample":
        msg.sample.step, msg.sample.prompt = data["step"], data["prompt"]
        msg.sample.png = _read(data["path"])
    elif kind == "warning":
        msg.warning.reason, msg.warning.message = data["reason"], data["message"]
    elif kind == "checkpoint":
        msg.checkpoint.step, msg.checkpoint.path = data["step"], data["path"]
    elif kind == "finished":
        msg.finished.state = STATES[data["state"]]
        msg.finished.steps_completed = data["steps_completed"]
        msg.finished.adapter_id = data.get("adapter_id", "")
        msg.finished.message = data.get("message", "")
    return msg


def _read(path: str) -> bytes:
    """A sample's PNG lives in the job folder; the event log keeps only its path."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def adapter(info) -> pb.Adapter:
    msg = pb.Adapter(adapter_id=info.adapter_id, family=FAMILIES[info.family].proto, base=info.base, rank=info.rank,
                     alpha=info.alpha, steps=info.steps, resolution=info.resolution,
                     trigger_words=list(info.trigger_words), job_id=info.job_id, size_bytes=info.size_bytes,
                     owner=info.owner)
    msg.create_time.CopyFrom(timestamp(info.created))
    return msg


def job(record: JobRecord) -> pb.TrainingJob:
    msg = pb.TrainingJob(job_id=record.job_id, state=STATES[record.state], family=FAMILIES[record.family].proto,
                         steps_completed=record.steps_completed, total_steps=record.total_steps,
                         last_sequence=record.last_sequence, adapter_id=record.adapter_id, error=record.error,
                         owner=record.owner)
    json_format.Parse(record.request_json, msg.request)
    msg.create_time.CopyFrom(timestamp(record.created))
    msg.update_time.CopyFrom(timestamp(record.updated))
    msg.train_time.CopyFrom(duration(record.train_time_s()))
    return msg
