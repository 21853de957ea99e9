"""Inference first on a shared GPU: the broker hears (SetBusy on the model's lease) while generations run or wait,
so batch work sharing the device, a training job, pauses between its steps (gpu_broker.compute_share).

The service says idle again only `linger_s` after its queue empties: a caller sending requests back to back
would otherwise let a training step in before each. Nothing here ever delays or fails a generation: the calls go
out on their own task, and a broker that does not take them (down, or older and without SetBusy) is said in the
generation's resolved record as a fallback.
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from diffusion_kit.resolved import Resolved, Source, Status

log = logging.getLogger(__name__)

CONTROL = "gpu_sharing"


class BusySignal:
    def __init__(self, linger_s: float = 0.5):
        self.linger_s = linger_s
        self._wanted: tuple[object, bool] | None = None  # (the HeldLease, busy) the broker should hear
        self._said: tuple[str, bool] | None = None  # (lease id, busy) the broker last took
        self._failed: tuple[str, str] | None = None  # (lease id, why) when the last call for it was refused
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._linger: asyncio.Task | None = None

    def set(self, lease, busy: bool) -> None:
        """Work is (or is no longer) running or queued on `lease` (a HeldLease, or None without a broker)."""
        if lease is None:
            return
        if busy:
            self._cancel_linger()
            self._want(lease, True)
        elif self._linger is None and self._wanted is not None and self._wanted[1]:
            self._linger = asyncio.get_running_loop().create_task(self._idle_after(lease))

    def record(self, lease) -> Resolved | None:
        """What this generation's record says about sharing its device; None without a broker."""
        if lease is None:
            return None
        if self._failed is not None and self._failed[0] == lease.lease_id:
            return Resolved(CONTROL, "", "not marked busy", Source.AUTO, Status.FELL_BACK,
                            reason=f"the broker did not take SetBusy ({self._failed[1]}): batch work sharing device "
                                   f"{lease.device_index} was not asked to yield and may run beside this generation")
        return Resolved(CONTROL, "", "inference-first", Source.AUTO,
                        reason=f"this model's lease is marked busy while generations run or wait: training (batch "
                               f"leases of no higher priority) on device {lease.device_index} pauses at its next "
                               "step or backward pass until this model is idle")

    async def close(self) -> None:
        self._cancel_linger()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # ---- the calls, one at a time and only what changed -------------------------------------------------------

    def _want(self, lease, busy: bool) -> None:
        self._wanted = (lease, busy)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send_forever())

    async def _idle_after(self, lease) -> None:
        try:
            await asyncio.sleep(self.linger_s)
        except asyncio.CancelledError:
            return
        self._linger = None
        self._want(lease, False)

    def _cancel_linger(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    async def _send_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            lease, busy = self._wanted
            if self._said == (lease.lease_id, busy) or not lease.lease_id:
                continue
            try:
                await lease.set_busy(busy)
                self._said, self._failed = (lease.lease_id, busy), None
            except grpc.aio.AioRpcError as e:
                self._failed = (lease.lease_id, f"{e.code().name}: {e.details()}")
                log.warning("SetBusy not taken", extra={"fields": {"lease_id": lease.lease_id, "busy": busy,
                                                                  "code": e.code().name}})
