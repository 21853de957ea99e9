"""A training job's side of sharing its GPU with inference: between steps, it waits while the broker asks batch
work on its device to yield (a busy interactive holder, gpu_broker.compute_share), and says so on its stream.

The gate only ever pauses at a step boundary: the step before it has finished on the device (the step's loss was
read), so a paused job leaves the GPU's compute to the generation, and keeps its memory and lease.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

POLL_S = 0.25  # how often a paused job looks at its stop flag


class YieldGate:
    def __init__(self, emit: Callable[[str, dict], None], should_stop: Callable[[], bool] = lambda: False):
        self._emit = emit
        self._should_stop = should_stop
        self._resume = threading.Event()
        self._resume.set()
        self._to = ""
        self.yielded_s = 0.0  # in all, over the job's life in this process

    def ask(self, to: str) -> None:
        """The broker asked this job to yield to `to` (its holder's client id)."""
        self._to = to
        self._resume.clear()

    def release(self) -> None:
        """It may resume at full rate (or it is stopping)."""
        self._resume.set()

    def __call__(self, step: int) -> float:
        """At a step boundary: returns at once unless asked to yield, else once resumed or stopping. Returns the
        seconds it waited."""
        if self._resume.is_set():
            return 0.0
        t0 = time.monotonic()
        who = f"{self._to!r}" if self._to else "an interactive holder"
        self._emit("phase", {"phase": "yielding", "message": f"paused after step {step}: {who} is busy on this GPU "
                                                             "and batch work there yields between its steps"})
        while not self._resume.wait(POLL_S):
            if self._should_stop():
                break
        paused = time.monotonic() - t0
        self.yielded_s += paused
        self._emit("phase", {"phase": "training", "message": f"resumed after yielding {paused:.1f} s "
                                                             f"({self.yielded_s:.1f} s in all)"})
        return paused
