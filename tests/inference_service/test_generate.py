"""Load and Generate over real loopback gRPC against tiny pipelines of every family."""
import time

import grpc
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from inference_service.image_encoding import read_png_recipe
from service_kit.error_interceptor import error_info
from tests.inference_service.harness import BackgroundStream, decode, progress_steps, result_of

FAMILIES = ["zimage", "flux1", "qwen_image", "sdxl"]
FAMILY_ENUM = {"zimage": c.FAMILY_ZIMAGE, "flux1": c.FAMILY_FLUX1, "qwen_image": c.FAMILY_QWEN_IMAGE,
               "sdxl": c.FAMILY_SDXL}


@pytest.mark.parametrize("family", FAMILIES)
def test_load_and_generate_every_family(inference_service, tiny_models, family):
    _, client = inference_service
    events = client.load(f"tiny-{family}", tiny_models[family])
    phases = [pb.LoadPhase.Name(e.phase) for e in events]
    assert phases[0] == "LOAD_PHASE_VALIDATING" and phases[-1] == "LOAD_PHASE_READY"
    assert "LOAD_PHASE_BUILDING" in phases
    loaded = events[-1].result
    assert loaded.family == FAMILY_ENUM[family] and loaded.estimated_footprint_bytes > 0
    settings = {r.control: r for r in loaded.resolved}
    assert settings["compute_precision"].applied == "PRECISION_FP32"  # CPU host
    assert settings["memory_mode"].applied == "MEMORY_MODE_RESIDENT"

    gen = client.generate(f"tiny-{family}", steps=3, seeds=[11], guidance_scale=2.0)
    assert gen[0].WhichOneof("event") == "queued" and gen[0].queued.position == 0
    assert progress_steps(gen) == [1, 2, 3]  # one progress event per step
    assert all(e.progress.total_steps == 3 for e in gen if e.WhichOneof("event") == "progress")
    seqs = [e.sequence for e in gen]
    assert seqs == list(range(1, len(gen) + 1)) and len({e.generation_id for e in gen}) == 1
    result = result_of(gen)
    (image,) = result.images
    assert image.mime_type == "image/png" and image.seed == 11
    picture = decode(image)
    assert picture.size == (64, 64) and picture.format == "PNG"
    recipe = read_png_recipe(image.data)
    assert recipe["prompt"] == "a red cube" and recipe["seed"] == 11 and recipe["steps"] == 3
    assert recipe["family"] == family and recipe["settings"]["compute_precision"] == "PRECISION_FP32"
    assert result.timings.total.ToNanoseconds() >= result.timings.denoise.ToNanoseconds() > 0


def test_same_seed_same_bytes_and_seeds_differ(inference_service, tiny_models):
    import numpy as np

    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"], speed_mode=c.SPEED_MODE_OFF)
    a = result_of(client.generate("tiny-z", seeds=[5, 6]))
    again = result_of(client.generate("tiny-z", seeds=[5, 6]))
    assert [i.seed for i in a.images] == [5, 6]
    assert [i.data for i in a.images] == [i.data for i in again.images]  # speed off: identical bytes
    assert a.images[0].data != a.images[1].data
    # Alone, a seed gives the same picture up to batched-matmul rounding (each image has its own generator).
    single = result_of(client.generate("tiny-z", seeds=[5])).images[0]
    diff = np.abs(np.asarray(decode(single), dtype=int) - np.asarray(decode(a.images[0]), dtype=int))
    assert diff.max() <= 2


def test_random_seeds_are_reported(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    result = result_of(client.generate("tiny-z", num_images=2))
    seeds = [i.seed for i in result.images]
    assert len(set(seeds)) == 2
    seeds_record = next(r for r in result.resolved if r.control == "seeds")
    assert seeds_record.applied == ",".join(map(str, seeds)) and seeds_record.source == c.SETTING_SOURCE_AUTO


@pytest.mark.parametrize("fmt, mime, magic", [
    (pb.IMAGE_FORMAT_WEBP, "image/webp", b"RIFF"), (pb.IMAGE_FORMAT_JPEG, "image/jpeg", b"\xff\xd8"),
])
def test_other_formats(inference_service, tiny_models, fmt, mime, magic):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    image = result_of(client.generate("tiny-z", output_format=fmt, seeds=[1])).images[0]
    assert image.mime_type == mime and image.data.startswith(magic)
    raw = result_of(client.generate("tiny-z", output_format=pb.IMAGE_FORMAT_RAW_RGB8, seeds=[1])).images[0]
    assert len(raw.data) == 64 * 64 * 3


@pytest.fixture(scope="module")
def flux_for_1024(tmp_path_factory):
    """The tiny FLUX with a VAE that scales by 8 and has no attention (the tiny one scales by 2): a 1024x1024
    image is then cheap on the CPU, 4096 tokens for the transformer and convolutions of 8 channels."""
    import torch
    from diffusers import AutoencoderKL

    from demos.tiny_pipelines import build_flux

    torch.manual_seed(0)
    pipe = build_flux()
    pipe.vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                             up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[8, 8, 8, 8],
                             layers_per_block=1, latent_channels=4, norm_num_groups=8, sample_size=32,
                             mid_block_add_attention=False, scaling_factor=0.3611, shift_factor=0.1159)
    out = tmp_path_factory.mktemp("flux-1024")
    pipe.save_pretrained(out)
    return out


def test_four_raw_1024_images_reach_a_client_with_grpc_default_receive_limit(inference_service, flux_for_1024):
    """No message grows with num_images: four raw 1024x1024 images (3 MiB each, 12 MiB together) reach a client
    with gRPC's default 4 MiB receive limit, each in its own `image` event, in seed order, before the result."""
    from diffusion.v1 import inference_pb2_grpc

    proc, client = inference_service
    client.load("flux-1024", flux_for_1024)
    limit = 4 * 2**20
    with grpc.insecure_channel(proc.address, options=[("grpc.max_receive_message_length", limit)]) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        events = list(stub.Generate(pb.GenerateRequest(
            model_id="flux-1024", prompt="a red cube", width=1024, height=1024, steps=1, seeds=[3, 1, 2, 7],
            num_images=4, output_format=pb.IMAGE_FORMAT_RAW_RGB8), timeout=300))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-5:] == ["image"] * 4 + ["result"], kinds
    assert [e.image.seed for e in events[-5:-1]] == [3, 1, 2, 7]
    assert all(len(e.image.data) == 1024 * 1024 * 3 and e.ByteSize() < limit for e in events[-5:-1])
    assert events[-1].result.image_count == 4 and events[-1].ByteSize() < 16 * 1024


@pytest.mark.parametrize("fields, text", [
    (dict(width=65), "multiple of"),
    (dict(steps=0, width=64), None),  # 0 means the family default, which is valid
    (dict(steps=500), "steps must be"),
    (dict(seeds=[1, 2], num_images=3), "seeds were given"),
    (dict(adapters=[pb.AdapterRef(adapter_id="x", weight=3)]), "weight must be"),
    (dict(encode_quality=50), "encode_quality"),
])
def test_bad_generate_requests(inference_service, tiny_models, fields, text):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    if text is None:
        assert result_of(client.generate("tiny-z", **fields))
        return
    with pytest.raises(grpc.RpcError) as e:
        client.generate("tiny-z", **fields)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and text in e.value.details()


def test_generate_for_a_model_not_loaded(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    with pytest.raises(grpc.RpcError) as e:
        client.generate("other")
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "tiny-z" in e.value.details()
    assert error_info(e.value).reason == "MODEL_NOT_LOADED"


def _long_generation(client, **fields):
    stream = BackgroundStream(client.generate_stream("tiny-z", steps=200, seeds=[3], **{"width": 128, "height": 128, **fields}))
    assert stream.progress.wait(30), stream.error
    return stream


def test_cancel_stops_within_one_step(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    stream = _long_generation(client)
    generation_id = stream.events[0].generation_id
    status = client.status()
    assert status.running_generation_id == generation_id  # status answers while the denoise runs
    resp = client.stub.CancelGeneration(pb.CancelGenerationRequest(generation_id=generation_id), timeout=5)
    seen_at_cancel = max(progress_steps(stream.events))
    assert resp.was_running
    assert stream.done.wait(10)
    assert stream.error.code() == grpc.StatusCode.CANCELLED
    assert max(progress_steps(stream.events)) <= seen_at_cancel + 2  # the step in flight, plus one queued event
    assert max(progress_steps(stream.events)) < 200
    assert not client.status().running_generation_id


def test_client_disconnect_cancels(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    stream = _long_generation(client)
    stream.call.cancel()
    deadline = time.monotonic() + 5
    while client.status().running_generation_id:
        assert time.monotonic() < deadline, "generation kept running after the client left"
        time.sleep(0.05)
    # the worker is free again
    assert result_of(client.generate("tiny-z", seeds=[1]))


def test_deadline_cancels(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    with pytest.raises(grpc.RpcError) as e:
        client.generate("tiny-z", steps=200, width=128, height=128, timeout=1.0)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 5
    while client.status().running_generation_id:
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_queue_positions_and_cancel_of_queued(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    running = _long_generation(client)
    queued = BackgroundStream(client.generate_stream("tiny-z", steps=2, seeds=[1], generation_id="queued-1"))
    deadline = time.monotonic() + 5
    while not queued.events:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert queued.events[0].queued.position == 1
    assert client.status().queue_depth == 1
    resp = client.stub.CancelGeneration(pb.CancelGenerationRequest(generation_id="queued-1"))
    assert not resp.was_running
    assert queued.done.wait(5) and queued.error.code() == grpc.StatusCode.CANCELLED
    running.call.cancel()
    with pytest.raises(grpc.RpcError) as e:
        client.stub.CancelGeneration(pb.CancelGenerationRequest(generation_id="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_unload_and_list_models(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    listed = client.stub.ListModels(pb.ListModelsRequest())
    assert [m.model_id for m in listed.models] == ["tiny-z"]
    client.stub.Unload(pb.UnloadRequest(model_id="tiny-z"))
    assert list(client.stub.ListModels(pb.ListModelsRequest()).models) == []
    with pytest.raises(grpc.RpcError) as e:
        client.stub.Unload(pb.UnloadRequest(model_id="tiny-z"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_capabilities_on_cpu(inference_service):
    _, client = inference_service
    caps = client.stub.GetCapabilities(pb.GetCapabilitiesRequest())
    assert caps.devices[0].kind == pb.DEVICE_KIND_CPU
    by_family = {f.family: f for f in caps.families}
    assert set(by_family) == set(FAMILY_ENUM.values())
    z = by_family[c.FAMILY_ZIMAGE]
    assert c.PRECISION_FP8 not in z.transformer_precisions and c.MEMORY_MODE_LOW_VRAM not in z.memory_modes
    assert any("PRECISION_FP8" in note for note in z.notes)


def test_a_request_that_cannot_meet_its_deadline_is_refused_before_queueing(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-z", tiny_models["zimage"])
    assert result_of(client.generate("tiny-z", steps=8))  # the model's step rate is now measured
    with pytest.raises(grpc.RpcError) as e:
        client.generate("tiny-z", width=128, height=128, steps=200, num_images=4, timeout=0.5)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert error_info(e.value).reason == "WOULD_MISS_DEADLINE"  # the service's answer, not the client's timer
    assert client.status().queue_depth == 0 and not client.status().running_generation_id
