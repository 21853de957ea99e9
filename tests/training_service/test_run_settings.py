"""Table tests of what a StartTraining request resolves to, per host (HostCaps built by hand)."""
from dataclasses import replace

import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb
from diffusion_kit.families import FAMILIES
from diffusion_kit.precision import Precision
from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.errors import FailedPrecondition, InvalidArgument
from tests.training_service.hosts import CPU, H200, H200_NO_BNB
from training_service import convert
from training_service.run_settings import resolve_run

Z, SDXL = FAMILIES["zimage"], FAMILIES["sdxl"]
CPU_8BIT = replace(CPU, adamw8bit=True, adamw8bit_reason="")  # bitsandbytes 0.50.2 steps 8-bit AdamW on the CPU


def precision(applied):
    return Resolved("base_precision", applied, applied, Source.EXPLICIT)


def run(caps=H200, family=Z, applied="PRECISION_BF16", **fields):
    return resolve_run(convert.start_training(pb.StartTrainingRequest(**fields)), caps, family, Precision[applied.removeprefix("PRECISION_")],
                       precision(applied), "first caption")


def by_control(settings):
    return {r.control: r for r in settings.resolved}


@pytest.mark.parametrize("caps, applied, fields, device, compiled, speed_status", [
    (H200, "PRECISION_BF16", {}, "cuda", False, Status.APPLIED),
    (H200, "PRECISION_BF16", {"speed_mode": c.SPEED_MODE_DEFAULT}, "cuda", True, Status.APPLIED),
    (H200, "PRECISION_BF16", {"speed_mode": c.SPEED_MODE_MAX}, "cuda", True, Status.APPLIED),  # cuDNN first
    (H200, "PRECISION_BF16", {"speed_mode": c.SPEED_MODE_MAX, "gradient_checkpointing": True}, "cuda", True,
     Status.FELL_BACK),
    (H200, "PRECISION_FP8", {"speed_mode": c.SPEED_MODE_MAX}, "cuda", True, Status.FELL_BACK),
    (H200, "PRECISION_FP8", {"speed_mode": c.SPEED_MODE_DEFAULT}, "cuda", True, Status.APPLIED),
    (H200, "PRECISION_NF4", {"speed_mode": c.SPEED_MODE_DEFAULT}, "cuda", True, Status.APPLIED),
    (H200, "PRECISION_INT8", {"speed_mode": c.SPEED_MODE_DEFAULT}, "cuda", False, Status.UNSUPPORTED),
    (CPU, "PRECISION_FP32", {"speed_mode": c.SPEED_MODE_DEFAULT}, "cpu", True, Status.APPLIED),
])
def test_compile_follows_the_base_precision(caps, applied, fields, device, compiled, speed_status):
    settings = run(caps, Z, applied, **fields)
    assert (settings.device, settings.compile) == (device, compiled)
    assert by_control(settings)["speed_mode"].status == speed_status


FLUX, MAX = FAMILIES["flux1"], {"speed_mode": c.SPEED_MODE_MAX}


APPLIED, FELL_BACK = Status.APPLIED, Status.FELL_BACK


@pytest.mark.parametrize("family, fields, kernels, graphs, status, says", [
    (Z, MAX, ("cudnn", "flash", "efficient"), True, APPLIED, "MAX adds cuDNN attention first"),
    (Z, MAX, ("cudnn", "flash", "efficient"), True, APPLIED, "the blocks replay as CUDA graphs"),
    (Z, {**MAX, "batch_size": 2}, ("cudnn", "flash", "efficient"), False, APPLIED, "no CUDA graphs: each caption"),
    (Z, {**MAX, "gradient_accumulation_steps": 2}, ("cudnn", "flash", "efficient"), False, APPLIED,
     "no CUDA graphs: a replay overwrites"),
    (Z, {"speed_mode": c.SPEED_MODE_DEFAULT}, ("flash", "efficient"), False, APPLIED, "dynamic shapes"),
    (FLUX, MAX, ("flash", "efficient"), True, APPLIED, "the blocks replay as CUDA graphs"),
    (FLUX, {**MAX, "gradient_accumulation_steps": 2}, ("flash", "efficient"), False, FELL_BACK, "cannot accumulate"),
    (FLUX, {**MAX, "gradient_checkpointing": True}, ("flash", "efficient"), False, FELL_BACK, "measured on FLUX.1's"),
])
def test_speed_mode_max_applies_what_its_records_say(family, fields, kernels, graphs, status, says):
    settings = run(H200, family, "PRECISION_BF16", **fields)
    records = by_control(settings)
    assert (settings.attention, settings.cuda_graphs) == (kernels, graphs) and says in records["speed_mode"].reason
    assert all(k in records["attention"].applied for k in kernels)
    assert records["speed_mode"].applied == ("regional_compile+cuda_graphs" if graphs else "regional_compile")
    assert records["speed_mode"].status == status


def test_only_speed_mode_max_on_a_gpu_replays_graphs():
    assert not run(H200, FLUX, "PRECISION_BF16", speed_mode=c.SPEED_MODE_DEFAULT).cuda_graphs
    cpu = run(CPU, FLUX, "PRECISION_FP32", **MAX)
    assert not cpu.cuda_graphs and "CUDA graphs need a CUDA device" in by_control(cpu)["speed_mode"].reason


def test_fp8_eager_says_it_is_slow():
    assert "SPEED_MODE_DEFAULT" in by_control(run(applied="PRECISION_FP8"))["speed_mode"].reason


@pytest.mark.parametrize("caps, fields, optimizer, schedule", [
    (H200, {}, "adamw", "constant_with_warmup"),
    (H200, {"optimizer": pb.OPTIMIZER_ADAMW_8BIT, "lr_schedule": pb.LR_SCHEDULE_COSINE}, "adamw8bit", "cosine"),
    (CPU_8BIT, {"optimizer": pb.OPTIMIZER_ADAMW_8BIT}, "adamw8bit", "constant_with_warmup"),
    (H200, {"lr_schedule": pb.LR_SCHEDULE_LINEAR, "warmup_steps": 10}, "adamw", "linear"),
    (H200, {"lr_schedule": pb.LR_SCHEDULE_CONSTANT}, "adamw", "constant"),
])
def test_optimizer_and_schedule(caps, fields, optimizer, schedule):
    settings = run(caps, Z, "PRECISION_FP32" if caps is CPU_8BIT else "PRECISION_BF16", **fields)
    assert (settings.optimizer, settings.lr_schedule) == (optimizer, schedule)
    assert by_control(settings)["lr_schedule"].applied.startswith(schedule)
    assert ("min_8bit_size" in by_control(settings)["optimizer"].reason) == (optimizer == "adamw8bit")
    assert ("fused" in by_control(settings)["optimizer"].reason) == (optimizer == "adamw" and caps is H200)


def test_adamw_on_the_cpu_is_not_fused():
    assert by_control(run(CPU, applied="PRECISION_FP32"))["optimizer"].reason == ""


@pytest.mark.parametrize("caps, fields, error, reason", [
    (CPU, {"optimizer": pb.OPTIMIZER_ADAMW_8BIT}, FailedPrecondition, "OPTIMIZER_UNAVAILABLE"),
    (H200_NO_BNB, {"optimizer": pb.OPTIMIZER_ADAMW_8BIT}, FailedPrecondition, "OPTIMIZER_UNAVAILABLE"),
    (H200, {"batch_size": 65}, InvalidArgument, "BAD_VALUE"),
    (H200, {"gradient_accumulation_steps": -1}, InvalidArgument, "BAD_VALUE"),
    (H200, {"gradient_accumulation_steps": 65}, InvalidArgument, "BAD_VALUE"),
    (H200, {"sample_every": -2}, InvalidArgument, "BAD_VALUE"),
    (H200, {"sample_every": 5, "sample_prompts": ["p"] * 9}, InvalidArgument, "BAD_VALUE"),
])
def test_refusals(caps, fields, error, reason):
    with pytest.raises(error) as e:
        run(caps, **fields)
    assert e.value.reason == reason


def test_8bit_refusal_says_what_the_probe_found():
    with pytest.raises(FailedPrecondition) as e:
        run(H200_NO_BNB, optimizer=pb.OPTIMIZER_ADAMW_8BIT)
    assert "one-step probe: ImportError" in str(e.value) and "OPTIMIZER_ADAMW" in str(e.value)


@pytest.mark.parametrize("fields, every, prompts", [
    ({}, 0, ()),
    ({"sample_every": 50}, 50, ("first caption",)),
    ({"sample_every": 50, "sample_prompts": ["a", " ", "b"]}, 50, ("a", "b")),
])
def test_sample_prompts(fields, every, prompts):
    settings = run(**fields)
    assert (settings.sample_every, settings.sample_prompts) == (every, prompts)


def test_sdxl_keeps_its_native_dtype_and_batches_default_to_one():
    settings = run(H200, SDXL, "PRECISION_BF16", dataset=pb.Dataset(aspect_ratio_buckets=True))
    assert (settings.precision, settings.batch_size, settings.accumulation, settings.buckets) == ("bf16", 1, 1, True)
    assert by_control(settings)["attention"].applied.startswith("flash")


def test_adamw8bit_probe_steps_on_this_cpu_and_names_what_it_cannot_run():
    from diffusion_kit.host_caps import probe_adamw8bit

    assert probe_adamw8bit("cpu") == (True, "")
    ok, why = probe_adamw8bit("mps")
    assert not ok and "mps" in why


@pytest.mark.parametrize("fields, asked, applied", [
    ({}, "false", "false"),
    ({"gradient_checkpointing": True}, "true", "true"),
    ({"gradient_checkpointing": True, "gradient_checkpointing_interval": 1}, "true, interval 1", "true"),
    ({"gradient_checkpointing": True, "gradient_checkpointing_interval": 3}, "true, interval 3",
     "true (1 block call in every 3)"),
])
def test_the_checkpointing_record_names_the_interval(fields, asked, applied):
    record = by_control(run(**fields))["gradient_checkpointing"]
    assert (record.requested, record.applied) == (asked, applied)
