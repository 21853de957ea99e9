"""NVML every 50 ms on every device: each process's used bytes per device, and each device's used bytes, as peaks
since the last reset; and the processes under a service, whose use counts against its lease. The benches that hold
services to their leases read it (lease_usage, multigpu_run)."""
from __future__ import annotations

import subprocess
import threading
from typing import Callable

def descendants(pid: int) -> list[int]:
    """Every process under `pid` (a trainer may be forked from the training service's warm trainer)."""
    out, todo = [], [pid]
    while todo:
        found = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout.split()
        out += [int(x) for x in found]
        todo += [int(x) for x in found]
    return out


# One reading: device index -> ({pid: used bytes}, the device's used bytes).
Reading = dict[int, tuple[dict[int, int], int]]


def nvml_reader() -> Callable[[], Reading] | None:
    """A reader over the host's NVML, or None where NVML cannot be read (a CPU host)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception as e:  # noqa: BLE001 - ImportError, OSError, pynvml.NVMLError_LibraryNotFound and its kin
        print(f"NVML not read: {e}", flush=True)
        return None

    def read() -> Reading:
        return {index: ({p.pid: int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)},
                        int(pynvml.nvmlDeviceGetMemoryInfo(h).used))
                for index, h in enumerate(handles)}

    return read


class NvmlSampler:
    def __init__(self, read: Callable[[], Reading], every_s: float = 0.05):
        self.read, self.every_s = read, every_s
        self.lock = threading.Lock()
        self.peaks: dict[tuple[int, int], int] = {}  # (device, pid) -> peak bytes
        self.device_peaks: dict[int, int] = {}
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self, index: int = 0) -> dict[int, int]:
        return self.read().get(index, ({}, 0))[0]

    def device_used(self, index: int = 0) -> int:
        return self.read().get(index, ({}, 0))[1]

    def sample(self) -> None:
        reading = self.read()
        with self.lock:
            for index, (procs, used) in reading.items():
                for pid, b in procs.items():
                    self.peaks[index, pid] = max(self.peaks.get((index, pid), 0), b)
                self.device_peaks[index] = max(self.device_peaks.get(index, 0), used)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.every_s)

    def close(self) -> None:
        self.stop.set()
        self._thread.join()

    def reset(self) -> None:
        with self.lock:
            self.peaks, self.device_peaks = {}, {}

    def device_peak(self, index: int = 0) -> int:
        with self.lock:
            return self.device_peaks.get(index, 0)

    def peak(self, pids, index: int | None = 0) -> int:
        """The pids' peaks summed, on one device (None: every device)."""
        pids = set(pids)
        with self.lock:
            return sum(b for (i, pid), b in self.peaks.items() if pid in pids and (index is None or i == index))

    def devices_of(self, pids) -> list[int]:
        """The devices any of the pids has used memory on since the last reset."""
        pids = set(pids)
        with self.lock:
            return sorted({i for (i, pid), b in self.peaks.items() if pid in pids and b > 0})
