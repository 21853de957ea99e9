"""qkv_fusion on the tiny pipelines: FLUX.1's fused attention holds each weight once and gives the unfused image;
split returns to the separate projections without a copy. Qwen-Image's and Z-Image's attention does not fuse."""
import numpy as np
import pytest
import torch

from diffusion_kit.families import FAMILIES
from inference_service import qkv_fusion


def weight_bytes(model) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()]}
    return sum(storages.values())


def test_fused_attention_holds_each_weight_once_and_gives_the_same_image(tiny_models):
    import diffusers

    spec = FAMILIES["flux1"]
    pipe = getattr(diffusers, spec.pipeline_class).from_pretrained(tiny_models["flux1"])
    denoiser = getattr(pipe, spec.denoiser)

    def image():
        return pipe(prompt="a card", num_inference_steps=2, height=64, width=64, output_type="np",
                    generator=torch.Generator().manual_seed(0)).images

    unfused, before = image(), weight_bytes(denoiser)
    assert qkv_fusion.fuse(denoiser)
    attn = next(m for m in denoiser.modules() if getattr(m, "fused_projections", False))
    assert attn.to_q.weight.untyped_storage().data_ptr() == attn.to_qkv.weight.untyped_storage().data_ptr()
    assert weight_bytes(denoiser) == before  # diffusers' own fusion alone adds a second copy of q, k and v
    assert np.abs(image() - unfused).max() <= 1e-5
    assert qkv_fusion.split(denoiser) and not hasattr(attn, "to_qkv") and not qkv_fusion.split(denoiser)
    assert weight_bytes(denoiser) == before
    assert np.abs(image() - unfused).max() <= 1e-5


@pytest.mark.parametrize("family", ["qwen_image", "zimage"])
def test_a_model_whose_attention_does_not_fuse_is_left_alone_and_says_so(tiny_models, family):
    """Qwen-Image's model has diffusers' fuse_qkv_projections, but none of its attention modules fuses: the Load's
    record must not say fused (it did before fuse() looked)."""
    import diffusers

    spec = FAMILIES[family]
    denoiser = getattr(diffusers, spec.denoiser_class).from_pretrained(tiny_models[family], subfolder=spec.denoiser)
    before = weight_bytes(denoiser)
    assert not qkv_fusion.fuse(denoiser) and not qkv_fusion.split(denoiser)
    assert weight_bytes(denoiser) == before
