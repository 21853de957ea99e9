"""What each lease's holder really uses on its device: NVML's per-process memory, attributed to leases by process.

A lease's usage is the device memory of its holder's process (the pid the client library sends) and
of that process's descendants on the same device (a training service's jobs run in child processes).
The broker reports a lease whose usage exceeds what it holds (lease_book.report_usage); it takes
nothing away. NVML creates no CUDA context, so the broker itself uses no device memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable


def attribute(on_device: dict[int, dict[int, int]], holders: Iterable[tuple[str, int, int]],
              parent_of: Callable[[int], int]) -> dict[str, int]:
    """Lease id -> bytes used, from device -> {pid: bytes} and (lease id, device, holder pid) triples.

    A process counts for the lease on its device whose holder pid is the process or one of its ancestors
    (the nearest one, if several). Leases with no holder pid are left out: nothing can be said of them."""
    by_device: dict[int, dict[int, str]] = {}
    for lease_id, device, pid in holders:
        if pid > 0:
            by_device.setdefault(device, {})[pid] = lease_id
    used: dict[str, int] = {lease_id: 0 for leases in by_device.values() for lease_id in leases.values()}
    for device, processes in on_device.items():
        owners = by_device.get(device, {})
        for pid, nbytes in processes.items():
            seen, current = 0, pid
            while current > 1 and seen < 64:  # init (1) owns everything; a bounded walk up the tree
                if current in owners:
                    used[owners[current]] += nbytes
                    break
                current, seen = parent_of(current), seen + 1
    return used


def parent_of(pid: int) -> int:
    """The parent of a process on this host (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses


class NvmlUsage:
    """device index -> {pid: bytes} for every compute process, read through NVML."""

    def __init__(self, device_count: int):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(device_count)]

    def __call__(self) -> dict[int, dict[int, int]]:
        out = {}
        for index, handle in enumerate(self._handles):
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            out[index] = {p.pid: int(p.usedGpuMemory or 0) for p in processes}
        return out
