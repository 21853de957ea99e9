"""Aspect-ratio buckets and the batch plan: which images train together, in which order. Pure functions.

With buckets, every image keeps its shape: it goes to the bucket (about resolution² pixels, sides
multiples of 64, or of 16 below 256 px) whose aspect ratio is nearest in log space, and is resized
to cover it and centre-cropped. Without buckets, every image is a centre-cropped square.
A batch holds one bucket only, so its latents stack. The plan of an epoch is a function of the seed
and the epoch number alone, so a resumed run draws exactly the batches the uninterrupted one would.
"""
from __future__ import annotations

import math

import torch

MAX_RATIO = 2.0  # buckets range from 1:2 to 2:1


def bucket_sizes(resolution: int) -> list[tuple[int, int]]:
    """(width, height) pairs of about resolution² pixels, both sides multiples of the grid, widest first."""
    grid = 64 if resolution >= 256 else 16
    area = resolution * resolution
    out = set()
    for width in range(grid, int(resolution * math.sqrt(MAX_RATIO)) + grid, grid):
        height = max(grid, round(area / width / grid) * grid)
        if 1 / MAX_RATIO <= width / height <= MAX_RATIO:
            out.update({(width, height), (height, width)})  # every landscape bucket has its portrait twin
    return sorted(out, key=lambda wh: wh[1] / wh[0])


def nearest_bucket(width: int, height: int, buckets: list[tuple[int, int]]) -> tuple[int, int]:
    ratio = math.log(width / height)
    return min(buckets, key=lambda wh: (abs(math.log(wh[0] / wh[1]) - ratio), -wh[0] * wh[1]))


def crop_box(width: int, height: int, target: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """The size to resize to (covering the target) and the centred crop box (left, top, right, bottom)."""
    tw, th = target
    scale = max(tw / width, th / height)
    rw, rh = max(tw, round(width * scale)), max(th, round(height * scale))
    left, top = (rw - tw) // 2, (rh - th) // 2
    return (rw, rh), (left, top, left + tw, top + th)


def epoch_batches(buckets_of: list[tuple[int, int]], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Every example once: shuffled, grouped by bucket, cut into batches, and the batches shuffled."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(len(buckets_of), generator=g).tolist()
    groups: dict[tuple[int, int], list[int]] = {}
    for i in order:
        groups.setdefault(buckets_of[i], []).append(i)
    batches = [members[k:k + batch_size] for members in groups.values() for k in range(0, len(members), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]


class BatchPlan:
    """The batches of every step, one epoch's plan computed once (not per step: datasets can be large)."""

    def __init__(self, buckets_of: list[tuple[int, int]], batch_size: int, seed: int):
        self.buckets_of, self.batch_size, self.seed = list(buckets_of), batch_size, seed
        self.per_epoch = sum(math.ceil(self.buckets_of.count(b) / batch_size) for b in set(self.buckets_of))
        self._epoch, self._plan = -1, []

    def at(self, step: int) -> list[int]:
        """The examples of global step `step` (0-based). Every epoch has the same number of batches."""
        epoch = step // self.per_epoch
        if epoch != self._epoch:
            self._epoch, self._plan = epoch, epoch_batches(self.buckets_of, self.batch_size, self.seed, epoch)
        return self._plan[step % self.per_epoch]


def batch_at(buckets_of: list[tuple[int, int]], batch_size: int, seed: int, step: int) -> list[int]:
    return BatchPlan(buckets_of, batch_size, seed).at(step)
