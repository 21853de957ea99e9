"""Which of a pipeline's models stay on the device in the low_vram tier: as many as fit, least recently used
moved off first.

The tier's lease is sized on the largest model (memory_plan.need_for). A model is moved on when it is
called and stays there after the generation; one that does not fit beside those already there moves the
least recently used of them off. So a run of generations that skip the text encoders (a repeated prompt)
keeps the transformer and the VAE on the device and runs at resident speed, and a new prompt costs one
move of each model it calls.
"""
from __future__ import annotations

from collections.abc import Sequence

# Room beside the largest model for the small ones (the VAE, CLIP) so that they need not push it off. Taken
# from the share of the lease planned for activations (memory_plan.HEADROOM_FRACTION, 15%).
BESIDE_LARGEST = 0.05


def weights_budget(largest_model_bytes: int) -> int:
    """Device bytes the tier lets models' weights take at once."""
    return int(largest_model_bytes * (1 + BESIDE_LARGEST))


def evictions(resident: Sequence[tuple[str, int]], incoming_bytes: int, budget_bytes: int) -> list[str]:
    """The models to move off, in order, so that `incoming_bytes` fit beside the rest within the budget.

    `resident` is (name, bytes) of the models on the device, least recently used first. A model larger than
    the budget on its own moves every other model off and is still placed: the budget is a rule for what may
    stay, and the lease was planned on the largest model."""
    used = sum(size for _, size in resident)
    out = []
    for name, size in resident:
        if used + incoming_bytes <= budget_bytes:
            break
        out.append(name)
        used -= size
    return out
