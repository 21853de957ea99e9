"""Makes a random LoRA adapter for a tiny pipeline and publishes it to a store, as training would."""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from diffusion_kit.adapter_store import WEIGHTS, AdapterInfo, AdapterStore
from diffusion_kit.families import FAMILIES


def publish_random_adapter(store: AdapterStore, family: str, pipeline_dir: Path, adapter_id: str, rank: int = 4,
                           alpha: float = 8.0, seed: int = 0) -> AdapterInfo:
    import diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    spec = FAMILIES[family]
    denoiser = getattr(diffusers, spec.denoiser_class).from_pretrained(pipeline_dir, subfolder=spec.denoiser)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(spec.lora_targets), init_lora_weights="gaussian")
    denoiser.add_adapter(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in denoiser.named_parameters():
            if "lora_B" in name:  # B starts at zero; make the adapter actually change the output
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    layers = get_peft_model_state_dict(denoiser)
    pipeline_cls = getattr(diffusers, spec.pipeline_class)
    metadata = config.to_dict()
    metadata["target_modules"] = sorted(metadata["target_modules"])
    with tempfile.TemporaryDirectory() as tmp:
        pipeline_cls.save_lora_weights(tmp, **{f"{spec.denoiser}_lora_layers": layers,
                                              f"{spec.denoiser}_lora_adapter_metadata": metadata})
        info = AdapterInfo(adapter_id=adapter_id, family=family, base=str(pipeline_dir), rank=rank, alpha=alpha,
                           lora_config=metadata, steps=0, resolution=64)
        return store.publish(info, Path(tmp) / WEIGHTS)
