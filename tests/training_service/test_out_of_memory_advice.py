"""What a run that ran out of GPU memory is told to change (a table over its settings)."""
import pytest

from training_service.lora_recipe import RecipeConfig
from training_service.trainer_child import out_of_memory_advice

GiB = 2**30


def cfg(**kw):
    return RecipeConfig(**{"family": "flux1", "base_dir": "/b", "examples": [], "precision": "bf16",
                           "resolution": 1024, **kw})


@pytest.mark.parametrize("config, step, expected, absent", [
    (cfg(), 0, ["before the first step", "gradient_checkpointing=true", "PRECISION_NF4", "a resolution below 1024"], []),
    (cfg(gradient_checkpointing=True, precision="nf4", resolution=512), 40, ["at step 41"],
     ["gradient_checkpointing", "NF4", "resolution", "; try"]),
    (cfg(batch_size=4, precision="nf4"), 3, ["batch_size 2"], ["NF4"]),
    (cfg(gradient_checkpointing=True, checkpoint_interval=3, precision="nf4", resolution=512), 5,
     ["; try gradient_checkpointing_interval 1 (every block checkpointed)"], ["gradient_checkpointing=true", "NF4"]),
])
def test_advice_names_only_what_would_help(config, step, expected, absent):
    message = out_of_memory_advice(config, step, 70 * GiB, 80 * GiB)
    assert "peak 70.0 of 80.0 GiB" in message
    assert all(e in message for e in expected), message
    assert not any(a in message for a in absent), message
