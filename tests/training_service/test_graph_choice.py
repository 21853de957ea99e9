"""Table tests of when a training step's blocks replay as CUDA graphs (training_service.graph_choice)."""
import pytest

from training_service.graph_choice import MAX_SHAPES, graphs_over_shapes, training_graphs

MAX = dict(speed_max=True, precision="bf16", compiled=True, checkpointing=False, accumulation=1)


@pytest.mark.parametrize("family, device, step, on, says", [
    ("flux1", "cuda", MAX, True, "replay as CUDA graphs"),  # the combinations measured
    ("zimage", "cuda", MAX, True, "replay as CUDA graphs"),
    ("flux1", "cuda:1", MAX, True, "sample images run them eagerly"),
    ("flux1", "cuda", {**MAX, "speed_max": False}, False, ""),  # DEFAULT: the regular compile, no record
    ("zimage", "cuda", {**MAX, "speed_max": False}, False, ""),
    ("flux1", "cpu", MAX, False, "need a CUDA device"),
    ("flux1", "cuda", {**MAX, "compiled": False}, False, "not compiled"),
    ("flux1", "cuda", {**MAX, "precision": "fp8"}, False, "compiled bf16 steps"),
    ("zimage", "cuda", {**MAX, "precision": "fp8"}, False, "compiled bf16 steps"),
    ("flux1", "cuda", {**MAX, "precision": "nf4"}, False, "compiled bf16 steps"),
    ("flux1", "cuda", {**MAX, "checkpointing": True}, False, "without gradient checkpointing"),
    ("zimage", "cuda", {**MAX, "checkpointing": True}, False, "without gradient checkpointing"),
    ("flux1", "cuda", {**MAX, "accumulation": 2}, False, "cannot accumulate"),
    ("flux1", "cuda", {**MAX, "batch_size": 2}, True, "replay as CUDA graphs"),  # text padded to one length
    ("zimage", "cuda", {**MAX, "batch_size": 2}, False, "new shapes every epoch"),  # a sequence per caption
    ("qwen_image", "cuda", MAX, False, "measured on FLUX.1's and Z-Image's"),
    ("sdxl", "cuda", MAX, False, "measured on FLUX.1's and Z-Image's"),
])
def test_graphs_only_where_they_were_measured(family, device, step, on, says):
    choice = training_graphs(family, device, **step)
    assert choice.on == on and says in choice.reason


@pytest.mark.parametrize("shapes, on", [(1, True), (MAX_SHAPES, True), (MAX_SHAPES + 1, False)])
def test_graphs_record_a_bounded_number_of_batch_shapes(shapes, on):
    choice = graphs_over_shapes(shapes)
    assert choice.on == on
    assert (f"trains on {shapes} batch shapes" in choice.reason) == (not on)
