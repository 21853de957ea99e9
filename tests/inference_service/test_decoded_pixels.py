"""The service rounds decoded images to 8 bits on the pipeline's device: the same pixels as diffusers' own PIL
output, for every family."""
import numpy as np
import pytest
import torch

from inference_service.generation import pil_images


@pytest.mark.parametrize("family", ["zimage", "flux1", "qwen_image", "sdxl"])
def test_pixels_match_the_pipelines_pil_output(tiny_models, family):
    import diffusers

    from diffusion_kit.families import FAMILIES

    pipe = getattr(diffusers, FAMILIES[family].pipeline_class).from_pretrained(tiny_models[family])
    kwargs = {"prompt": "a red cube", "height": 64, "width": 64, "num_inference_steps": 2, "num_images_per_prompt": 2}

    def images(output_type):
        generator = [torch.Generator("cpu").manual_seed(s) for s in (1, 2)]
        return pipe(**kwargs, generator=generator, output_type=output_type).images

    theirs, ours = images("pil"), pil_images(images("pt"))
    assert [im.mode for im in ours] == [im.mode for im in theirs] == ["RGB", "RGB"]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(ours, theirs))
    assert not np.array_equal(np.asarray(ours[0]), np.asarray(ours[1]))  # two seeds, two images
