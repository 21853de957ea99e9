"""A training job's side of sharing its GPU with inference: it waits while the broker asks batch work on its
device to yield (a busy interactive holder, gpu_broker.compute_share), and says so on its stream.

The recipe calls the gate at two points of every step: between steps (the step before has finished on the
device: its loss was read) and between a forward pass and its backward (the backward is most of a step, so
inference gets the GPU up to that much sooner; the forward's last kernels may still finish, and its
activations stay in memory, within the lease). A paused job keeps its memory and lease.
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

    def __call__(self, step: int, where: str = "between steps") -> float:
        """At a pause point (`where`: between steps, or between a step's forward and backward passes): returns at
        once unless asked to yield, else once resumed or stopping. Returns the seconds it waited."""
        if self._resume.is_set():
            return 0.0
        t0 = time.monotonic()
        who = f"{self._to!r}" if self._to else "an interactive holder"
        at = f"after step {step}" if where == "between steps" else f"{where} {step + 1}"
        self._emit("phase", {"phase": "yielding", "message": f"paused {at}: {who} is busy on this GPU and batch "
                                                             "work there yields until it is idle"})
        while not self._resume.wait(POLL_S):
            if self._should_stop():
                break
        paused = time.monotonic() - t0
        self.yielded_s += paused
        self._emit("phase", {"phase": "training", "message": f"resumed after yielding {paused:.1f} s "
                                                             f"({self.yielded_s:.1f} s in all)"})
        return paused
