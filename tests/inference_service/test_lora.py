"""LoRA adapters by id at generation time, against a real service and a real adapter store."""
import grpc
import numpy as np
import pytest

from diffusion.v1 import inference_pb2 as pb
from diffusion_kit.adapter_store import AdapterStore
from service_kit.error_interceptor import error_info
from service_kit.service_process import start_service
from tests.inference_service.harness import InferenceClient, decode, result_of
from tests.inference_service.lora_helper import publish_random_adapter


@pytest.fixture(scope="module")
def lora_setup(tiny_models, tmp_path_factory):
    store = AdapterStore(tmp_path_factory.mktemp("adapters"))
    publish_random_adapter(store, "zimage", tiny_models["zimage"], "z-style", seed=1)
    publish_random_adapter(store, "zimage", tiny_models["zimage"], "z-other", seed=2)
    publish_random_adapter(store, "flux1", tiny_models["flux1"], "flux-style", seed=3)
    proc = start_service("inference_service", *InferenceClient.TEST_FLAGS, "--adapter-store", str(store.root),
                         timeout=180)
    client = InferenceClient(proc.address)
    client.load("tiny-z", tiny_models["zimage"])
    yield store, client
    client.close()
    proc.stop()


def image(client, adapters=(), seed=9):
    refs = [pb.AdapterRef(adapter_id=a, weight=w) for a, w in adapters]
    return result_of(client.generate("tiny-z", seeds=[seed], adapters=refs))


def pixels(data: bytes) -> bytes:
    return decode(pb.GeneratedImage(data=data)).tobytes()


def test_weight_zero_is_the_base_image_and_weight_one_changes_it(lora_setup):
    store, client = lora_setup
    base = image(client).images[0].data
    styled = image(client, [("z-style", 1.0)])
    assert styled.images[0].data != base
    records = {r.control: r for r in styled.resolved}
    assert records["adapter:z-style"].applied == "1"
    zero = image(client, [("z-style", 0.0)]).images[0].data
    assert pixels(zero) == pixels(base)  # exactly the base image (the recipe text records the adapter)
    assert zero != base
    assert image(client).images[0].data == base  # no adapters again: the base model exactly
    assert store.live_pins("z-style") == ["inference-0"]  # loaded, so it may not be deleted


def test_several_adapters_and_weights(lora_setup):
    _, client = lora_setup
    one = image(client, [("z-style", 1.0)]).images[0].data
    both = image(client, [("z-style", 1.0), ("z-other", 0.7)]).images[0].data
    half = image(client, [("z-style", 0.5)]).images[0].data
    assert len({one, both, half}) == 3


@pytest.mark.parametrize("adapter, code, reason", [
    ("flux-style", grpc.StatusCode.INVALID_ARGUMENT, "ADAPTER_FAMILY_MISMATCH"),
    ("missing", grpc.StatusCode.NOT_FOUND, "ADAPTER_NOT_FOUND"),
    ("../etc", grpc.StatusCode.INVALID_ARGUMENT, "BAD_ADAPTER_ID"),
])
def test_bad_adapters_are_rejected_before_queueing(lora_setup, adapter, code, reason):
    _, client = lora_setup
    with pytest.raises(grpc.RpcError) as e:
        image(client, [(adapter, 1.0)])
    assert e.value.code() == code and error_info(e.value).reason == reason


def test_pinned_adapter_cannot_be_deleted_until_unloaded(lora_setup, tiny_models):
    from service_kit.errors import FailedPrecondition

    store, client = lora_setup
    image(client, [("z-other", 1.0)])
    with pytest.raises(FailedPrecondition, match="loaded by inference-0"):
        store.delete("z-other")
    client.stub.Unload(pb.UnloadRequest(model_id="tiny-z"))
    assert store.live_pins("z-other") == []
    store.delete("z-other")
    assert [a.adapter_id for a in store.list()] == ["flux-style", "z-style"]
    client.load("tiny-z", tiny_models["zimage"])


def test_compiled_model_hotswaps_without_recompiling(lora_setup, tiny_models):
    from diffusion.v1 import common_pb2 as c

    store, client = lora_setup
    publish_random_adapter(store, "zimage", tiny_models["zimage"], "z-third", seed=4)
    client.load("tiny-zc", tiny_models["zimage"], speed_mode=c.SPEED_MODE_DEFAULT)

    def run(adapters=()):
        refs = [pb.AdapterRef(adapter_id=a, weight=w) for a, w in adapters]
        return result_of(client.generate("tiny-zc", seeds=[9], adapters=refs))

    base = run().images[0].data
    first = run([("z-style", 1.0)])
    assert first.images[0].data != base
    hotswap = {r.control: r for r in first.resolved}["adapter_hotswap"]
    assert "recompile once" in hotswap.reason
    traced = lambda generation: "compile_trace" in {r.control for r in generation.resolved}  # noqa: E731
    assert traced(first)  # the record that says what dynamo really did agrees
    second = run([("z-third", 1.0)])
    assert "without recompiling" in {r.control: r for r in second.resolved}["adapter_hotswap"].reason
    assert second.images[0].data != first.images[0].data and not traced(second)
    # Many different weights: written into the slot in place (set_adapters here hit dynamo's recompile limit).
    weighted = [run([("z-third", w)]) for w in (0.1, 0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.5, 1.7, 1.9)]
    assert not any(traced(g) for g in weighted)
    outputs = {g.images[0].data for g in weighted}
    assert len(outputs) == 10
    assert pixels(run([("z-third", 0.0)]).images[0].data) == pixels(base)
    assert run().images[0].data == base
    with pytest.raises(grpc.RpcError) as e:
        run([("z-style", 1.0), ("z-third", 1.0)])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(e.value).reason == "ONE_ADAPTER_WHEN_COMPILED"


def test_an_adapter_on_fused_attention_changes_the_image_as_on_the_separate_projections(lora_setup, tiny_models):
    """SPEED_MODE_MAX fuses FLUX.1's q, k and v projections into one, but an adapter's layers sit on the separate
    ones: a fused model's first adapter splits them again (its record says so), so the image is the one an
    unfused model gives with that adapter, attention layers included (before: they were left out, silently)."""
    from diffusion.v1 import common_pb2 as c

    _, client = lora_setup
    flux = lambda model_id, adapters=(): result_of(client.generate(  # noqa: E731
        model_id, seeds=[9], adapters=[pb.AdapterRef(adapter_id=a, weight=w) for a, w in adapters]))
    client.load("tiny-f-off", tiny_models["flux1"], speed_mode=c.SPEED_MODE_OFF)
    unfused = np.asarray(decode(flux("tiny-f-off", [("flux-style", 1.0)]).images[0]), dtype=int)
    client.load("tiny-f", tiny_models["flux1"], speed_mode=c.SPEED_MODE_MAX)
    base = flux("tiny-f")
    assert {r.control: r for r in base.resolved}["fused_qkv"].applied == "on"
    styled = flux("tiny-f", [("flux-style", 1.0)])
    assert styled.images[0].data != base.images[0].data
    records = {r.control: r for r in styled.resolved}
    assert (records["fused_qkv"].applied, records["fused_qkv"].status) == ("off", c.SETTING_STATUS_FELL_BACK)
    assert "separate q, k and v projections" in records["fused_qkv"].reason
    assert "fused q, k and v projections are split" in records["adapter_hotswap"].reason
    styled_pixels = np.asarray(decode(styled.images[0]), dtype=int)
    assert np.abs(styled_pixels - unfused).max() <= 2  # compiled against eager: rounding only
    client.stub.Unload(pb.UnloadRequest(model_id="tiny-f"))
    client.load("tiny-z", tiny_models["zimage"])  # the module's model, for the tests after
