"""Table tests of the bucket policy and the batch plan (pure functions)."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training_service.aspect_buckets import (MAX_RATIO, BatchPlan, batch_at, bucket_sizes, crop_box,
                                             epoch_batches, nearest_bucket)


@pytest.mark.parametrize("resolution, grid", [(1024, 64), (768, 64), (512, 64), (64, 16)])
def test_buckets_keep_the_grid_the_ratio_bounds_and_both_orientations(resolution, grid):
    sizes = bucket_sizes(resolution)
    assert (resolution, resolution) in sizes
    assert len(sizes) >= 5  # a square and at least two landscape/portrait pairs
    off_grid = [(w, h) for w, h in sizes if w % grid or h % grid]
    too_narrow = [(w, h) for w, h in sizes if max(w, h) / min(w, h) > MAX_RATIO]
    unpaired = [(w, h) for w, h in sizes if (h, w) not in sizes]
    assert (off_grid, too_narrow, unpaired) == ([], [], [])


@pytest.mark.parametrize("resolution", [1024, 768, 512])
def test_buckets_keep_the_pixel_count_within_a_quarter(resolution):
    areas = [w * h / resolution**2 for w, h in bucket_sizes(resolution)]
    assert min(areas) > 0.75 and max(areas) < 1.25, areas


@pytest.mark.parametrize("image, expected", [
    ((1920, 1080), (1344, 768)),   # 16:9
    ((1080, 1920), (768, 1344)),
    ((1000, 1000), (1024, 1024)),
    ((4000, 1000), (1408, 768)),   # beyond 2:1 lands on the widest bucket
    ((1200, 900), (1152, 896)),    # 4:3
])
def test_nearest_bucket(image, expected):
    assert nearest_bucket(*image, bucket_sizes(1024)) == expected


@pytest.mark.parametrize("image, target, resize, box", [
    ((1920, 1080), (1344, 768), (1365, 768), (10, 0, 1354, 768)),
    ((100, 100), (64, 64), (64, 64), (0, 0, 64, 64)),
    ((50, 40), (64, 64), (80, 64), (8, 0, 72, 64)),  # upscales to cover
])
def test_crop_box_covers_and_centres(image, target, resize, box):
    assert crop_box(*image, target) == (resize, box)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([(64, 64), (96, 48), (48, 96)]), min_size=1, max_size=12),
       st.integers(1, 5), st.integers(0, 2**31), st.integers(0, 50))
def test_an_epoch_holds_every_example_once_in_one_bucket_batches(buckets_of, batch_size, seed, epoch):
    plan = epoch_batches(buckets_of, batch_size, seed, epoch)
    assert sorted(i for batch in plan for i in batch) == list(range(len(buckets_of)))
    assert all(1 <= len(b) <= batch_size and len({buckets_of[i] for i in b}) == 1 for b in plan)
    assert plan == epoch_batches(buckets_of, batch_size, seed, epoch)  # a function of its arguments alone
    per_epoch = len(plan)
    assert per_epoch == sum(math.ceil(buckets_of.count(b) / batch_size) for b in set(buckets_of))
    assert [batch_at(buckets_of, batch_size, seed, epoch * per_epoch + k) for k in range(per_epoch)] == plan
    walker = BatchPlan(buckets_of, batch_size, seed)  # the cached plan walks epochs the same way
    steps = range(max(0, epoch - 1) * per_epoch, (epoch + 1) * per_epoch)
    assert [walker.at(k) for k in steps] == [batch_at(buckets_of, batch_size, seed, k) for k in steps]


def test_epochs_reshuffle():
    buckets_of = [(64, 64)] * 16
    assert epoch_batches(buckets_of, 4, 0, 0) != epoch_batches(buckets_of, 4, 0, 1)
