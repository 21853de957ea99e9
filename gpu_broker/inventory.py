"""Which devices the broker leases: real CUDA devices read through NVML, or a configured fake inventory."""
from __future__ import annotations

import re
from dataclasses import dataclass

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SPEC = re.compile(r"^\s*(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    uuid: str
    total_bytes: int


class InventoryError(ValueError):
    pass


def parse_fake_devices(spec: str) -> list[DeviceInfo]:
    """'2x24GiB' -> two 24 GiB devices. Groups may be joined with commas: '1x80GiB,2x24GiB'."""
    devices: list[DeviceInfo] = []
    for group in spec.split(","):
        m = _SPEC.match(group)
        if not m:
            raise InventoryError(f"--fake-devices wants NxSIZE such as 2x24GiB or 1x141GB, got {group.strip()!r}")
        count, size, unit = int(m.group(1)), float(m.group(2)), m.group(3).lower()
        total = int(size * _UNITS[unit])
        if count < 1 or total < 1:
            raise InventoryError(f"--fake-devices needs at least one device of positive size, got {group.strip()!r}")
        for _ in range(count):
            i = len(devices)
            devices.append(DeviceInfo(index=i, name="fake", uuid=f"fake-{i}", total_bytes=total))
    return devices


def parse_size(text: str) -> int:
    """'1GiB' -> 1073741824; '0' -> 0."""
    m = re.match(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b|b)?\s*$", text, re.IGNORECASE)
    if not m:
        raise InventoryError(f"wants a size such as 1GiB or 512MiB, got {text.strip()!r}")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])


def set_aside(devices: list[DeviceInfo], reserve_bytes: int) -> list[DeviceInfo]:
    """The devices as the broker lends them: each one's memory less what is set aside for the CUDA contexts
    that no lease covers (a service process holds its context for its whole life, model or not)."""
    if any(d.total_bytes <= reserve_bytes for d in devices):
        raise InventoryError(f"--context-reserve {reserve_bytes} bytes leaves nothing to lend on a device")
    return [DeviceInfo(d.index, d.name, d.uuid, d.total_bytes - reserve_bytes) for d in devices]


def probe_cuda_devices() -> list[DeviceInfo]:
    """The host's NVIDIA devices, through NVML (no CUDA context is created in the broker).

    Raises InventoryError with the reason when NVML is unavailable (no driver, no GPU).
    """
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        raise InventoryError(f"nvidia-ml-py is not installed: {e}") from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise InventoryError(f"NVML unavailable (no NVIDIA driver or GPU): {e}") from e
    try:
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            devices.append(DeviceInfo(index=i, name=_text(name), uuid=_text(uuid), total_bytes=int(total)))
        return devices
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


