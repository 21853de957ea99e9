"""The family registry: everything that differs between FLUX.1, Z-Image, Qwen-Image and SDXL.

Adding a family is one entry in FAMILIES. Sizes are the bf16 weight bytes of the real
checkpoints (parameter counts x 2), used by the memory planner and the training auto policy.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from diffusion.v1 import common_pb2
from diffusion_kit.precision import Precision
from service_kit.errors import InvalidArgument, NotFound

GB = 10**9


@dataclass(frozen=True)
class FamilySpec:
    key: str
    proto: int
    display: str
    pipeline_class: str
    denoiser: str  # the pipeline component that denoises: "transformer" or "unet"
    denoiser_class: str
    # The keyword that carries the guidance scale, and whether it is real CFG (needs a negative prompt pass).
    guidance_kwarg: str
    guidance_is_cfg: bool
    takes_negative_prompt: bool
    # Renders black in fp16: promote to fp32 instead.
    fp16_incompatible: bool
    default_steps: int
    default_guidance: float
    default_resolution: int
    lora_targets: tuple[str, ...]
    denoiser_bytes: int
    companions_bytes: int  # text encoders + VAE, bf16
    default_repo: str
    # Precisions that corrupt this family's output (activation outliers beyond fp8's range).
    denied_precisions: frozenset[Precision] = frozenset()
    # How many text tokens the default pipeline call encodes (for per-step FLOP estimates).
    max_sequence_length: int = 512
    # Name fragments of the denoiser's Linear layers that see one row per sample, not per token: the
    # timestep/guidance/pooled-text embedders and the AdaLN modulation projections. int8's dynamic-activation
    # matmul needs more than 16 rows, and a one-row product is bound by reading the weight anyway.
    per_sample_linears: tuple[str, ...] = ()

    @property
    def is_unet(self) -> bool:
        """A U-Net family (SDXL): epsilon/v objectives, no base-precision choice, no transformer blocks."""
        return self.denoiser == "unet"

    def is_per_sample(self, fqn: str) -> bool:
        return any(fragment in fqn for fragment in self.per_sample_linears)

    @property
    def dense_bytes(self) -> int:
        return self.denoiser_bytes + self.companions_bytes


FAMILIES: dict[str, FamilySpec] = {
    "flux1": FamilySpec(
        key="flux1", proto=common_pb2.FAMILY_FLUX1, display="FLUX.1", pipeline_class="FluxPipeline",
        denoiser="transformer", denoiser_class="FluxTransformer2DModel",
        guidance_kwarg="guidance_scale", guidance_is_cfg=False, takes_negative_prompt=False,
        fp16_incompatible=False, default_steps=28, default_guidance=3.5, default_resolution=1024,
        lora_targets=("to_q", "to_k", "to_v", "to_out.0"),
        denoiser_bytes=int(11.9e9 * 2), companions_bytes=int((4.76e9 + 0.12e9 + 0.08e9) * 2),
        default_repo="black-forest-labs/FLUX.1-dev",
        per_sample_linears=("time_text_embed.", "norm1.linear", "norm1_context.linear", "norm.linear", "norm_out.linear")),
    "zimage": FamilySpec(
        key="zimage", proto=common_pb2.FAMILY_ZIMAGE, display="Z-Image", pipeline_class="ZImagePipeline",
        denoiser="transformer", denoiser_class="ZImageTransformer2DModel",
        guidance_kwarg="guidance_scale", guidance_is_cfg=True, takes_negative_prompt=True,
        fp16_incompatible=True, default_steps=9, default_guidance=0.0, default_resolution=1024,
        lora_targets=("to_q", "to_k", "to_v", "to_out.0"),
        denoiser_bytes=int(6.15e9 * 2), companions_bytes=int((4.02e9 + 0.08e9) * 2),
        default_repo="Tongyi-MAI/Z-Image-Turbo", per_sample_linears=("t_embedder.", "adaLN_modulation.")),
    "qwen_image": FamilySpec(
        key="qwen_image", proto=common_pb2.FAMILY_QWEN_IMAGE, display="Qwen-Image", pipeline_class="QwenImagePipeline",
        denoiser="transformer", denoiser_class="QwenImageTransformer2DModel",
        guidance_kwarg="true_cfg_scale", guidance_is_cfg=True, takes_negative_prompt=True,
        fp16_incompatible=False, default_steps=50, default_guidance=4.0, default_resolution=1328,
        lora_targets=("to_q", "to_k", "to_v", "to_out.0"),
        denoiser_bytes=int(20.4e9 * 2), companions_bytes=int((8.3e9 + 0.13e9) * 2),
        default_repo="Qwen/Qwen-Image",
        per_sample_linears=("time_text_embed.", "img_mod.", "txt_mod.", "norm_out.linear"),
        denied_precisions=frozenset({Precision.FP8, Precision.MXFP8})),
    "sdxl": FamilySpec(
        key="sdxl", proto=common_pb2.FAMILY_SDXL, display="SDXL", pipeline_class="StableDiffusionXLPipeline",
        denoiser="unet", denoiser_class="UNet2DConditionModel",
        guidance_kwarg="guidance_scale", guidance_is_cfg=True, takes_negative_prompt=True,
        fp16_incompatible=False, default_steps=30, default_guidance=5.0, default_resolution=1024,
        lora_targets=("to_q", "to_k", "to_v", "to_out.0"),
        denoiser_bytes=int(2.57e9 * 2), companions_bytes=int((0.12e9 + 0.69e9 + 0.08e9) * 2),
        default_repo="stabilityai/stable-diffusion-xl-base-1.0", max_sequence_length=77,
        per_sample_linears=("time_embedding.", "add_embedding.", "time_emb_proj")),
}

BY_PROTO = {spec.proto: spec for spec in FAMILIES.values()}
BY_PIPELINE = {spec.pipeline_class: spec for spec in FAMILIES.values()}


class UnknownFamily(ValueError):
    pass


def family_from_proto(value: int) -> FamilySpec:
    try:
        return BY_PROTO[value]
    except KeyError:
        names = ", ".join(common_pb2.Family.Name(v) for v in BY_PROTO)
        raise UnknownFamily(f"unknown family {value}; use one of {names}") from None


def family_of_pipeline_dir(path: Path) -> FamilySpec:
    """The family a diffusers directory holds, from model_index.json's _class_name."""
    index = json.loads((Path(path) / "model_index.json").read_text())
    if not isinstance(index, dict):
        raise UnknownFamily(f"{path}/model_index.json is not a JSON object")
    # Component names become folder names when the pipeline loads: none may leave the directory.
    bad = [str(name)[:40] for name in index if not re.fullmatch(r"[A-Za-z0-9_]{1,64}", str(name))]
    if bad:
        raise UnknownFamily(f"{path}/model_index.json names components that are not plain folder names: "
                            f"{', '.join(bad[:3])}")
    class_name = index.get("_class_name", "")
    if isinstance(class_name, str) and class_name in BY_PIPELINE:
        return BY_PIPELINE[class_name]
    known = ", ".join(sorted(BY_PIPELINE))
    shown = str(class_name)[:60] if class_name else "unnamed"
    raise UnknownFamily(f"{path} holds a {shown} pipeline; this service serves {known}")


def check_pipeline_dir(path: Path, what: str) -> FamilySpec:
    if not path.exists():
        raise NotFound(f"{what} {path} does not exist", reason="MODEL_NOT_FOUND", metadata={"path": str(path)})
    if not path.is_dir() or not (path / "model_index.json").is_file():
        raise InvalidArgument(f"{what} {path} is not a diffusers pipeline (no model_index.json)",
                              reason="NOT_A_PIPELINE", metadata={"path": str(path)})
    try:
        return family_of_pipeline_dir(path)
    except UnknownFamily as e:
        raise InvalidArgument(str(e), reason="UNKNOWN_FAMILY") from e
    except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidArgument(f"{path}/model_index.json is unreadable: {type(e).__name__}",
                              reason="NOT_A_PIPELINE") from e


def proto_name(value: int) -> str:
    return common_pb2.Family.Name(value)
