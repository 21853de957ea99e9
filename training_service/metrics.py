"""The training service's Prometheus figures: jobs by state (read from the job store at scrape), steps and
their rate, peak device memory, suspensions."""
from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily

STEPS = Counter("diffusion_training_steps_total", "Optimiser steps run", ["family"])
STEP_RATE = Gauge("diffusion_training_steps_per_second", "Steps per second of the running job, by family", ["family"])
SAMPLES_RATE = Gauge("diffusion_training_samples_per_second", "Images per second of the last step, by family",
                     ["family"])
PEAK_BYTES = Gauge("diffusion_training_peak_device_bytes", "Peak device memory of the last step, by family", ["family"])
PEAK_RESERVED = Gauge("diffusion_training_peak_reserved_device_bytes",
                      "Peak device memory the trainer's allocator held (tensors and its cache), by family", ["family"])
SUSPENDED = Counter("diffusion_training_suspensions_total", "Jobs suspended (preempted, lease lost, drain)")
YIELDED = Counter("diffusion_training_yielded_seconds_total",
                  "Seconds training paused between steps for inference busy on its GPU", ["family"])
_yielded_so_far: dict[str, float] = {}  # job id -> its step events' running total of yielded seconds

STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "SUSPENDED")


class JobStates:
    """diffusion_training_jobs{state}: how many jobs the store holds in each state, counted when scraped."""

    def __init__(self, store):
        self.store = store

    def collect(self):
        family = GaugeMetricFamily("diffusion_training_jobs", "Training jobs by state", labels=["state"])
        counts = dict.fromkeys(STATES, 0)
        for record in list(self.store.jobs.values()):
            counts[record.state] = counts.get(record.state, 0) + 1
        for state, n in counts.items():
            family.add_metric([state], n)
        yield family


_collector: JobStates | None = None


def watch_store(store) -> None:
    """Counts this store's jobs on every scrape (one store per process; a later call replaces the former)."""
    global _collector
    if _collector is not None:
        REGISTRY.unregister(_collector)
    _collector = JobStates(store)
    REGISTRY.register(_collector)


def step(family: str, data: dict, job_id: str = "") -> None:
    STEPS.labels(family).inc()
    total = data.get("yielded_s", 0.0)
    if total > _yielded_so_far.get(job_id, 0.0):
        YIELDED.labels(family).inc(total - _yielded_so_far.get(job_id, 0.0))
    _yielded_so_far[job_id] = total
    if data.get("elapsed_s"):
        STEP_RATE.labels(family).set(data["step"] / data["elapsed_s"])
    SAMPLES_RATE.labels(family).set(data.get("samples_per_s", 0.0))
    PEAK_BYTES.labels(family).set(data.get("peak_memory_bytes", 0))
    PEAK_RESERVED.labels(family).set(data.get("peak_reserved_bytes", 0))


def job_ended(job_id: str) -> None:
    _yielded_so_far.pop(job_id, None)
