"""LoRA training for the DiT families, written as a recipe: setup() in dependency order, then an explicit loop.

Flow matching: x_t = (1 - s) * x0 + s * noise with s drawn logit-normal; the target follows each
family's own inference convention, so the trained adapter means at inference what it meant here.
Every random draw comes from one generator whose state is checkpointed with the LoRA weights and the
optimizer, so a resumed run continues bit-identically. Only Z-Image is wired so far (see FORWARDS).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from diffusion_kit.families import FAMILIES, FamilySpec


@dataclass
class RecipeConfig:
    family: str
    base_dir: str
    examples: list[tuple[str, str]]  # (image path, caption)
    rank: int = 16
    alpha: float = 16.0
    learning_rate: float = 1e-4
    steps: int = 100
    resolution: int = 512
    seed: int = 0
    warmup_steps: int = 0
    device: str = "cpu"
    dtype: str = "fp32"  # base weights; LoRA parameters are always fp32
    checkpoint_every: int = 0

    def identity(self) -> dict:
        """What a checkpoint must match to be resumed: everything that changes the trajectory."""
        keys = ("family", "base_dir", "examples", "rank", "alpha", "learning_rate", "steps", "resolution", "seed",
                "warmup_steps", "dtype")
        return json.loads(json.dumps({k: asdict(self)[k] for k in keys}))  # as it reads back from disk


@dataclass
class StepReport:
    step: int
    total: int
    loss: float
    avg_loss: float
    lr: float
    grad_norm: float
    samples_per_s: float
    peak_memory_bytes: int


@dataclass
class RunState:
    step: int = 0
    losses: list[float] = field(default_factory=list)


def _zimage_forward(transformer, x_t: torch.Tensor, sigma: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
    """Z-Image sees time as 1 - sigma and predicts x0 - noise (its pipeline negates the output)."""
    out = transformer([x_t.unsqueeze(1)], 1 - sigma, [cond], return_dict=False)[0][0]
    return out.squeeze(1)


def _zimage_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    return x0 - noise


FORWARDS: dict[str, tuple[Callable, Callable]] = {"zimage": (_zimage_forward, _zimage_target)}


class DiTLoraRecipe:
    def __init__(self, cfg: RecipeConfig, emit: Callable[[str, dict], None] = lambda kind, data: None):
        if cfg.family not in FORWARDS:
            raise ValueError(f"the DiT recipe does not train {cfg.family} yet")
        if cfg.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("CUDA was asked for and is not available")
        self.cfg = cfg
        self.family: FamilySpec = FAMILIES[cfg.family]
        self.emit = emit
        self.dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[cfg.dtype]
        self.generator = torch.Generator("cpu").manual_seed(cfg.seed)
        self.state = RunState()

    # ---- setup: text encoder, then VAE, then the transformer, each freed before the next loads ----------

    def setup(self) -> None:
        self.emit("phase", {"phase": "encoding_text"})
        self.conds = self._encode_captions()
        self.emit("phase", {"phase": "caching_latents"})
        self.latents = self._cache_latents()
        self.emit("phase", {"phase": "loading_transformer"})
        self.transformer, self.params = self._load_transformer()
        self.optimizer = torch.optim.AdamW(self.params, lr=self.cfg.learning_rate)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)

    def _encode_captions(self) -> list[torch.Tensor]:
        import diffusers

        pipeline_cls = getattr(diffusers, self.family.pipeline_class)
        pipe = pipeline_cls.from_pretrained(self.cfg.base_dir, transformer=None, vae=None, torch_dtype=self.dtype)
        pipe.text_encoder.to(self.cfg.device)
        with torch.no_grad():
            conds = [pipe.encode_prompt(caption, device=self.cfg.device, do_classifier_free_guidance=False)[0][0]
                     .detach().to(torch.float32).cpu() for _, caption in self.cfg.examples]
        del pipe
        return conds

    def _cache_latents(self) -> list[torch.Tensor]:
        import numpy as np
        from diffusers import AutoencoderKL
        from PIL import Image

        vae = AutoencoderKL.from_pretrained(self.cfg.base_dir, subfolder="vae", torch_dtype=self.dtype).to(self.cfg.device)
        shift = vae.config.shift_factor or 0.0
        out = []
        side = self.cfg.resolution
        for path, _ in self.cfg.examples:
            image = Image.open(path).convert("RGB")
            scale = side / min(image.size)
            image = image.resize((max(side, round(image.width * scale)), max(side, round(image.height * scale))))
            left, top = (image.width - side) // 2, (image.height - side) // 2
            image = image.crop((left, top, left + side, top + side))
            pixels = torch.from_numpy(np.asarray(image, dtype=np.float32).copy()).permute(2, 0, 1)
            pixels = (pixels / 127.5 - 1).unsqueeze(0).to(self.cfg.device, self.dtype)
            with torch.no_grad():
                latent = vae.encode(pixels).latent_dist.mode()  # the mode, not a sample: caching stays deterministic
            out.append(((latent - shift) * vae.config.scaling_factor)[0].to(torch.float32).cpu())
        del vae
        return out

    def _load_transformer(self):
        import diffusers
        from peft import LoraConfig

        cls = getattr(diffusers, self.family.denoiser_class)
        transformer = cls.from_pretrained(self.cfg.base_dir, subfolder=self.family.denoiser, torch_dtype=self.dtype)
        transformer.requires_grad_(False)
        torch.manual_seed(self.cfg.seed)  # peft draws the LoRA init from the global generator
        transformer.add_adapter(LoraConfig(r=self.cfg.rank, lora_alpha=self.cfg.alpha, init_lora_weights="gaussian",
                                           target_modules=list(self.family.lora_targets)))
        transformer.to(self.cfg.device).train()
        params = [p for p in transformer.parameters() if p.requires_grad]
        for p in params:
            p.data = p.data.to(torch.float32)
        return transformer, params

    def _lr_factor(self, step: int) -> float:
        return min(1.0, (step + 1) / self.cfg.warmup_steps) if self.cfg.warmup_steps else 1.0

    # ---- the loop ------------------------------------------------------------------------------------

    def train(self, should_stop: Callable[[], bool] = lambda: False,
              checkpoint_dir: Path | None = None) -> RunState:
        forward, target_of = FORWARDS[self.cfg.family]
        while self.state.step < self.cfg.steps and not should_stop():
            t0 = time.perf_counter()
            i = self.state.step % len(self.latents)
            x0 = self.latents[i].to(self.cfg.device)
            noise = torch.randn(x0.shape, generator=self.generator).to(self.cfg.device)
            sigma = torch.sigmoid(torch.randn((1,), generator=self.generator)).to(self.cfg.device)
            x_t = ((1 - sigma) * x0 + sigma * noise).to(self.dtype)
            pred = forward(self.transformer, x_t, sigma.to(self.dtype), self.conds[i].to(self.cfg.device, self.dtype))
            loss = torch.nn.functional.mse_loss(pred.float(), target_of(x0, noise).float())
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            self.optimizer.step()
            self.schedule.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.state.step += 1
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"loss became {value} at step {self.state.step}")
            self.state.losses.append(value)
            window = self.state.losses[-20:]
            peak = torch.cuda.max_memory_allocated() if self.cfg.device.startswith("cuda") else 0
            self.emit("step", asdict(StepReport(self.state.step, self.cfg.steps, value, sum(window) / len(window),
                                                self.schedule.get_last_lr()[0], float(grad_norm),
                                                1 / max(1e-9, time.perf_counter() - t0), peak)))
            if checkpoint_dir and self.cfg.checkpoint_every and self.state.step % self.cfg.checkpoint_every == 0:
                self.save_checkpoint(checkpoint_dir)
        return self.state

    # ---- checkpoints: atomic, identity-checked -------------------------------------------------------

    def lora_state(self) -> dict[str, torch.Tensor]:
        from peft.utils import get_peft_model_state_dict

        return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.transformer).items()}

    def save_checkpoint(self, directory: Path) -> Path:
        """Written to a staging folder, then renamed over the previous checkpoint in one step."""
        import os
        import shutil

        directory = Path(directory)
        staging = directory.with_name(directory.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        torch.save({"lora": self.lora_state(), "optimizer": self.optimizer.state_dict(),
                    "schedule": self.schedule.state_dict(), "generator": self.generator.get_state(),
                    "step": self.state.step, "losses": self.state.losses}, staging / "state.pt")
        (staging / "identity.json").write_text(json.dumps(self.cfg.identity(), sort_keys=True))
        old = directory.with_name(directory.name + ".old")
        if directory.exists():
            os.replace(directory, old)
        os.replace(staging, directory)
        shutil.rmtree(old, ignore_errors=True)
        self.emit("checkpoint", {"step": self.state.step, "path": str(directory)})
        return directory

    def load_checkpoint(self, directory: Path) -> None:
        from peft.utils import set_peft_model_state_dict

        identity = json.loads((Path(directory) / "identity.json").read_text())
        if identity != self.cfg.identity():
            changed = sorted(k for k in identity if identity[k] != self.cfg.identity().get(k))
            raise ValueError(f"checkpoint {directory} belongs to a different run (differs in {', '.join(changed)})")
        saved = torch.load(Path(directory) / "state.pt", weights_only=False)
        set_peft_model_state_dict(self.transformer, saved["lora"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.schedule.load_state_dict(saved["schedule"])
        self.generator.set_state(saved["generator"])
        self.state = RunState(saved["step"], saved["losses"])

    def export_adapter(self, directory: Path) -> Path:
        """The diffusers/peft layout, with the LoRA config in the safetensors metadata so alpha reloads right."""
        import diffusers
        from peft.utils import get_peft_model_state_dict

        config = self.transformer.peft_config["default"].to_dict()
        config["target_modules"] = sorted(config["target_modules"])
        pipeline_cls = getattr(diffusers, self.family.pipeline_class)
        pipeline_cls.save_lora_weights(
            str(directory), **{f"{self.family.denoiser}_lora_layers": get_peft_model_state_dict(self.transformer),
                               f"{self.family.denoiser}_lora_adapter_metadata": config})
        return Path(directory)
