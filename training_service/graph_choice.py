"""Whether a training step's repeated blocks replay as CUDA graphs (inductor's graph trees) in place of the
regular compile's kernel launches.

Pure, so the service states in the resolved record what the trainer child will do. Under the regular compile a
step waits on the host (thousands of launches around its kernels, and the compiled graphs' own wrappers); replayed
as graphs, one launch per block call, the same kernels keep the GPU busy: FLUX.1's 512 px step ran 19% faster, and
Z-Image's 768 px step (cuDNN attention under both) 9% faster on an H100 (docs/bench/training.md, 2026-12-07).
Graphs record static shapes: one graph per block call per batch shape, recorded on that shape's first step. They
take SPEED_MODE_MAX only, and only where they were measured: the compiled bf16 step without gradient checkpointing,
one batch per optimizer step (a replay writes its gradients where the last replay's were: accumulating over
micro-batches would read overwritten memory). Z-Image's sequence is its caption's length (padded to a multiple of
32), so its batch shapes are fixed over epochs only at a batch of one. Past `MAX_SHAPES` batch shapes in a job the
recordings (a static compile each) would outweigh the steps they save, and the blocks take the regular compile.
"""
from __future__ import annotations

from dataclasses import dataclass

MEASURED = "FLUX.1's and Z-Image's compiled bf16 steps without gradient checkpointing or accumulation"
GRAPH_FAMILIES = ("flux1", "zimage")
PER_EXAMPLE_SHAPES = ("zimage",)  # a caption's length sets the sequence: shapes repeat each epoch at batch 1 only
MAX_SHAPES = 12


@dataclass(frozen=True)
class GraphChoice:
    on: bool
    reason: str


def training_graphs(family_key: str, device: str, *, speed_max: bool, precision: str, compiled: bool,
                    checkpointing: bool, accumulation: int, batch_size: int = 1) -> GraphChoice:
    """Graphs for a job of `family_key` on `device` that asked for SPEED_MODE_MAX (`speed_max`), whose step is
    `compiled` or not, at base `precision` ("bf16", ...), with gradient `checkpointing` or without, accumulating
    `accumulation` micro-batches of `batch_size` examples per optimizer step."""
    if not speed_max:
        return GraphChoice(False, "")
    why_not = ("CUDA graphs need a CUDA device" if not device.startswith("cuda")
               else "the step is not compiled" if not compiled
               else f"measured on {MEASURED} only"
               if family_key not in GRAPH_FAMILIES or (precision, checkpointing) != ("bf16", False)
               else "a replay overwrites the last replay's gradients, so micro-batches cannot accumulate under graphs"
               if accumulation > 1
               else "each caption's length sets Z-Image's sequence, so a batch of more than one example takes new "
                    "shapes every epoch; graphs record static shapes at a batch of one"
               if family_key in PER_EXAMPLE_SHAPES and batch_size > 1 else "")
    if why_not:
        return GraphChoice(False, why_not)
    return GraphChoice(True, "SPEED_MODE_MAX: the blocks replay as CUDA graphs (inductor's graph trees, static "
                             "shapes), each recorded on its batch shape's first step; sample images run them "
                             "eagerly")


def graphs_over_shapes(shapes: int) -> GraphChoice:
    """Whether a job whose first epoch holds `shapes` distinct batch shapes (bucket, batch size and, where it sets
    the sequence, caption length) keeps its graphs: each shape is a static compile and a recording of its own."""
    if shapes > MAX_SHAPES:
        return GraphChoice(False, f"the job trains on {shapes} batch shapes (buckets and caption lengths), more than "
                                  f"the {MAX_SHAPES} that CUDA graphs record, each with a compile of its own; the "
                                  "blocks take the regular compile (dynamic shapes)")
    return GraphChoice(True, "")
