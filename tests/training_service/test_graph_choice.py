"""Table tests of when a training step's blocks replay as CUDA graphs (training_service.graph_choice)."""
import pytest

from training_service.graph_choice import training_graphs

FLUX_MAX = dict(speed_max=True, precision="bf16", compiled=True, checkpointing=False, accumulation=1)


@pytest.mark.parametrize("family, device, step, on, says", [
    ("flux1", "cuda", FLUX_MAX, True, "replay as CUDA graphs"),  # the one combination measured
    ("flux1", "cuda:1", FLUX_MAX, True, "sample images run them eagerly"),
    ("flux1", "cuda", {**FLUX_MAX, "speed_max": False}, False, ""),  # DEFAULT: the regular compile, no record
    ("flux1", "cpu", FLUX_MAX, False, "need a CUDA device"),
    ("flux1", "cuda", {**FLUX_MAX, "compiled": False}, False, "not compiled"),
    ("flux1", "cuda", {**FLUX_MAX, "precision": "fp8"}, False, "measured on FLUX.1's compiled bf16 step"),
    ("flux1", "cuda", {**FLUX_MAX, "precision": "nf4"}, False, "measured on FLUX.1's compiled bf16 step"),
    ("flux1", "cuda", {**FLUX_MAX, "checkpointing": True}, False, "without gradient checkpointing"),
    ("flux1", "cuda", {**FLUX_MAX, "accumulation": 2}, False, "cannot accumulate"),
    ("zimage", "cuda", FLUX_MAX, False, "measured on FLUX.1's"),  # a sequence shape per caption length
    ("qwen_image", "cuda", FLUX_MAX, False, "measured on FLUX.1's"),
])
def test_graphs_only_where_they_were_measured(family, device, step, on, says):
    choice = training_graphs(family, device, **step)
    assert choice.on == on and says in choice.reason
