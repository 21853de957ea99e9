"""Tiny random-weight pipelines of every family, built in code with no download.

They are real diffusers pipelines with the real classes, only small: they save with
`save_pretrained`, load with `from_pretrained`, and generate 64x64 in a few steps in
well under a second on a CPU. The tests and `make demo` use them; speed work uses the
full-size architectures instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-ins for the 256 byte values: a byte-level BPE alphabet with no merges."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for c in chars]


def qwen_tokenizer():
    from transformers import Qwen2Tokenizer

    vocab = {c: i for i, c in enumerate(_byte_chars())}
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[special] = len(vocab)
    return Qwen2Tokenizer(vocab=vocab, merges=[], chat_template=CHAT_TEMPLATE, model_max_length=512)


def clip_tokenizer():
    from transformers import CLIPTokenizer

    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    for c in chars:  # CLIP marks a word's last symbol with </w>
        vocab[c + "</w>"] = len(vocab)
    for special in ("<|startoftext|>", "<|endoftext|>"):
        vocab[special] = len(vocab)
    # Without model_max_length FLUX would pass an unbounded length to the 77-position CLIP.
    return CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def t5_tokenizer():
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -1.0)]
    pieces += [(chr(c), -2.0) for c in range(ord("a"), ord("z") + 1)]
    pieces += [(chr(c), -3.0) for c in [*range(ord("A"), ord("Z") + 1), *range(ord("0"), ord("9") + 1)]]
    pieces += [(p, -4.0) for p in ".,;:!?'\"-()"]
    return T5Tokenizer(vocab=pieces, extra_ids=0)


def _kl_vae(latent_channels: int, **kw):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
        block_out_channels=[32, 64], layers_per_block=1, latent_channels=latent_channels,
        norm_num_groups=32, sample_size=32, **kw)


def _clip_text(with_projection: bool = False):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    tok_len = len(clip_tokenizer())
    cfg = CLIPTextConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                         vocab_size=tok_len, max_position_embeddings=77, projection_dim=32,
                         bos_token_id=tok_len - 2, eos_token_id=tok_len - 1, pad_token_id=tok_len - 1)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(cfg)


def build_zimage():
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = qwen_tokenizer()
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[8, 4, 4], axes_lens=[256, 32, 32])
    with torch.no_grad():  # created with torch.empty upstream: NaNs unless filled
        transformer.x_pad_token.fill_(1.0)
        transformer.cap_pad_token.fill_(1.0)
    text_encoder = Qwen3Model(Qwen3Config(
        hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        head_dim=8, vocab_size=len(tokenizer), max_position_embeddings=512))
    vae = _kl_vae(16, scaling_factor=0.3611, shift_factor=0.1159)
    return ZImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae, text_encoder=text_encoder,
                          tokenizer=tokenizer, transformer=transformer)


def build_flux():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    t5_tok = t5_tokenizer()
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8],
        guidance_embeds=True)
    t5 = T5EncoderModel(T5Config(d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                                 vocab_size=len(t5_tok), relative_attention_num_buckets=8))
    vae = _kl_vae(4, scaling_factor=0.3611, shift_factor=0.1159)
    return FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=_clip_text(),
                        tokenizer=clip_tokenizer(), text_encoder_2=t5, tokenizer_2=t5_tok, transformer=transformer)


def build_qwen_image():
    from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                           QwenImageTransformer2DModel)
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = qwen_tokenizer()
    n = len(tokenizer)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4))
    vae = AutoencoderKLQwenImage(base_dim=24, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": n + 3, "bos_token_id": n - 3, "eos_token_id": n - 1,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
                     "rope_theta": 1000000.0},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=16, vocab_size=n + 3, bos_token_id=n - 3, eos_token_id=n - 1,
        vision_start_token_id=n, vision_end_token_id=n + 1, vision_token_id=n + 2)
    text_encoder = Qwen2_5_VLForConditionalGeneration(config).eval()
    return QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=tokenizer, transformer=transformer)


def build_sdxl():
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=2, sample_size=32, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=80, cross_attention_dim=64, norm_num_groups=1)
    scheduler = EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, steps_offset=1, beta_schedule="scaled_linear",
                                       timestep_spacing="leading")
    return StableDiffusionXLPipeline(
        vae=_kl_vae(4, scaling_factor=0.13025), text_encoder=_clip_text(), text_encoder_2=_clip_text(True),
        tokenizer=clip_tokenizer(), tokenizer_2=clip_tokenizer(), unet=unet, scheduler=scheduler,
        force_zeros_for_empty_prompt=True, add_watermarker=False)


BUILDERS: dict[str, Callable] = {
    "zimage": build_zimage,
    "flux1": build_flux,
    "qwen_image": build_qwen_image,
    "sdxl": build_sdxl,
}


def save_tiny_pipeline(family: str, directory: Path, seed: int = 0) -> Path:
    """Builds the family's tiny pipeline with a fixed seed and saves it as a diffusers directory."""
    torch.manual_seed(seed)
    pipe = BUILDERS[family]()
    directory = Path(directory)
    pipe.save_pretrained(directory)
    return directory
