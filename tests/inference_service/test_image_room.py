"""The image room a model's lease is planned for: tables of the rule, then a real broker and inference service
where a larger room leases more, is published in the model's limits, and an image larger than the room is
refused before it runs, leaving the model, its lease and the next generation alone."""
import grpc
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from diffusion_kit.families import FAMILIES
from diffusion_kit.resolved import Source
from inference_service import image_room
from inference_service.memory_plan import need_for, plan_memory
from service_kit.error_interceptor import error_info
from service_kit.errors import FailedPrecondition
from service_kit.service_process import start_service
from tests.inference_service.harness import InferenceClient, result_of

MI = 1024 * 1024
GiB = 2**30


@pytest.mark.parametrize("family, requested, pixels, source", [
    ("zimage", 0, MI, Source.DEFAULT),
    ("flux1", 0, MI, Source.DEFAULT),
    ("sdxl", 0, MI, Source.DEFAULT),
    ("qwen_image", 0, 1328 * 1328, Source.DEFAULT),  # Qwen-Image's default image is larger than 1 Mi
    ("zimage", 2048 * 2048, 2048 * 2048, Source.EXPLICIT),
    ("zimage", 512 * 512, 512 * 512, Source.EXPLICIT),
])
def test_the_room_is_the_family_default_image_unless_asked(family, requested, pixels, source):
    got, record = image_room.resolve(requested, FAMILIES[family])
    assert got == pixels and record.applied == str(pixels) and record.source is source
    assert record.control == "max_pixels_per_call"
    assert ("the lease adds" in record.reason) == (pixels > MI)


@pytest.mark.parametrize("pixels, bits, extra", [
    (MI, 16, 0),  # the measured headroom already covers one 1024x1024 image
    (512 * 512, 16, 0),  # a smaller room never shrinks the measured headroom
    (2 * MI, 16, 2 * GiB),
    (4 * MI, 16, 6 * GiB),
    (4 * MI, 32, 12 * GiB),  # activations in fp32 take twice the bytes
    (1328 * 1328, 16, int((1328 * 1328 - MI) * 2048)),
])
def test_what_a_room_adds_to_the_lease(pixels, bits, extra):
    assert image_room.extra_bytes(pixels, bits) == extra
    for mode in ("resident", "balanced", "low_vram", "sequential"):  # every tier holds the same activations
        assert need_for(mode, 20 * GiB, 12 * GiB, bits, pixels) - need_for(mode, 20 * GiB, 12 * GiB, bits) == extra


def test_a_larger_room_can_move_auto_to_a_lower_tier():
    plan = dict(device_kind="cuda", total_bytes=80 * GiB, footprint_bytes=20 * GiB, largest_component_bytes=12 * GiB)
    free = need_for("resident", 20 * GiB, 12 * GiB) + GiB
    assert plan_memory(c.MEMORY_MODE_AUTO, free_bytes=free, **plan).mode == "resident"
    bigger = plan_memory(c.MEMORY_MODE_AUTO, free_bytes=free, pixels=4 * MI, **plan)
    assert bigger.mode == "balanced" and bigger.device_bytes == need_for("balanced", 20 * GiB, 12 * GiB, 16, 4 * MI)


@pytest.mark.parametrize("width, height, room, refused", [
    (1024, 1024, MI, False), (1024, 1040, MI, True), (2048, 2048, MI, True), (2048, 2048, 4 * MI, False),
    (1328, 1328, 1328 * 1328, False), (64, 128, 64 * 64, True),
])
def test_an_image_larger_than_the_room_is_refused(width, height, room, refused):
    if not refused:
        image_room.check(width, height, room, "m")
        return
    with pytest.raises(FailedPrecondition) as e:
        image_room.check(width, height, room, "m")
    assert e.value.reason == "IMAGE_LARGER_THAN_ROOM" and f"at least {width * height}" in e.value.message


@pytest.fixture
def broker_and_inference(start_broker):
    broker_proc, broker = start_broker(fake_devices="1x64GiB")
    proc = start_service("inference_service", "--broker", broker_proc.address, "--client-id", "inference-0",
                         *InferenceClient.TEST_FLAGS, timeout=180)
    client = InferenceClient(proc.address)
    yield broker, client
    client.close()
    proc.stop()


def _lease_bytes(broker) -> int:
    (lease,) = broker.status().leases
    return lease.memory_bytes


def test_the_room_sizes_the_lease_is_published_and_refuses_larger_images(broker_and_inference, tiny_models):
    broker, client = broker_and_inference
    events = client.load("tiny-z", tiny_models["zimage"])
    default = events[-1].result
    assert default.limits.max_pixels_per_call == MI
    default_lease = _lease_bytes(broker)
    compute = next(r.applied for r in default.resolved if r.control == "compute_precision")
    bits = 32 if "FP32" in compute else 16

    bigger = client.load("tiny-z", tiny_models["zimage"], max_pixels_per_call=2 * MI)[-1].result
    assert bigger.limits.max_pixels_per_call == 2 * MI
    record = next(r for r in bigger.resolved if r.control == "max_pixels_per_call")
    assert record.applied == str(2 * MI) and record.source == c.SETTING_SOURCE_EXPLICIT
    assert _lease_bytes(broker) - default_lease == image_room.extra_bytes(2 * MI, bits)

    small = client.load("tiny-z", tiny_models["zimage"], max_pixels_per_call=64 * 64)[-1].result
    assert small.limits.max_pixels_per_call == 64 * 64
    lease_id = client.status().lease_id
    with pytest.raises(grpc.RpcError) as e:
        client.generate("tiny-z", width=64, height=128)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION, e.value.details()
    info = error_info(e.value)
    assert info.reason == "IMAGE_LARGER_THAN_ROOM" and info.metadata["max_pixels_per_call"] == str(64 * 64)
    assert "at least 8192" in e.value.details()
    # Nothing was disturbed: the same model and lease, and an image within the room runs; two run as two calls.
    status = client.status()
    assert [m.model_id for m in status.models] == ["tiny-z"] and status.lease_id == lease_id
    result = result_of(client.generate("tiny-z", width=64, height=64, seeds=[1, 2]))
    per_call = next(r for r in result.result.resolved if r.control == "images_per_call")
    assert per_call.applied == "1" and "room for 4096 pixels" in per_call.reason


def test_the_room_is_bounded_at_the_edge(broker_and_inference, tiny_models):
    _, client = broker_and_inference
    with pytest.raises(grpc.RpcError) as e:
        client.load("tiny-z", tiny_models["zimage"], max_pixels_per_call=image_room.MAX_PIXELS + 1)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(e.value).reason == "BAD_MAX_PIXELS_PER_CALL"


@pytest.mark.parametrize("mode, parsed", [
    ("bf16-off", ("bf16-off", 1024, 1024, 0)),
    ("bf16-off@2048x2048", ("bf16-off", 2048, 2048, 1)),
    ("fp8-default@1024x1024:4", ("fp8-default", 1024, 1024, 4)),
])
def test_the_lease_bench_names_the_images_its_room_is_for(mode, parsed):
    from benchmarks.lease_usage import images_of

    assert images_of(mode) == parsed


@pytest.mark.parametrize("asked, room, side", [
    (1024, MI, 1024), (64, MI, 64), (2048, MI, 1024),  # a warm-up larger than the lease covers is cut to it
    (2048, 4 * MI, 2048), (1024, 512 * 512, 1024),  # the lease never covers less than one 1024x1024 image
])
def test_the_compile_warm_up_stays_within_the_lease(asked, room, side):
    from pathlib import Path

    from inference_service.load_plan import EngineSettings, plan_load
    from inference_service.model_source import SourceFiles
    from inference_service.requests import LoadRequest
    from tests.inference_service.test_policies import FLUX_PARAMS, H200

    assert image_room.warmup_side(asked, room) == side
    source = SourceFiles("local_dir", Path("/nowhere"), FAMILIES["flux1"], params=FLUX_PARAMS)
    plan = plan_load(LoadRequest(model_id="m", source=None, speed_mode=c.SPEED_MODE_DEFAULT, max_pixels_per_call=room),
                     source, H200, EngineSettings(warmup_resolution=asked))
    assert plan.warmup_resolution == side and plan.pixels_per_call == room
