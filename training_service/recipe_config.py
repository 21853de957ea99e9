"""What one training job runs: the whole configuration its trainer child reads from run.json.

Torch-free, so the asyncio service (jobs.py) writes it without importing the trainer. Built by
`training_plan.resolve` (every default and fallback there has its Resolved record) and completed
with the service's own settings by `JobManager.start`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from diffusion_kit.precision import Precision
from training_service.nf4_weights import DEFAULT_BACKEND as NF4_DEFAULT


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
    precision: Precision = Precision.FP32  # how the frozen base is held; LoRA parameters are fp32
    nf4_backend: str = NF4_DEFAULT  # an nf4 base: bitsandbytes' Linear4bit or torchao's NF4Tensor (nf4_weights)
    optimizer: str = "adamw"  # or adamw8bit (bitsandbytes)
    lr_schedule: str = "constant_with_warmup"  # diffusers.optimization names
    batch_size: int = 1
    accumulation: int = 1  # batches per optimizer step
    buckets: bool = False
    compile: bool = False
    compile_backend: str = "inductor"
    gradient_checkpointing: bool = False
    checkpoint_interval: int = 1  # with checkpointing: one block call in every this many (checkpoint_interval)
    attention: list[str] = field(default_factory=list)  # SDPA kernels pinned, in order (attention_choice)
    cuda_graphs: bool = False  # compiled runs: the blocks replay as CUDA graphs, static shapes (graph_choice)
    aot_dir: str = ""  # compiled runs: where the blocks' training graphs are kept across jobs (aot_blocks); "" off
    trace_steps: list[int] = field(default_factory=list)  # [first, count]: steps run under the profiler (step_trace)
    checkpoint_every: int = 0
    checkpoint_minutes: float = 0  # also save when this much time passed since the last save; 0 off
    sample_every: int = 0
    sample_prompts: list[str] = field(default_factory=list)
    dataset_fingerprint: str = ""  # dataset.fingerprint: names, sizes, mtimes, captions
    encode_cache_dir: str = ""  # text-encoder outputs and latents kept between jobs (encode_cache); "" off
    # What the job does around the recipe: where it publishes, who owns the result, what it resumes.
    adapter_id: str = ""
    adapter_store: str = ""
    trigger_words: list[str] = field(default_factory=list)
    hub_repo: tuple[str, str | None] | None = None  # (repo id, revision) when the job fetches its base
    owner: str = ""
    resume_from: str = ""  # a checkpoint folder; "" for a fresh run

    def __post_init__(self) -> None:  # as read back from run.json
        self.precision = Precision(self.precision)
        self.examples = [tuple(e) for e in self.examples]
        if self.hub_repo is not None:
            self.hub_repo = tuple(self.hub_repo)

    def to_json(self) -> str:
        """run.json: what the trainer child reads."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "RecipeConfig":
        return cls(**json.loads(text))

    def identity(self) -> dict:
        """What a checkpoint must match to be resumed: everything that changes the trajectory. An nf4 base held
        by another backend than the default is quantised by other code, so its backend counts; the default is
        left out, as in checkpoints written before there was a choice."""
        keys = ("family", "base_dir", "examples", "rank", "alpha", "learning_rate", "steps", "resolution", "seed",
                "warmup_steps", "precision", "optimizer", "lr_schedule", "batch_size", "accumulation", "buckets",
                "dataset_fingerprint")
        if self.precision == Precision.NF4 and self.nf4_backend != NF4_DEFAULT:
            keys += ("nf4_backend",)
        return json.loads(json.dumps({k: asdict(self)[k] for k in keys}))  # as it reads back from disk

    def identity_differences(self, saved: dict) -> list[str]:
        """The identity keys a saved checkpoint disagrees on (a key missing on either side counts)."""
        mine = self.identity()
        return sorted(k for k in mine.keys() | saved.keys() if mine.get(k) != saved.get(k))
