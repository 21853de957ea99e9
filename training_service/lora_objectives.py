"""What a LoRA training step means for each family: its conditioning, its noise, its target, its forward.

The DiT families train by flow matching, x_t = (1 - s) * x0 + s * noise, and each predicts what its
own pipeline integrates, so an adapter means at inference what it meant here:
- Z-Image sees time as 1 - s and predicts x0 - noise (its pipeline negates the output);
- FLUX.1 and Qwen-Image see s and predict the velocity noise - x0, on 2x2-packed latents.
SDXL trains its U-Net on the DDPM schedule it was trained with: epsilon or v, as its scheduler says.

Conditioning is cached per caption on the CPU (batch dimension removed) and collated per batch.
Latents are (C, h, w) after each family's VAE normalisation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Batch:
    x0: torch.Tensor  # (B, C, h, w), fp32
    cond: dict[str, Any]
    geometry: list[tuple[int, ...]] = field(default_factory=list)  # per example: orig h, w, crop top, left, h, w


def _pack(x: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> (B, h/2 * w/2, 4C): the 2x2 patches FLUX and Qwen-Image see."""
    b, c, h, w = x.shape
    return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def _unpack(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    b, _, packed = x.shape
    c = packed // 4
    return x.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def _stack(conds: list[dict], key: str) -> torch.Tensor:
    return torch.stack([c[key] for c in conds])


def _shapes(value) -> tuple:
    """The shapes of the tensors in a collated condition (dicts and lists walked in order)."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape),)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return tuple(shape for item in items for shape in _shapes(item))


def _pad_stack(conds: list[dict], key: str, mask_key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length token sequences to one batch, zero-padded, with their masks."""
    longest = max(c[key].shape[0] for c in conds)
    out = torch.zeros(len(conds), longest, conds[0][key].shape[-1], dtype=conds[0][key].dtype)
    mask = torch.zeros(len(conds), longest, dtype=torch.long)
    for i, c in enumerate(conds):
        n = c[key].shape[0]
        out[i, :n] = c[key]
        mask[i, :n] = c[mask_key][:n]
    return out, mask


class FlowMatching:
    """Shared by the DiT families: logit-normal sigma, linear interpolation, one draw per example."""

    vae_class = "AutoencoderKL"
    negative_prompt = ""

    def shape_key(self, cond: dict) -> tuple:
        """What of a collated batch's conditions sets the shapes the denoiser's blocks see: graphs of static
        shapes (CUDA graphs) serve the batches of one key."""
        return _shapes(cond)

    def noisy(self, x0: torch.Tensor, generator: torch.Generator):
        """x0 noised at a logit-normal sigma, the sigma and the target, on x0's device. The draws come from the
        host's `generator` (the same noise on any device, and a checkpoint's generator state resumes it); the
        arithmetic runs where x0 is, elementwise in fp32, so the same bits as on the host."""
        noise = torch.randn(x0.shape, generator=generator).to(x0.device)
        sigma = torch.sigmoid(torch.randn((x0.shape[0],), generator=generator)).to(x0.device)
        s = sigma.view(-1, 1, 1, 1)
        return (1 - s) * x0 + s * noise, sigma, self.target(x0, noise)

    def target(self, x0, noise):
        return noise - x0

    def encode_image(self, vae, pixels: torch.Tensor) -> torch.Tensor:
        """The latent distribution's mode, not a sample: caching stays deterministic."""
        latent = vae.encode(pixels).latent_dist.mode()
        return (latent - (vae.config.shift_factor or 0.0)) * vae.config.scaling_factor


class ZImageObjective(FlowMatching):
    def encode_caption(self, pipe, caption: str, device) -> dict:
        embeds = pipe.encode_prompt(caption, device=device, do_classifier_free_guidance=False)[0][0]
        return {"cap": embeds}

    def collate(self, conds: list[dict]) -> dict:
        return {"cap": [c["cap"] for c in conds]}  # Z-Image takes a list: captions keep their own lengths

    def shape_key(self, cond: dict) -> tuple:
        """Z-Image pads each caption's sequence to a multiple of its SEQ_MULTI_OF tokens with a learned token
        (attended, not masked), so captions within one multiple give the blocks one shape."""
        from diffusers.models.transformers.transformer_z_image import SEQ_MULTI_OF

        return tuple(-(-len(cap) // SEQ_MULTI_OF) * SEQ_MULTI_OF for cap in cond["cap"])

    def target(self, x0, noise):
        return x0 - noise

    def predict(self, model, x_t, sigma, cond, batch: Batch):
        out = model([x.unsqueeze(1) for x in x_t], 1 - sigma, cond["cap"], return_dict=False)[0]
        return torch.stack([o.squeeze(1) for o in out])

    def sample_kwargs(self, cond: dict, negative: dict | None) -> dict:
        return {"prompt_embeds": [cond["cap"]]}


class FluxObjective(FlowMatching):
    def __init__(self, guidance: float = 3.5):
        self.guidance = guidance  # FLUX.1-dev is guidance-distilled: it trains at the guidance it samples with

    def encode_caption(self, pipe, caption: str, device) -> dict:
        embeds, pooled, _ = pipe.encode_prompt(caption, prompt_2=None, device=device, max_sequence_length=512)
        return {"embeds": embeds[0], "pooled": pooled[0]}

    def collate(self, conds: list[dict]) -> dict:
        return {"embeds": _stack(conds, "embeds"), "pooled": _stack(conds, "pooled")}

    def predict(self, model, x_t, sigma, cond, batch: Batch):
        from diffusers import FluxPipeline

        b, _, h, w = x_t.shape
        img_ids = FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, x_t.device, x_t.dtype)
        txt_ids = torch.zeros(cond["embeds"].shape[1], 3, device=x_t.device, dtype=x_t.dtype)
        guidance = (torch.full((b,), self.guidance, device=x_t.device, dtype=torch.float32)
                    if model.config.guidance_embeds else None)
        out = model(hidden_states=_pack(x_t), timestep=sigma, guidance=guidance, pooled_projections=cond["pooled"],
                    encoder_hidden_states=cond["embeds"], txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]
        return _unpack(out, h, w)

    def sample_kwargs(self, cond: dict, negative: dict | None) -> dict:
        return {"prompt_embeds": cond["embeds"][None], "pooled_prompt_embeds": cond["pooled"][None]}


class QwenImageObjective(FlowMatching):
    vae_class = "AutoencoderKLQwenImage"
    negative_prompt = " "

    def encode_caption(self, pipe, caption: str, device) -> dict:
        embeds, mask = pipe.encode_prompt(caption, device=device)
        mask = mask[0] if mask is not None else torch.ones(embeds.shape[1], dtype=torch.long)
        return {"embeds": embeds[0], "mask": mask.to(torch.long)}

    def encode_image(self, vae, pixels: torch.Tensor) -> torch.Tensor:
        latent = vae.encode(pixels.unsqueeze(2)).latent_dist.mode()[:, :, 0]  # one frame of the video VAE
        mean = torch.tensor(vae.config.latents_mean, device=latent.device, dtype=latent.dtype).view(1, -1, 1, 1)
        std = torch.tensor(vae.config.latents_std, device=latent.device, dtype=latent.dtype).view(1, -1, 1, 1)
        return (latent - mean) / std

    def collate(self, conds: list[dict]) -> dict:
        embeds, mask = _pad_stack(conds, "embeds", "mask")
        return {"embeds": embeds, "mask": mask}

    def predict(self, model, x_t, sigma, cond, batch: Batch):
        b, _, h, w = x_t.shape
        out = model(hidden_states=_pack(x_t), timestep=sigma, encoder_hidden_states=cond["embeds"],
                    encoder_hidden_states_mask=cond["mask"], img_shapes=[[(1, h // 2, w // 2)]] * b,
                    return_dict=False)[0]
        return _unpack(out, h, w)

    def sample_kwargs(self, cond: dict, negative: dict | None) -> dict:
        kw = {"prompt_embeds": cond["embeds"][None], "prompt_embeds_mask": cond["mask"][None]}
        if negative is not None:
            kw.update(negative_prompt_embeds=negative["embeds"][None], negative_prompt_embeds_mask=negative["mask"][None])
        return kw


class SDXLObjective:
    """DDPM noise at a uniformly drawn timestep; the target is what the scheduler's prediction_type says."""

    vae_class = "AutoencoderKL"
    negative_prompt = ""

    def __init__(self, base_dir: str):
        from diffusers import DDPMScheduler

        self.scheduler = DDPMScheduler.from_pretrained(base_dir, subfolder="scheduler")
        self.prediction_type = self.scheduler.config.prediction_type
        if self.prediction_type not in ("epsilon", "v_prediction"):
            raise ValueError(f"SDXL training supports epsilon and v_prediction, not {self.prediction_type}")

    def encode_caption(self, pipe, caption: str, device) -> dict:
        embeds, _, pooled, _ = pipe.encode_prompt(caption, device=device, do_classifier_free_guidance=False)
        return {"embeds": embeds[0], "pooled": pooled[0]}

    def encode_image(self, vae, pixels: torch.Tensor) -> torch.Tensor:
        return vae.encode(pixels).latent_dist.mode() * vae.config.scaling_factor

    def collate(self, conds: list[dict]) -> dict:
        return {"embeds": _stack(conds, "embeds"), "pooled": _stack(conds, "pooled")}

    def shape_key(self, cond: dict) -> tuple:
        return _shapes(cond)

    def noisy(self, x0: torch.Tensor, generator: torch.Generator):
        """As FlowMatching.noisy: host draws, arithmetic on x0's device (the scheduler moves its tables there)."""
        noise = torch.randn(x0.shape, generator=generator).to(x0.device)
        t = torch.randint(0, self.scheduler.config.num_train_timesteps, (x0.shape[0],), generator=generator
                          ).to(x0.device)
        x_t = self.scheduler.add_noise(x0, noise, t)
        target = noise if self.prediction_type == "epsilon" else self.scheduler.get_velocity(x0, noise, t)
        return x_t, t, target

    def predict(self, model, x_t, t, cond, batch: Batch):
        time_ids = torch.tensor(batch.geometry, device=x_t.device, dtype=x_t.dtype)
        return model(x_t, t, encoder_hidden_states=cond["embeds"],
                     added_cond_kwargs={"text_embeds": cond["pooled"], "time_ids": time_ids}, return_dict=False)[0]

    def sample_kwargs(self, cond: dict, negative: dict | None) -> dict:
        kw = {"prompt_embeds": cond["embeds"][None], "pooled_prompt_embeds": cond["pooled"][None]}
        if negative is not None:
            kw.update(negative_prompt_embeds=negative["embeds"][None],
                      negative_pooled_prompt_embeds=negative["pooled"][None])
        return kw


def objective_for(family: str, base_dir: str, guidance: float):
    if family == "zimage":
        return ZImageObjective()
    if family == "flux1":
        return FluxObjective(guidance)
    if family == "qwen_image":
        return QwenImageObjective()
    if family == "sdxl":
        return SDXLObjective(base_dir)
    raise ValueError(f"no training objective for {family}")


TRAINABLE = ("zimage", "flux1", "qwen_image", "sdxl")
