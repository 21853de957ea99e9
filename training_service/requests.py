"""What a training caller asks for, as typed values: built from the proto at the servicer edge
(`convert.py`), so the plan and the job manager never see a proto message.

The edge has checked sizes and closed every enum (`request_rules.py`); `training_plan.resolve`
checks the rest and applies every default, with its record.
"""
from __future__ import annotations

from dataclasses import dataclass

from diffusion_kit.families import FamilySpec
from diffusion_kit.model_sources import ModelSource
from diffusion_kit.precision import Precision


@dataclass(frozen=True)
class StartTraining:
    family: FamilySpec | None
    base: ModelSource | None
    image_dir: str
    instance_prompt: str = ""
    aspect_ratio_buckets: bool = False
    base_precision: Precision = Precision.UNSPECIFIED
    rank: int = 0  # 0: the service default
    alpha: float | None = None
    learning_rate: float | None = None
    steps: int = 0
    batch_size: int = 0
    gradient_accumulation_steps: int = 0
    resolution: int = 0
    optimizer: int = 0  # training.Optimizer value (the edge closed the enum)
    lr_schedule: int = 0  # training.LrSchedule value
    speed_mode: int = 0  # common.SpeedMode value
    warmup_steps: int = 0
    gradient_checkpointing: bool = False
    gradient_checkpointing_interval: int = 0  # 0: unset (every block)
    seed: int = 0
    checkpoint_every: int = 0
    sample_every: int = 0
    sample_prompts: tuple[str, ...] = ()
    adapter_id: str = ""
    trigger_words: tuple[str, ...] = ()
    resume_job_id: str = ""
    priority: int = 0
    device_index: int | None = None  # the broker device to train on; None: any the broker grants
    as_sent: str = ""  # the request as the caller sent it (JSON), echoed back in TrainingJob.request
