"""Running out of GPU memory with several images: halve the batch until it fits, keep each image's seed, and say
so; one image that does not fit is RESOURCE_EXHAUSTED with what to change. (A CPU host cannot run out of GPU
memory, so the generation here is a function that does when given more than `fits` images.)"""
import pytest
import torch

from diffusion_kit.resolved import Status
from inference_service.oom_backoff import run_in_batches
from service_kit.errors import ResourceExhausted


def generator(fits: int, calls: list):
    def run(seeds):
        calls.append(list(seeds))
        if len(seeds) > fits:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [f"image-{s}" for s in seeds]

    return run


@pytest.mark.parametrize("count, fits, batches", [
    (4, 4, None),  # fits: one call, no record
    (4, 2, "2 + 2"),
    (5, 2, "2 + 1 + 2"),  # halves, rounded up first: [3 -> 2 + 1], [2]
    (4, 1, "1 + 1 + 1 + 1"),
    (1, 1, None),
])
def test_a_batch_halves_until_it_fits_and_keeps_seed_order(count, fits, batches):
    calls, freed = [], []
    seeds = list(range(10, 10 + count))
    images, record = run_in_batches(generator(fits, calls), seeds, 1024, 1024, free=lambda: freed.append(1))
    assert images == [f"image-{s}" for s in seeds]
    if batches is None:
        assert record is None and calls == [seeds] and not freed
    else:
        assert record.applied == batches and record.requested == str(count)
        assert record.status is Status.FELL_BACK and "ran out of GPU memory" in record.reason
        assert len(freed) == sum(1 for c in calls if len(c) > fits)  # the cache emptied after each failure


def test_one_image_that_does_not_fit_is_refused_with_what_to_change():
    calls = []
    with pytest.raises(ResourceExhausted, match="smaller size") as refused:
        run_in_batches(generator(0, calls), [7, 8], 2048, 2048, free=lambda: None)
    assert refused.value.reason == "OUT_OF_MEMORY" and "2048x2048" in refused.value.message
    assert calls == [[7, 8], [7]]  # it stops at the first image that cannot fit


def test_other_errors_are_not_taken_for_memory():
    def broken(seeds):
        raise ValueError("not memory")

    with pytest.raises(ValueError):
        run_in_batches(broken, [1, 2], 64, 64, free=lambda: None)
