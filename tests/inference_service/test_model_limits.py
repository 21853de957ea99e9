"""model_limits: the sizes a loaded model takes. SDXL's pipeline refuses a side that is not a multiple of 8 (a
ValueError inside the call, which reached the caller as INTERNAL); with a VAE of two blocks, as the tiny SDXL
has, twice its scale factor is only 4, so 44 px passed the service's check and failed in the model (the compiled
warm-up's second call, at 44 px, failed the same way)."""
import pytest

from inference_service.model_limits import MAX_SIDE, model_limits


@pytest.mark.parametrize("family, vae_scale_factor, multiple", [
    ("sdxl", 8, 16),
    ("sdxl", 2, 8),        # the tiny SDXL: the pipeline's own rule of 8 wins over twice the scale factor
    ("sdxl", 4, 8),
    ("flux1", 8, 16),
    ("flux1", 2, 4),       # FLUX's pipeline asks only for twice the scale factor
    ("qwen_image", 8, 16),
    ("zimage", 8, 16),
])
def test_the_size_multiple_is_what_the_pipeline_accepts(family, vae_scale_factor, multiple):
    limits = model_limits(family, {}, vae_scale_factor)
    assert limits.size_multiple == multiple
    assert limits.max_width == limits.max_height == MAX_SIDE // multiple * multiple


def test_zimage_sizes_and_prompt_tokens_come_from_its_rotary_axes():
    limits = model_limits("zimage", {"axes_lens": [1536, 512, 512], "all_patch_size": [2]}, 8)
    assert (limits.max_width, limits.max_height) == (MAX_SIDE, MAX_SIDE)  # 512 positions x 16 px, capped
    small = model_limits("zimage", {"axes_lens": [258, 16, 24], "all_patch_size": [2]}, 8, 512)
    assert (small.max_height, small.max_width) == (256, 384) and small.max_prompt_tokens == 256
