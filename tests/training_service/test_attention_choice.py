"""Table tests of which SDPA kernels a training step pins, and that the record, the plan and the child agree."""
import pytest

from diffusion_kit.families import FAMILIES
from training_service.attention_choice import CUDNN_FIRST, KERNELS, PINNED, compile_cache_tag, training_attention
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


MAX_BF16 = dict(speed_max=True, precision="bf16", compiled=True, checkpointing=False)


@pytest.mark.parametrize("family, device, asked, step, kernels", [
    ("zimage", "cuda", (), MAX_BF16, CUDNN_FIRST),  # the one combination measured under cuDNN
    ("zimage", "cuda", (), {**MAX_BF16, "speed_max": False}, PINNED),  # DEFAULT keeps flash
    ("zimage", "cuda", (), {**MAX_BF16, "checkpointing": True}, PINNED),
    ("zimage", "cuda", (), {**MAX_BF16, "precision": "nf4"}, PINNED),
    ("zimage", "cuda", (), {**MAX_BF16, "precision": "fp8"}, PINNED),
    ("zimage", "cuda", (), {**MAX_BF16, "compiled": False}, PINNED),
    ("flux1", "cuda", (), MAX_BF16, PINNED),  # cuDNN crashed FLUX's step
    ("zimage", "cpu", (), MAX_BF16, ()),
    ("zimage", "cuda", ("flash",), MAX_BF16, ("flash",)),  # an override still wins
])
def test_speed_mode_max_puts_cudnn_first_only_where_it_was_measured(family, device, asked, step, kernels):
    choice = training_attention(family, device, asked, **step)
    assert choice.kernels == kernels
    if step["speed_max"] and kernels == PINNED:  # the record says why MAX did not change the pin
        assert "SPEED_MODE_MAX on Z-Image's compiled bf16 step without gradient checkpointing only" in choice.reason


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
