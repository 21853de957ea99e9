"""Table tests of which SDPA kernels a training step pins, and that the record, the plan and the child agree."""
import pytest

from diffusion_kit.families import FAMILIES
from training_service.attention_choice import KERNELS, PINNED, compile_cache_tag, training_attention
from tests.training_service.test_run_settings import H200, CPU, by_control, run


@pytest.mark.parametrize("family, device, asked, kernels", [
    ("flux1", "cuda", (), PINNED),
    ("zimage", "cuda:1", (), PINNED),
    ("flux1", "cpu", (), ()),
    ("zimage", "cpu", ("cudnn",), ()),  # no GPU: nothing to pin, whatever was asked
    ("zimage", "cuda", ("cudnn", "flash"), ("cudnn", "flash")),
])
def test_kernels_by_family_device_and_override(family, device, asked, kernels):
    assert training_attention(family, device, asked).kernels == kernels


@pytest.mark.parametrize("kernels, tag", [
    ((), ""),  # no pin: the caches' keys stay as torch makes them
    (("flash", "efficient"), "sdpa:flash,efficient"),
    (("efficient", "flash"), "sdpa:efficient,flash"),  # the order is the priority, so it is part of the key
    (("cudnn", "flash", "efficient"), "sdpa:cudnn,flash,efficient"),
])
def test_each_pin_has_its_own_compile_cache_tag(kernels, tag):
    assert compile_cache_tag(kernels) == tag


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="math"):
        training_attention("zimage", "cuda", ("math",))


def test_every_pinned_kernel_is_a_fused_sdpa_backend():
    from training_service.attention_choice import sdpa_backends

    assert len(sdpa_backends(KERNELS)) == len(KERNELS)
    for family in FAMILIES:
        assert set(training_attention(family, "cuda").kernels) <= set(KERNELS)


@pytest.mark.parametrize("caps, applied, kernels, says", [
    (H200, "PRECISION_BF16", PINNED, "pinned"),
    (CPU, "PRECISION_FP32", (), "PyTorch's choice"),
])
def test_the_record_says_what_the_recipe_pins(caps, applied, kernels, says):
    settings = run(caps, FAMILIES["zimage"], applied)
    assert settings.attention == kernels
    record = by_control(settings)["attention"]
    assert says in record.applied and all(k in record.applied for k in kernels)
