"""Running out of GPU memory in a generation: a request for several images is run again as smaller batches, halving
until they fit; one image that does not fit is refused with what to change.

Each image keeps its own seed's generator, so a split batch gives the same images as the whole one up to batched
matmul rounding. The split is a fallback, so the generation's record says so (FELL_BACK, with the batch sizes).
Progress restarts at step 1 for each smaller batch after the first; the record says how many ran.
"""
from __future__ import annotations

from typing import Callable, Sequence

from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.errors import ResourceExhausted

CONTROL = "batch_split"


def _out_of_memory() -> tuple[type[BaseException], ...]:
    import torch

    return (torch.OutOfMemoryError,)


def _free() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def run_in_batches(run: Callable[[Sequence[int]], list], seeds: Sequence[int], width: int, height: int,
                   free: Callable[[], None] = _free, per_call: int | None = None) -> tuple[list, Resolved | None]:
    """`run(seeds)` generates one image per seed, `per_call` seeds at most per call (inference_service.batch_plan;
    all of them by default). Returns the images in seed order and, when a batch had to be split, the record that
    says how it ran."""
    oom = _out_of_memory()
    sizes: list[int] = []
    split = [False]

    def attempt(part: Sequence[int]) -> list:
        try:
            images = run(part)
        except oom:
            free()
            if len(part) == 1:
                raise ResourceExhausted(
                    f"out of GPU memory generating one {width}x{height} image (the model's lease leaves too little "
                    "room for it); ask for a smaller size, or load the model with an offloading memory mode",
                    reason="OUT_OF_MEMORY") from None
            split[0] = True
            half = (len(part) + 1) // 2
            return attempt(part[:half]) + attempt(part[half:])
        sizes.append(len(part))
        return images

    seeds = list(seeds)
    step = per_call or len(seeds)
    images = [image for i in range(0, len(seeds), step) for image in attempt(seeds[i:i + step])]
    if not split[0]:
        return images, None
    return images, Resolved(CONTROL, str(len(seeds)), " + ".join(map(str, sizes)), Source.AUTO, Status.FELL_BACK,
                            reason=f"{len(seeds)} images of {width}x{height} in batches of {step} ran out of GPU memory; "
                                   f"they ran as {len(sizes)} smaller batches, each image with its own seed")
