"""Which of a forward pass's block calls gradient checkpointing recomputes: one in every `interval`.

Checkpointing every block keeps the least memory and recomputes the most: the whole forward runs again inside the
backward. Checkpointing one block call in every N (calls 0, N, 2N, ... of each forward) keeps the others'
activations, so a step recomputes about 1/N of the blocks, for about (N - 1)/N of the activations checkpointing
saved (precision_policy's estimate). A request's `gradient_checkpointing_interval` picks N; it means nothing
without gradient checkpointing, so it is refused there rather than ignored.
"""
from __future__ import annotations

from service_kit.errors import InvalidArgument

MAX_INTERVAL = 64


def checked_interval(checkpointing: bool, interval: int) -> int:
    """The interval the step runs (1: every block call) for a request's value (0: unset); INVALID_ARGUMENT where the
    value is out of range or asked for without checkpointing."""
    if not 0 <= interval <= MAX_INTERVAL:
        raise InvalidArgument(f"gradient_checkpointing_interval must be between 0 and {MAX_INTERVAL}, got {interval}",
                              reason="BAD_VALUE")
    if interval and not checkpointing:
        raise InvalidArgument("gradient_checkpointing_interval applies only with gradient_checkpointing=true: set "
                              "it, or leave the interval unset", reason="BAD_VALUE")
    return interval or 1


class EveryNthBlockCall:
    """diffusers' gradient-checkpointing function (models call it on each repeated block): checkpoints calls 0, N,
    2N, ... of each forward and runs the rest as usual. One instance serves every module of the model that
    checkpoints (a U-Net's blocks each hold it), and the model's forward restarts the count."""

    def __init__(self, interval: int):
        from torch.utils.checkpoint import checkpoint  # here: the service plans jobs without importing torch

        self._checkpoint = checkpoint
        self.interval = interval
        self.calls = 0  # block calls in the current forward
        self.checkpointed = 0  # of them, checkpointed

    def __call__(self, block, *args):
        index = self.calls
        self.calls += 1
        if index % self.interval:
            return block(*args)
        self.checkpointed += 1
        return self._checkpoint(block.__call__, *args, use_reentrant=False)

    def restart(self, *_) -> None:
        self.calls = self.checkpointed = 0

    def install(self, model) -> None:
        """Checkpointing on for `model`, through this function."""
        model.enable_gradient_checkpointing(self)
        model.register_forward_pre_hook(self.restart)
