"""Loads from every kind of source: single-file and GGUF denoisers, and a hub repo from the offline cache."""
import grpc
import numpy as np
import pytest

from diffusion.v1 import common_pb2
from diffusion.v1 import inference_pb2 as pb
from service_kit.error_interceptor import error_info
from service_kit.service_process import start_service
from tests.inference_service.harness import InferenceClient, decode, result_of
from tests.inference_service.sources_helper import seed_hub_cache, write_gguf, write_single_file
from tests.service_flags import TMP


@pytest.fixture(scope="module")
def sources(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    cache = root / "hub"
    seed_hub_cache(cache, "tiny-org/tiny-zimage", tiny_models["zimage"])
    proc = start_service("inference_service", *InferenceClient.TEST_FLAGS, timeout=180,
                         env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    client = InferenceClient(proc.address)
    yield root, client
    client.close()
    proc.stop()


def pixels(result):
    return np.asarray(decode(result.images[0]), dtype=np.int16)


def test_single_file_denoiser_gives_the_same_image(sources, tiny_models):
    root, client = sources
    client.load("dir", tiny_models["zimage"])
    reference = pixels(result_of(client.generate("dir", seeds=[3])))
    path = write_single_file(tiny_models["zimage"], "zimage", root / "z-transformer.safetensors")
    events = client.load_request(pb.LoadRequest(model_id="single", source=common_pb2.ModelSource(single_file=common_pb2.SingleFileCheckpoint(
        path=str(path), companions=common_pb2.ModelSource(local_dir=str(tiny_models["zimage"]))))))
    assert events[-1].phase == pb.LOAD_PHASE_READY
    assert np.array_equal(pixels(result_of(client.generate("single", seeds=[3]))), reference)


def test_gguf_denoiser_loads_quantised_and_stays_close(sources, tiny_models):
    root, client = sources
    client.load("dir", tiny_models["zimage"])
    reference = pixels(result_of(client.generate("dir", seeds=[3])))
    path, quantized = write_gguf(tiny_models["zimage"], "zimage", root / "z-q8.gguf")
    assert quantized > 0
    client.load_request(pb.LoadRequest(model_id="gguf", source=common_pb2.ModelSource(gguf=common_pb2.GgufTransformer(
        path=str(path), base=common_pb2.ModelSource(local_dir=str(tiny_models["zimage"]))))))
    out = pixels(result_of(client.generate("gguf", seeds=[3])))
    assert not np.array_equal(out, reference)  # really quantised
    assert np.abs(out - reference).mean() < 8  # Q8_0 stays close to the dense image


def test_hub_repo_from_the_offline_cache(sources, tiny_models):
    _, client = sources
    events = client.load_request(pb.LoadRequest(model_id="hub", source=common_pb2.ModelSource(
        hub_repo=common_pb2.HubRepo(repo_id="tiny-org/tiny-zimage"))))
    assert pb.LOAD_PHASE_DOWNLOADING in [e.phase for e in events] and events[-1].phase == pb.LOAD_PHASE_READY
    assert result_of(client.generate("hub", seeds=[1])).images


@pytest.mark.parametrize("source, code, reason", [
    (common_pb2.ModelSource(hub_repo=common_pb2.HubRepo(repo_id="nobody/not-cached")), grpc.StatusCode.NOT_FOUND, "NOT_CACHED_OFFLINE"),
    (common_pb2.ModelSource(hub_repo=common_pb2.HubRepo(repo_id="no-slash")), grpc.StatusCode.INVALID_ARGUMENT, "BAD_REPO_ID"),
    (common_pb2.ModelSource(gguf=common_pb2.GgufTransformer(path=f"{TMP}/nonexistent.gguf")), grpc.StatusCode.NOT_FOUND,
     "MODEL_NOT_FOUND"),
    # Outside the model roots: refused before anything looks whether it exists.
    (common_pb2.ModelSource(gguf=common_pb2.GgufTransformer(path="/nonexistent.gguf")), grpc.StatusCode.PERMISSION_DENIED,
     "PATH_NOT_ALLOWED"),
    (common_pb2.ModelSource(), grpc.StatusCode.INVALID_ARGUMENT, "MISSING_SOURCE"),
])
def test_bad_sources(sources, source, code, reason):
    _, client = sources
    with pytest.raises(grpc.RpcError) as e:
        client.load_request(pb.LoadRequest(model_id="bad", source=source))
    assert e.value.code() == code and error_info(e.value).reason == reason, e.value.details()


def test_gguf_needs_a_base(sources, tiny_models):
    root, client = sources
    path, _ = write_gguf(tiny_models["zimage"], "zimage", root / "z-nobase.gguf")
    with pytest.raises(grpc.RpcError) as e:
        client.load_request(pb.LoadRequest(model_id="x", source=common_pb2.ModelSource(gguf=common_pb2.GgufTransformer(path=str(path)))))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "base" in e.value.details()
