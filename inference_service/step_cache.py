"""Step caching: whether a generation may skip denoiser blocks on steps whose input barely changed, and doing it.

First-Block Cache (diffusers' `FirstBlockCacheConfig`): every step runs the denoiser's first block; when that
block's output residual changed by less than the threshold since the last step that ran them all, the other
blocks are skipped and their cached residual reused. It changes the image, so it is opt-in per generation and
its resolved record says how many denoiser passes ran every block.

Where it cannot run it is refused, never silently dropped: families whose denoiser has no block cache in
diffusers (Z-Image's blocks are not wired for it, SDXL is a U-Net), and models whose repeated blocks are
compiled (a skip decided inside a compiled block is a graph break the full-graph compile does not allow).
"""
from __future__ import annotations

import contextlib
from diffusion_kit.resolved import Resolved, Source
from inference_service.requests import StepCacheRequest
from service_kit.errors import FailedPrecondition, InvalidArgument

FIRST_BLOCK = "first_block"
DEFAULT_THRESHOLD = 0.08
CACHING_FAMILIES = frozenset({"flux1", "qwen_image"})  # denoisers with diffusers' CacheMixin and wired blocks
CONTROL = "step_cache"


def parse(requested: StepCacheRequest | None, family_key: str, family_display: str) -> float | None:
    """The threshold a generation caches with, or None when it does not. Raises for what cannot run."""
    if requested is None or requested.mode != FIRST_BLOCK:
        if requested is not None and requested.threshold is not None:
            raise InvalidArgument("step_cache.threshold is set but step_cache.mode is not FIRST_BLOCK",
                                  reason="BAD_STEP_CACHE", field="step_cache.threshold")
        return None
    threshold = DEFAULT_THRESHOLD if requested.threshold is None else requested.threshold
    if not 0 < threshold <= 1:
        raise InvalidArgument(f"step_cache.threshold must be above 0 and at most 1, got {threshold:g}",
                              reason="BAD_STEP_CACHE", field="step_cache.threshold")
    if family_key not in CACHING_FAMILIES:
        raise FailedPrecondition(f"{family_display} has no block cache: step caching runs on FLUX.1 and Qwen-Image",
                                 reason="STEP_CACHE_UNSUPPORTED")
    return threshold


def check_runnable(threshold: float | None, compiled: bool) -> None:
    """A compiled model's blocks cannot be skipped: refuse before the request is queued."""
    if threshold is not None and compiled:
        raise FailedPrecondition("step caching needs a model loaded without compile (speed_mode OFF): its blocks "
                                 "are compiled whole, and skipping them is decided inside the first one",
                                 reason="STEP_CACHE_NEEDS_EAGER")


def record(threshold: float, full_passes: int, passes: int) -> Resolved:
    return Resolved(CONTROL, f"first_block {threshold:g}",
                    f"first_block {threshold:g}: {full_passes} of {passes} denoiser passes ran every block",
                    Source.EXPLICIT, reason="opt-in: skipped blocks reuse the residual of the last full pass, which "
                                            "changes the image")


class PassCounter:
    """Counts the denoiser's passes, and those that ran its last block (a skipped pass does not enter it)."""

    def __init__(self, denoiser):
        blocks = [m for m in denoiser.modules() if type(m).__name__ in getattr(denoiser, "_repeated_blocks", ())]
        last = next(iter(blocks[-1].children()), blocks[-1])
        self.passes = self.full = 0
        self._entered = False  # this pass has entered the last block (a child may run more than once per pass)
        self._handles = [denoiser.register_forward_pre_hook(self._pass),
                         last.register_forward_pre_hook(self._full)]

    def _pass(self, *_):
        self.passes += 1
        self._entered = False

    def _full(self, *_):
        if not self._entered:
            self._entered = True
            self.full += 1

    def close(self):
        for h in self._handles:
            h.remove()


@contextlib.contextmanager
def first_block(denoiser, threshold: float):
    """The cache on `denoiser` for one pipeline call, then off again; yields the pass counter."""
    from diffusers.hooks import FirstBlockCacheConfig

    counter = PassCounter(denoiser)
    denoiser.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    try:
        yield counter
    finally:
        denoiser.disable_cache()
        counter.close()
