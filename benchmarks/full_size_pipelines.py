"""Full-size random-weight pipelines with the real architecture configs, for speed and memory measurements.

Speed does not depend on weight values, so these stand in for the real checkpoints (which
cannot be downloaded on the GPU machine). Tokenizers are the tiny in-memory ones: the
models still see full-length sequences (FLUX pads T5 to 512 tokens).
"""
from __future__ import annotations

from pathlib import Path

import torch

from demos.tiny_pipelines import clip_tokenizer, qwen_tokenizer, t5_tokenizer


def _flux_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                         down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                         block_out_channels=[128, 256, 512, 512], layers_per_block=2, norm_num_groups=32,
                         scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False)


def build_zimage():
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    tokenizer = qwen_tokenizer()
    transformer = ZImageTransformer2DModel()  # the released Z-Image config: dim 3840, 30 layers
    with torch.no_grad():
        transformer.x_pad_token.normal_()
        transformer.cap_pad_token.normal_()
    text_encoder = Qwen3Model(Qwen3Config(  # Qwen3-4B
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
        rope_theta=1_000_000.0, tie_word_embeddings=True))
    return ZImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=_flux_vae(),
                          text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


def build_flux():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    transformer = FluxTransformer2DModel(guidance_embeds=True)  # FLUX.1-dev: 19 double + 38 single blocks
    clip = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                                        num_attention_heads=12, vocab_size=49408, max_position_embeddings=77,
                                        projection_dim=768))
    t5 = T5EncoderModel(T5Config(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, vocab_size=32128,
                                 feed_forward_proj="gated-gelu", relative_attention_num_buckets=32))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    return FluxPipeline(scheduler=scheduler, vae=_flux_vae(), text_encoder=clip, tokenizer=clip_tokenizer(),
                        text_encoder_2=t5, tokenizer_2=t5_tokenizer(), transformer=transformer)


BUILDERS = {"zimage": build_zimage, "flux1": build_flux}


def save_full_size(family: str, directory: Path) -> Path:
    """Initialises on the GPU in bf16 (seconds instead of minutes) and saves a diffusers directory."""
    directory = Path(directory)
    if (directory / "model_index.json").exists():
        return directory
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        torch.set_default_dtype(torch.bfloat16)
        try:
            pipe = BUILDERS[family]()
        finally:
            torch.set_default_dtype(torch.float32)
    pipe.save_pretrained(directory, max_shard_size="10GB")
    del pipe
    torch.cuda.empty_cache()
    return directory
