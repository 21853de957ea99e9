"""Hub loads against a local fake hub (HF_ENDPOINT): one weight variant, sized and refused before a weight byte
moves, gated repos answered PERMISSION_DENIED with how to pass a token."""
import json
import struct

import grpc
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from service_kit.error_interceptor import error_info
from service_kit.service_process import start_service
from tests.fake_hub import FakeHub, FakeRepo
from tests.inference_service.harness import InferenceClient, result_of

TRANSFORMER = "transformer/diffusion_pytorch_model.safetensors"


def header_only_safetensors(shape: list[int]) -> bytes:
    """A safetensors header naming one huge F32 tensor, without its data: what the hub's header read sees."""
    n = 4
    for side in shape:
        n *= side
    header = json.dumps({"weight": {"dtype": "F32", "shape": shape, "data_offsets": [0, n]}}).encode()
    return struct.pack("<Q", len(header)) + header


def fp16_copy(weights: bytes) -> bytes:
    """The same tensors in fp16, as a repo's fp16 variant holds them."""
    from safetensors.torch import load, save

    return save({k: v.half() for k, v in load(weights).items()})


@pytest.fixture(scope="module")
def hub(tiny_models, tmp_path_factory):
    hub = FakeHub()
    plain = FakeRepo.from_dir(tiny_models["zimage"])
    files = dict(plain.files)
    files["transformer/diffusion_pytorch_model.fp16.safetensors"] = fp16_copy(files[TRANSFORMER])
    files["tiny-z-single-file.safetensors"] = files[TRANSFORMER]  # a root checkpoint a pipeline load never needs
    hub.repos["org/tiny-z"] = FakeRepo(files)
    hub.repos["org/gated"] = FakeRepo(dict(plain.files), gated_token="hf_right_token")
    huge = dict(plain.files)
    huge[TRANSFORMER] = header_only_safetensors([50_000, 200_000])  # 10 G parameters, 40 GB in fp32
    hub.repos["org/huge"] = FakeRepo(huge)
    yield hub
    hub.close()


@pytest.fixture(scope="module")
def service(hub, tmp_path_factory):
    home = tmp_path_factory.mktemp("hf-home")
    broker = start_service("gpu_broker", "--fake-devices", "1x24GiB")
    proc = start_service("inference_service", "--broker", broker.address, *InferenceClient.TEST_FLAGS, timeout=180,
                         env={"HF_ENDPOINT": hub.endpoint, "HF_HUB_OFFLINE": "0", "HF_HOME": str(home),
                              "HF_HUB_DISABLE_XET": "1", "HF_TOKEN": ""})
    client = InferenceClient(proc.address)
    yield client
    client.close()
    proc.stop()
    broker.stop()


def hub_load(client, repo_id: str, variant: str = ""):
    return client.load_request(pb.LoadRequest(model_id="hub", source=c.ModelSource(
        hub_repo=c.HubRepo(repo_id=repo_id, variant=variant))))


def weights_fetched(hub, repo_id: str) -> set[str]:
    return {d.removeprefix(repo_id + "/") for d in hub.downloads if d.startswith(repo_id + "/")
            and d.endswith(".safetensors")}


def test_plain_weights_by_default_then_a_variant(service, hub):
    events = hub_load(service, "org/tiny-z")
    fetched = weights_fetched(hub, "org/tiny-z")
    assert TRANSFORMER in fetched and not any(".fp16." in f or "/" not in f for f in fetched), fetched
    sized = [e for e in events if e.phase == pb.LOAD_PHASE_DOWNLOADING and "MiB to fetch" in e.message]
    repo = hub.repos["org/tiny-z"].files
    plain_bytes = sum(len(b) for p, b in repo.items() if "/" in p and ".fp16." not in p) + len(repo["model_index.json"])
    assert sized and sized[0].bytes_total == plain_bytes  # said before the download, variant files not counted
    assert result_of(service.generate("hub", seeds=[1])).images

    hub.downloads.clear()
    events = hub_load(service, "org/tiny-z", variant="fp16")
    assert weights_fetched(hub, "org/tiny-z") == {"transformer/diffusion_pytorch_model.fp16.safetensors"}
    said = " ".join(e.message for e in events)
    assert "fp16 weights (plain for text_encoder, vae: no fp16 files)" in said, said
    assert result_of(service.generate("hub", seeds=[1])).images


def test_a_load_that_cannot_fit_is_refused_before_any_weight_byte(service, hub):
    with pytest.raises(grpc.RpcError) as e:
        hub_load(service, "org/huge")
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    assert error_info(e.value).reason == "NEVER_FITS"
    assert weights_fetched(hub, "org/huge") == set()


def test_a_gated_repo_is_permission_denied_with_how_to_pass_a_token(service, hub):
    with pytest.raises(grpc.RpcError) as e:
        hub_load(service, "org/gated")
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_info(e.value).reason == "GATED_REPO" and "HF_TOKEN" in e.value.details()


def test_a_bad_variant_is_invalid_argument(service):
    with pytest.raises(grpc.RpcError) as e:
        hub_load(service, "org/tiny-z", variant="fp16/../x")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "variant" in e.value.details()
