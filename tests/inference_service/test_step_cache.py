"""Step caching (First-Block Cache), opt-in per generation: what it may run on, and what it does to a real
tiny pipeline through the service."""
import grpc
import numpy as np
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from inference_service import step_cache
from inference_service.image_encoding import read_png_recipe
from inference_service.requests import StepCacheRequest
from service_kit.errors import FailedPrecondition, InvalidArgument
from tests.inference_service.harness import decode, result_of

FIRST = pb.STEP_CACHE_MODE_FIRST_BLOCK


@pytest.mark.parametrize("requested, family, expected", [
    (None, "flux1", None),
    (StepCacheRequest("off"), "zimage", None),  # off is fine anywhere
    (StepCacheRequest("first_block"), "flux1", step_cache.DEFAULT_THRESHOLD),
    (StepCacheRequest("first_block", 0.2), "qwen_image", 0.2),
    (StepCacheRequest("first_block", 1.0), "flux1", 1.0),
    (StepCacheRequest("first_block"), "zimage", FailedPrecondition),  # its blocks have no cache wiring
    (StepCacheRequest("first_block"), "sdxl", FailedPrecondition),  # a U-Net
    (StepCacheRequest("first_block", 0.0), "flux1", InvalidArgument),
    (StepCacheRequest("first_block", 1.5), "flux1", InvalidArgument),
    (StepCacheRequest("off", 0.1), "flux1", InvalidArgument),  # a threshold for nothing
])
def test_which_requests_cache(requested, family, expected):
    if isinstance(expected, type):
        with pytest.raises(expected):
            step_cache.parse(requested, family, family)
    else:
        assert step_cache.parse(requested, family, family) == expected


@pytest.mark.parametrize("threshold, compiled, refused", [
    (None, True, False), (None, False, False), (0.08, False, False), (0.08, True, True),
])
def test_a_compiled_model_cannot_skip_blocks(threshold, compiled, refused):
    if refused:
        with pytest.raises(FailedPrecondition, match="without compile"):
            step_cache.check_runnable(threshold, compiled)
    else:
        step_cache.check_runnable(threshold, compiled)


def pixels(image):
    return np.asarray(decode(image), dtype=int)


def cache_record(generation):
    return next(r for r in generation.result.resolved if r.control == "step_cache")


def test_first_block_cache_skips_passes_and_says_how_many(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-q", tiny_models["qwen_image"], speed_mode=c.SPEED_MODE_OFF)
    plain = result_of(client.generate("tiny-q", seeds=[3], steps=8))
    assert not [r for r in plain.result.resolved if r.control == "step_cache"]
    eager = result_of(client.generate("tiny-q", seeds=[3], steps=8,
                                      step_cache=pb.StepCache(mode=FIRST, threshold=1.0)))
    record = cache_record(eager)
    full, passes = (int(x) for x in record.applied.split(": ")[1].split(" denoiser")[0].split(" of "))
    assert passes >= 8 and 1 <= full < passes, record.applied  # a huge threshold skips most passes
    assert record.source == c.SETTING_SOURCE_EXPLICIT and "changes the image" in record.reason
    assert np.abs(pixels(eager.images[0]) - pixels(plain.images[0])).max() > 0
    assert read_png_recipe(eager.images[0].data)["step_cache"] == {"mode": "first_block", "threshold": 1.0}
    # a threshold nothing falls under runs every pass in full: the uncached image, exactly
    strict = result_of(client.generate("tiny-q", seeds=[3], steps=8,
                                       step_cache=pb.StepCache(mode=FIRST, threshold=1e-9)))
    full, passes = (int(x) for x in cache_record(strict).applied.split(": ")[1].split(" denoiser")[0].split(" of "))
    assert full == passes
    assert (pixels(strict.images[0]) == pixels(plain.images[0])).all()  # (the PNG's recipe differs)
    # and the cache is gone afterwards: the next uncached image is the first one again
    assert result_of(client.generate("tiny-q", seeds=[3], steps=8)).images[0].data == plain.images[0].data


def test_flux_caches_and_z_image_is_refused_before_queueing(inference_service, tiny_models):
    _, client = inference_service
    client.load("tiny-f", tiny_models["flux1"], speed_mode=c.SPEED_MODE_OFF)
    cached = result_of(client.generate("tiny-f", seeds=[1], steps=6, step_cache=pb.StepCache(mode=FIRST,
                                                                                              threshold=1.0)))
    assert " of " in cache_record(cached).applied
    client.load("tiny-z", tiny_models["zimage"], speed_mode=c.SPEED_MODE_OFF)
    with pytest.raises(grpc.RpcError) as refused:
        client.generate("tiny-z", step_cache=pb.StepCache(mode=FIRST))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "FLUX.1 and Qwen-Image" in refused.value.details()
    with pytest.raises(grpc.RpcError) as bad:
        client.generate("tiny-z", step_cache=pb.StepCache(mode=FIRST, threshold=-1))
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
