"""Which optimizer steps a job's LoRA tensors, and how: pure, so the resolved record states exactly what the
trainer child builds."""
from __future__ import annotations

from dataclasses import dataclass

NAMES = ("adamw", "adamw8bit")


@dataclass(frozen=True)
class OptimizerChoice:
    name: str  # one of NAMES
    fused: bool  # torch's fused AdamW kernel (adamw on CUDA only)
    reason: str


def optimizer_choice(name: str, device: str) -> OptimizerChoice:
    """The optimizer `name` resolves to on `device`. On CUDA the fused kernel steps every LoRA tensor at once; the
    per-tensor loop reads each tensor's step count on the host, hundreds of calls a step. ValueError for a name
    outside NAMES."""
    if name not in NAMES:
        raise ValueError(f"optimizers are {', '.join(NAMES)}; not {name}")
    if name == "adamw8bit":
        return OptimizerChoice(name, False, "8-bit moments for LoRA tensors of 4096 elements or more, 32-bit below "
                                            "(bitsandbytes' min_8bit_size)")
    if device.startswith("cuda"):
        return OptimizerChoice(name, True, "fused: one CUDA kernel steps every LoRA tensor")
    return OptimizerChoice(name, False, "")
