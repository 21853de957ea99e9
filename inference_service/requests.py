"""What an inference caller asks for, as typed values: built from the protos at the servicer edge
(`convert.py`), so the engine and the policies below it never see a proto message.

By the time a request is one of these, the edge has checked its sizes, that its enum values exist
(`request_rules.py`) and converted each precision to `Precision`; what depends on the files, the host
or the loaded model is checked further down.
"""
from __future__ import annotations

from dataclasses import dataclass

from diffusion_kit.families import FamilySpec
from diffusion_kit.model_sources import ModelSource
from diffusion_kit.precision import Precision


@dataclass(frozen=True)
class LoadRequest:
    model_id: str
    source: ModelSource | None
    family: FamilySpec | None = None  # None: read from the model's files
    compute_precision: Precision = Precision.UNSPECIFIED
    transformer_precision: Precision = Precision.UNSPECIFIED
    text_encoder_precision: Precision = Precision.UNSPECIFIED
    memory_mode: int = 0  # common.MemoryMode value (the edge closed the enum)
    speed_mode: int = 0  # common.SpeedMode value
    fp8_fast_accumulate: bool | None = None
    priority: int = 0
    device_index: int | None = None
    keep_alive_s: float | None = None  # None: the service default; negative: forever; 0: after each generation
    max_pixels_per_call: int = 0  # the image room its lease plans for; 0: the family's default image


@dataclass(frozen=True)
class AdapterUse:
    adapter_id: str
    weight: float


@dataclass(frozen=True)
class StepCacheRequest:
    mode: str = "off"  # off | first_block (inference_service.step_cache)
    threshold: float | None = None


@dataclass(frozen=True)
class GenerateRequest:
    model_id: str
    prompt: str
    negative_prompt: str = ""
    width: int = 0  # 0: the family's default
    height: int = 0
    steps: int = 0
    guidance_scale: float | None = None
    seeds: tuple[int, ...] = ()
    num_images: int = 0
    adapters: tuple[AdapterUse, ...] = ()
    output_format: str = "png"  # png | webp | jpeg | raw_rgb8
    encode_quality: int | None = None
    generation_id: str = ""
    step_cache: StepCacheRequest | None = None
