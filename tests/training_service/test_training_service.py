"""The training service over real loopback gRPC: GetTrainingInfo on this host and StartTraining's preflights."""
import json

import grpc
import pytest
from PIL import Image

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import training_pb2 as pb
from diffusion.v1 import training_pb2_grpc
from service_kit.error_interceptor import error_info
from service_kit.server_runtime import CLIENT_OPTIONS
from service_kit.service_process import start_service
from tests.service_flags import TRAINING_ROOTS


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    out = tmp_path_factory.mktemp("training-out")
    proc = start_service("training_service", *TRAINING_ROOTS, "--output-dir", str(out), "--adapter-store",
                         str(out / "adapters"), timeout=180)  # never the user's own store
    channel = grpc.insecure_channel(proc.address, options=CLIENT_OPTIONS)
    yield training_pb2_grpc.TrainingServiceStub(channel)
    channel.close()
    proc.stop()


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("dataset")
    for i in range(3):
        Image.new("RGB", (64, 48), (40 * i, 90, 200)).save(root / f"img{i}.png")
        (root / f"img{i}.txt").write_text(f"a blue card number {i}")
    return root


def test_cpu_host_info_says_fp32_only(training):
    info = training.GetTrainingInfo(pb.GetTrainingInfoRequest())
    assert info.cpu_only
    by_family = {f.family: f for f in info.families}
    assert set(by_family) == {c.FAMILY_FLUX1, c.FAMILY_ZIMAGE, c.FAMILY_QWEN_IMAGE, c.FAMILY_SDXL}
    for family in (c.FAMILY_FLUX1, c.FAMILY_ZIMAGE, c.FAMILY_QWEN_IMAGE):
        assert list(by_family[family].precision_modes) == [c.PRECISION_FP32]
        assert by_family[family].recommended_precision == c.PRECISION_FP32
        assert "fp32 only" in by_family[family].memory_note and not by_family[family].supports_compile
    assert list(by_family[c.FAMILY_SDXL].precision_modes) == []
    assert "ignored" in by_family[c.FAMILY_SDXL].memory_note
    assert by_family[c.FAMILY_FLUX1].default_resolution == 512 and by_family[c.FAMILY_FLUX1].default_rank == 16
    # The installed bitsandbytes (0.50.2) steps 8-bit AdamW on the CPU, and the service probed that it does.
    assert list(info.optimizers) == [pb.OPTIMIZER_ADAMW, pb.OPTIMIZER_ADAMW_8BIT], info.adamw_8bit_unavailable_reason
    assert info.adamw_8bit_unavailable_reason == ""


def start(training, **fields):
    return training.StartTraining(pb.StartTrainingRequest(**fields), timeout=60)


def test_start_preflights(training, tiny_models, dataset_dir, tmp_path):
    good = dict(family=c.FAMILY_ZIMAGE, base=c.ModelSource(local_dir=str(tiny_models["zimage"])),
                dataset=pb.Dataset(image_dir=str(dataset_dir)))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "x.png").write_bytes(b"\x89PNG not really")
    (tmp_path / "broken" / "x.txt").write_text("caption")
    cases = [
        (dict(good, family=c.FAMILY_UNSPECIFIED), grpc.StatusCode.INVALID_ARGUMENT, "BAD_FAMILY"),
        (dict(good, family=c.FAMILY_FLUX1), grpc.StatusCode.INVALID_ARGUMENT, "FAMILY_MISMATCH"),
        (dict(good, base=c.ModelSource(local_dir=str(tmp_path / "nope"))), grpc.StatusCode.NOT_FOUND,
         "MODEL_NOT_FOUND"),
        (dict(good, base=c.ModelSource(local_dir=str(dataset_dir))), grpc.StatusCode.INVALID_ARGUMENT,
         "NOT_A_PIPELINE"),
        (dict(good, base_precision=c.PRECISION_NF4), grpc.StatusCode.FAILED_PRECONDITION, "PRECISION_UNAVAILABLE"),
        (dict(good, base_precision=c.PRECISION_NVFP4), grpc.StatusCode.INVALID_ARGUMENT, "BAD_BASE_PRECISION"),
        (dict(good, dataset=pb.Dataset(image_dir=str(tmp_path / "broken"))), grpc.StatusCode.INVALID_ARGUMENT,
         "BAD_IMAGE"),
        (dict(good, adapter_id="../up"), grpc.StatusCode.INVALID_ARGUMENT, "BAD_ADAPTER_ID"),
        (dict(good, base=c.ModelSource(single_file=c.SingleFileCheckpoint(path="/x.safetensors"))),
         grpc.StatusCode.INVALID_ARGUMENT, "BAD_BASE"),
        (dict(good, learning_rate=0.0), grpc.StatusCode.INVALID_ARGUMENT, "BAD_VALUE"),
        (dict(good, learning_rate=float("nan")), grpc.StatusCode.INVALID_ARGUMENT, "BAD_VALUE"),
        (dict(good, alpha=-1.0), grpc.StatusCode.INVALID_ARGUMENT, "BAD_VALUE"),
        (dict(good, rank=4096), grpc.StatusCode.INVALID_ARGUMENT, "BAD_VALUE"),
        (dict(good, steps=10, warmup_steps=20), grpc.StatusCode.INVALID_ARGUMENT, "BAD_VALUE"),
        (dict(good, resolution=8192), grpc.StatusCode.INVALID_ARGUMENT, "BAD_RESOLUTION"),
        (dict(good, batch_size=65), grpc.StatusCode.INVALID_ARGUMENT, "BAD_VALUE"),
        (dict(good, lr_schedule=99), grpc.StatusCode.INVALID_ARGUMENT, "BAD_LR_SCHEDULE"),
        (dict(good, optimizer=9), grpc.StatusCode.INVALID_ARGUMENT, "BAD_OPTIMIZER"),
        (dict(good, speed_mode=9), grpc.StatusCode.INVALID_ARGUMENT, "BAD_SPEED_MODE"),
        (dict(good, sample_every=-1), grpc.StatusCode.INVALID_ARGUMENT, "BAD_VALUE"),
        (dict(good, gradient_checkpointing_interval=2), grpc.StatusCode.INVALID_ARGUMENT, "BAD_VALUE"),
        (dict(good, gradient_checkpointing=True, gradient_checkpointing_interval=65), grpc.StatusCode.INVALID_ARGUMENT,
         "BAD_VALUE"),
        (dict(good, base=c.ModelSource(hub_repo=c.HubRepo(repo_id="org/any", variant="fp16"))),
         grpc.StatusCode.INVALID_ARGUMENT, "VARIANT_NOT_FOR_TRAINING"),
    ]
    for fields, code, reason in cases:
        with pytest.raises(grpc.RpcError) as e:
            start(training, **fields)
        assert (e.value.code(), error_info(e.value).reason) == (code, reason), e.value.details()


def test_sdxl_ignores_a_leftover_precision_but_not_an_unknown_one(training, tiny_models, dataset_dir):
    base = c.ModelSource(local_dir=str(tiny_models["sdxl"]))
    started = start(training, family=c.FAMILY_SDXL, base=base, dataset=pb.Dataset(image_dir=str(dataset_dir)),
                    base_precision=c.PRECISION_FP8, steps=2, resolution=64, rank=4)
    events = list(training.WatchTraining(pb.WatchTrainingRequest(job_id=started.job_id), timeout=120))
    precision = events[0].resolved.resolved[0]
    assert (precision.requested, precision.applied) == ("PRECISION_FP8", "PRECISION_FP32")
    assert precision.status == c.SETTING_STATUS_UNSUPPORTED and "ignored" in precision.reason
    assert events[-1].finished.state == pb.TRAINING_JOB_STATE_SUCCEEDED, events[-1].finished.message
    with pytest.raises(grpc.RpcError) as e:
        start(training, family=c.FAMILY_SDXL, base=base, dataset=pb.Dataset(image_dir=str(dataset_dir)),
              base_precision=c.PRECISION_NVFP4)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_prequantized_base_only_trains_nf4(tiny_models, tmp_path):
    import shutil

    from diffusion_kit.host_caps import HostCaps
    from service_kit.errors import InvalidArgument
    from training_service.training_plan import is_prequantized
    from training_service import precision_policy

    base = tmp_path / "bnb-base"
    shutil.copytree(tiny_models["flux1"], base)
    config = json.loads((base / "transformer" / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    (base / "transformer" / "config.json").write_text(json.dumps(config))
    from diffusion_kit.families import FAMILIES
    from diffusion_kit.precision import Precision

    assert is_prequantized(base, FAMILIES["flux1"]) and not is_prequantized(tiny_models["flux1"], FAMILIES["flux1"])
    h200 = HostCaps("cuda", "NVIDIA H200", 141 * 2**30, 139 * 2**30, (9, 0), native_bf16=True, torchao=True,
                    bitsandbytes=True)
    with pytest.raises(InvalidArgument, match="dense base"):
        precision_policy.resolve(Precision.BF16, h200, FAMILIES["flux1"], h200.free_bytes, prequantized=True)


def test_preflight_sizes_the_job_from_its_weights_and_shape(tiny_models, dataset_dir, tmp_path):
    """The estimate the lease asks for comes from the base on disk and the request's resolution and batch;
    one larger than the whole GPU is refused in the preflight, before any lease."""
    from diffusion_kit.host_caps import HostCaps
    from service_kit.errors import FailedPrecondition
    from training_service import convert
    from training_service.training_plan import resolve

    def preflight(req, caps, output_root):
        return resolve(convert.start_training(req), caps, output_root)

    small_gpu = HostCaps("cuda", "a 64 MiB GPU", 64 * 2**20, 64 * 2**20, (9, 0), native_bf16=True, torchao=True,
                         bitsandbytes=True)
    req = pb.StartTrainingRequest(family=c.FAMILY_FLUX1, base=c.ModelSource(local_dir=str(tiny_models["flux1"])),
                                  dataset=pb.Dataset(image_dir=str(dataset_dir)), base_precision=c.PRECISION_BF16,
                                  resolution=64)
    small = preflight(req, small_gpu, tmp_path).need_bytes
    req.batch_size = 4
    assert preflight(req, small_gpu, tmp_path).need_bytes > small > 0
    req.resolution, req.batch_size = 4096, 64
    with pytest.raises(FailedPrecondition, match="a 64 MiB GPU has 64.0 MiB in all") as e:
        preflight(req, small_gpu, tmp_path)
    assert e.value.reason == "NEVER_FITS" and "gradient_checkpointing=true" in str(e.value)


def test_auto_and_the_memory_note_read_free_memory_at_each_request(tmp_path):
    """Not the free memory of the service's start: a model that became resident since then counts."""
    import asyncio

    from diffusion_kit.host_caps import HostCaps
    from training_service.job_store import JobStore
    from training_service.jobs import JobManager
    from training_service.servicer import TrainingServicer

    gib = 2**30
    h200 = HostCaps("cuda", "NVIDIA H200", 141 * gib, 139 * gib, (9, 0), native_bf16=True, torchao=True,
                    bitsandbytes=True)
    free = {"now": 139 * gib}
    servicer = TrainingServicer(h200, tmp_path, JobManager(JobStore(tmp_path / "jobs"), tmp_path / "adapters"),
                                probe_free_memory=lambda: free["now"])

    def flux():
        info = asyncio.run(servicer.GetTrainingInfo(pb.GetTrainingInfoRequest(), None))
        return next(f for f in info.families if f.family == c.FAMILY_FLUX1)

    assert flux().recommended_precision == c.PRECISION_BF16 and "139.0 GiB free" in flux().memory_note
    free["now"] = 20 * gib  # an inference model is resident now
    assert flux().recommended_precision == c.PRECISION_NF4 and "20.0 GiB free" in flux().memory_note


@pytest.mark.parametrize("logged, reserved", [({"peak_reserved_bytes": 7 * 2**30}, 7 * 2**30), ({}, 0)])
def test_a_step_says_what_the_allocator_held_and_older_logs_read_as_none(logged, reserved):
    """peak_reserved_bytes is what a job's lease covers; a job logged before the field existed streams 0."""
    from training_service import convert

    data = {"step": 3, "total": 10, "loss": 0.5, "avg_loss": 0.6, "lr": 1e-4, "grad_norm": 1.0, "samples_per_s": 2.0,
            "peak_memory_bytes": 5 * 2**30, "elapsed_s": 1.5, "eta_s": 3.5, **logged}
    msg = convert.watch_response("job-1", {"sequence": 4, "time": 0.0, "kind": "step", "data": data})
    assert (msg.step.step, msg.step.peak_memory_bytes, msg.step.peak_reserved_bytes) == (3, 5 * 2**30, reserved)
