"""Whether a training step's repeated blocks replay as CUDA graphs (inductor's graph trees) in place of the
regular compile's kernel launches.

Pure, so the service states in the resolved record what the trainer child will do. Under the regular compile
FLUX.1's 512 px step waits on the host (thousands of launches around its kernels); replayed as graphs, one launch
per block call, the same kernels kept the GPU busy and the step ran 19% faster (docs/bench/training.md,
2026-12-07). Graphs record static shapes: one graph per block call per bucket shape, recorded on that shape's
first step. They take SPEED_MODE_MAX only, and only where they were measured: FLUX.1's compiled bf16 step,
without gradient checkpointing, one batch per optimizer step (a replay writes its gradients where the last
replay's were: accumulating over micro-batches would read overwritten memory).
"""
from __future__ import annotations

from dataclasses import dataclass

MEASURED = "FLUX.1's compiled bf16 step without gradient checkpointing or accumulation"


@dataclass(frozen=True)
class GraphChoice:
    on: bool
    reason: str


def training_graphs(family_key: str, device: str, *, speed_max: bool, precision: str, compiled: bool,
                    checkpointing: bool, accumulation: int) -> GraphChoice:
    """Graphs for a job of `family_key` on `device` that asked for SPEED_MODE_MAX (`speed_max`), whose step is
    `compiled` or not, at base `precision` ("bf16", ...), with gradient `checkpointing` or without, accumulating
    `accumulation` micro-batches per optimizer step."""
    if not speed_max:
        return GraphChoice(False, "")
    why_not = ("CUDA graphs need a CUDA device" if not device.startswith("cuda")
               else "the step is not compiled" if not compiled
               else f"measured on {MEASURED} only" if (family_key, precision, checkpointing) != ("flux1", "bf16", False)
               else "a replay overwrites the last replay's gradients, so micro-batches cannot accumulate under graphs"
               if accumulation > 1 else "")
    if why_not:
        return GraphChoice(False, why_not)
    return GraphChoice(True, "SPEED_MODE_MAX: the blocks replay as CUDA graphs (inductor's graph trees, static "
                             "shapes), each recorded on its bucket shape's first step; sample images run them "
                             "eagerly")
