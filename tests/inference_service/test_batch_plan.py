"""How many of a request's images one pipeline call generates: a table, and a real tiny pipeline whose images,
run one per call, are each the single-image request's pixels."""
import numpy as np
import pytest
import torch

from diffusion_kit.families import FAMILIES
from diffusion_kit.resolved import Status
from inference_service import batch_plan, generation
from inference_service.oom_backoff import run_in_batches
from tests.inference_service.test_oom_backoff import generator


MI = 1024 * 1024


@pytest.mark.parametrize("count, width, height, room, per_call", [
    (1, 1024, 1024, MI, 1),
    (4, 1024, 1024, MI, 1),  # each 1024x1024 image fills the room the lease planned
    (4, 512, 512, MI, 4),
    (16, 512, 512, MI, 4),
    (3, 768, 512, MI, 2),  # 0.375 Mi pixels each: two fit in 1 Mi
    (16, 64, 64, MI, 16),
    (4, 1024, 1024, 4 * MI, 4),  # a model loaded with room for four
    (3, 1328, 1328, 1328 * 1328, 1),  # Qwen-Image's default room holds one of its default images
    (4, 1024, 1024, 1328 * 1328, 1),
    (2, 2048, 2048, 4 * MI, 1),
])
def test_images_per_call(count, width, height, room, per_call):
    assert batch_plan.images_per_call(count, width, height, room) == per_call
    record = batch_plan.record(count, width, height, room)
    if per_call >= count:
        assert record is None
    else:
        assert record.applied == str(per_call) and record.status is Status.APPLIED and "lease" in record.reason
        assert f"room for {room} pixels" in record.reason


def test_planned_calls_keep_seed_order_and_split_further_only_on_running_out_of_memory():
    calls = []
    images, record = run_in_batches(generator(2, calls), [1, 2, 3, 4, 5], 512, 512, free=lambda: None, per_call=2)
    assert images == [f"image-{s}" for s in [1, 2, 3, 4, 5]] and calls == [[1, 2], [3, 4], [5]] and record is None
    calls = []
    images, record = run_in_batches(generator(1, calls), [1, 2, 3], 512, 512, free=lambda: None, per_call=2)
    assert images == [f"image-{s}" for s in [1, 2, 3]] and record.status is Status.FELL_BACK
    assert "in batches of 2" in record.reason and record.applied == "1 + 1 + 1"


def spec(seeds, room=MI):
    return generation.GenerationSpec("m", "a red kite", "", 64, 64, 2, 0.0, tuple(seeds), (), "png", None, (),
                                     pixels_per_call=room)


def run(pipe, seeds, steps, phases, room=MI):
    return generation.run(pipe, FAMILIES["zimage"], spec(seeds, room), generation.RunControl(), steps.append,
                          phases.append, inference_mode=True)


def test_images_run_one_per_call_are_the_single_requests_pixels_with_progress_over_all_calls(tiny_models):
    import diffusers

    pipe = diffusers.ZImagePipeline.from_pretrained(str(tiny_models["zimage"]))
    pipe.set_progress_bar_config(disable=True)
    singles = [np.asarray(run(pipe, [s], [], []).images[0]) for s in (5, 6, 7)]
    steps, phases = [], []
    out = run(pipe, [5, 6, 7], steps, phases, room=64 * 64)  # as 1024x1024 images in a 1 Mi room
    assert all(np.array_equal(np.asarray(a), b) for a, b in zip(out.images, singles))
    assert [(r.step, r.total) for r in steps] == [(i, 6) for i in range(1, 7)]  # 3 calls of 2 steps
    assert phases == ["encoding_prompt", "denoising", "decoding"]
    assert out.images_per_call.applied == "1" and "3 calls" in out.images_per_call.reason
    assert out.batch_split is None
