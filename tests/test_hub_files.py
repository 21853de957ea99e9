"""Which hub files a load fetches: one weight variant, configs and tokenizers, nothing else."""
import pytest

from diffusion_kit.hub_files import choose_files
from service_kit.errors import InvalidArgument

INDEX = {"_class_name": "StableDiffusionXLPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
         "vae": ["diffusers", "AutoencoderKL"], "tokenizer": ["transformers", "CLIPTokenizer"],
         "safety_checker": [None, None]}
REPO = [
    ("model_index.json", 1), ("README.md", 5), ("sd_xl_base_1.0.safetensors", 6000),
    ("unet/config.json", 2), ("unet/diffusion_pytorch_model.safetensors", 1000),
    ("unet/diffusion_pytorch_model.fp16.safetensors", 500), ("unet/diffusion_pytorch_model.bin", 1000),
    ("vae/config.json", 2), ("vae/diffusion_pytorch_model.safetensors", 100),
    ("tokenizer/vocab.json", 3), ("tokenizer/merges.txt", 3), ("tokenizer/tokenizer_config.json", 1),
]


@pytest.mark.parametrize("variant, weights, total, fallbacks", [
    ("", ["unet/diffusion_pytorch_model.safetensors", "vae/diffusion_pytorch_model.safetensors"], 1112, ()),
    ("fp16", ["unet/diffusion_pytorch_model.fp16.safetensors", "vae/diffusion_pytorch_model.safetensors"], 612,
     ("vae",)),
])
def test_one_variant_of_the_weights(variant, weights, total, fallbacks):
    choice = choose_files(REPO, INDEX, variant)
    assert [f for f in choice.files if f.endswith(".safetensors")] == weights
    assert {"model_index.json", "unet/config.json", "tokenizer/merges.txt", "tokenizer/vocab.json"} <= set(choice.files)
    assert not any(f.endswith((".bin", ".md")) or "/" not in f and f != "model_index.json" for f in choice.files)
    assert (choice.total_bytes, choice.plain_fallbacks) == (total, fallbacks)


def test_sharded_variant_weights_and_their_index():
    repo = [("model_index.json", 1), ("unet/config.json", 1),
            ("unet/diffusion_pytorch_model-00001-of-00002.safetensors", 10),
            ("unet/diffusion_pytorch_model-00002-of-00002.safetensors", 10),
            ("unet/diffusion_pytorch_model.safetensors.index.json", 1),
            ("unet/diffusion_pytorch_model.fp16-00001-of-00002.safetensors", 5),
            ("unet/diffusion_pytorch_model.fp16-00002-of-00002.safetensors", 5),
            ("unet/diffusion_pytorch_model.safetensors.index.fp16.json", 1)]
    index = {"unet": ["diffusers", "UNet2DConditionModel"]}
    assert choose_files(repo, index).total_bytes == 1 + 1 + 10 + 10 + 1
    fp16 = choose_files(repo, index, "fp16")
    assert fp16.total_bytes == 1 + 1 + 5 + 5 + 1 and "unet/diffusion_pytorch_model.safetensors.index.json" \
        not in fp16.files


def test_a_component_with_only_variant_weights_needs_the_variant():
    repo = [("model_index.json", 1), ("unet/config.json", 1), ("unet/diffusion_pytorch_model.fp16.safetensors", 5)]
    with pytest.raises(InvalidArgument, match="only variant weights: unet \\(fp16\\)"):
        choose_files(repo, {"unet": ["diffusers", "UNet2DConditionModel"]})
    assert choose_files(repo, {"unet": ["diffusers", "UNet2DConditionModel"]}, "fp16").total_bytes == 7
