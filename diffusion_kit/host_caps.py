"""Host facts, gathered once into a HostCaps value that policies take as input.

Each probe runs on its own, so one failing import or API never reads as another
capability's answer. Tests build HostCaps directly instead of monkeypatching torch.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class HostCaps:
    device_kind: str  # "cuda", "rocm", "xpu", "mps" or "cpu"
    device_name: str
    total_bytes: int
    free_bytes: int
    capability: tuple[int, int] | None = None  # NVIDIA compute capability
    native_bf16: bool = False
    torchao: bool = False
    torchao_reason: str = ""
    bitsandbytes: bool = False
    bitsandbytes_reason: str = ""
    # bitsandbytes' 8-bit AdamW stepped on this host's device (probed for the training service only).
    adamw8bit: bool = False
    adamw8bit_reason: str = "not probed"
    # Quantisation schemes that passed a quantise+matmul smoke probe on this device, with the failures' reasons.
    quant_schemes: frozenset[str] = frozenset()
    quant_failures: dict[str, str] = field(default_factory=dict)

    @property
    def accelerator(self) -> bool:
        return self.device_kind != "cpu"

    @property
    def fp8_capable(self) -> bool:
        return self.device_kind == "cuda" and self.capability is not None and self.capability >= (8, 9)

    @property
    def blackwell(self) -> bool:
        return self.device_kind == "cuda" and self.capability is not None and self.capability[0] >= 10

    @property
    def torch_device(self) -> str:
        """The torch device string work runs on: ROCm is "cuda" to torch."""
        return TORCH_DEVICE.get(self.device_kind, "cpu")

    def with_free(self, free_bytes: int) -> "HostCaps":
        return replace(self, free_bytes=free_bytes)


TORCH_DEVICE = {"cuda": "cuda", "rocm": "cuda", "xpu": "xpu", "mps": "mps", "cpu": "cpu"}


def native_bf16(device_kind: str, capability: tuple[int, int] | None, rocm_bf16: bool = False) -> bool:
    """NVIDIA: capability major >= 8 (torch.cuda.is_bf16_supported() also counts pre-Ampere emulation)."""
    if device_kind == "cuda":
        return capability is not None and capability[0] >= 8
    if device_kind == "rocm":
        return rocm_bf16
    return device_kind in ("xpu", "mps")


def probe_device() -> dict:
    import torch

    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info(0)
        if torch.version.hip:
            return dict(device_kind="rocm", device_name=torch.cuda.get_device_name(0), total_bytes=total,
                        free_bytes=free, native_bf16=native_bf16("rocm", None, torch.cuda.is_bf16_supported()))
        cap = torch.cuda.get_device_capability(0)
        return dict(device_kind="cuda", device_name=torch.cuda.get_device_name(0), total_bytes=total,
                    free_bytes=free, capability=cap, native_bf16=native_bf16("cuda", cap))
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        props = torch.xpu.get_device_properties(0)
        return dict(device_kind="xpu", device_name=props.name, total_bytes=props.total_memory,
                    free_bytes=props.total_memory, native_bf16=True)
    if torch.backends.mps.is_available():
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return dict(device_kind="mps", device_name="Apple MPS", total_bytes=total, free_bytes=total, native_bf16=True)
    page = os.sysconf("SC_PAGE_SIZE")
    return dict(device_kind="cpu", device_name="CPU", total_bytes=page * os.sysconf("SC_PHYS_PAGES"),
                free_bytes=page * os.sysconf("SC_AVPHYS_PAGES"), native_bf16=False)


def probe_torchao() -> tuple[bool, str]:
    """True only when the real API imports and quantize_ actually changes a module (rejects import stubs)."""
    try:
        import torch
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except Exception as e:  # any import-time failure means: not usable
        return False, f"torchao does not import: {e}"
    try:
        lin = torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False))
        before = type(lin[0].weight)
        from diffusion_kit.quant_probe import contained

        quantize_(lin, contained(Int8WeightOnlyConfig()))
        if type(lin[0].weight) is before:
            return False, "torchao.quantize_ left the weight unchanged (a stub build)"
    except Exception as e:
        return False, f"torchao quantize_ failed: {e}"
    return True, ""


def probe_bitsandbytes(device_kind: str) -> tuple[bool, str]:
    if device_kind not in ("cuda", "rocm", "xpu"):
        return False, "bitsandbytes 4-bit needs a CUDA, ROCm or XPU device"
    try:
        import bitsandbytes as bnb  # noqa: F401
        from bitsandbytes.nn import Linear4bit  # noqa: F401
    except Exception as e:
        return False, f"bitsandbytes does not import: {e}"
    return True, ""


def probe_adamw8bit(device_kind: str) -> tuple[bool, str]:
    """One bitsandbytes AdamW8bit step on a 4096-element tensor (its smallest 8-bit size) of this host's device.

    It passes only when the step moved the weights and kept its state in uint8: bitsandbytes has 8-bit
    optimizer kernels for CUDA (and ROCm builds), XPU and, in recent releases (0.50.2 here), the CPU.
    """
    device = TORCH_DEVICE.get(device_kind)
    if device in (None, "mps"):
        return False, f"bitsandbytes has no 8-bit optimizer for {device_kind}"
    try:
        import bitsandbytes as bnb
        import torch

        weight = torch.nn.Parameter(torch.ones(4096, device=device))
        optimizer = bnb.optim.AdamW8bit([weight], lr=1e-3)
        weight.grad = torch.full_like(weight, 0.5)
        optimizer.step()
        state = optimizer.state[weight]
        if state["state1"].dtype != torch.uint8 or not bool(torch.isfinite(weight).all()) or bool((weight == 1).all()):
            return False, "bitsandbytes AdamW8bit ran but did not step with 8-bit states"
    except Exception as e:
        return False, f"bitsandbytes AdamW8bit failed a one-step probe: {type(e).__name__}: {e}"[:300]
    return True, ""


def probe_host(optimizers: bool = False) -> HostCaps:
    """optimizers: also probe the 8-bit optimizer (the training service; the inference service has no use for it)."""
    device = probe_device()
    ao_ok, ao_reason = probe_torchao()
    bnb_ok, bnb_reason = probe_bitsandbytes(device["device_kind"])
    caps = HostCaps(**device, torchao=ao_ok, torchao_reason=ao_reason, bitsandbytes=bnb_ok,
                    bitsandbytes_reason=bnb_reason)
    if optimizers:
        ok, reason = probe_adamw8bit(caps.device_kind)
        caps = replace(caps, adamw8bit=ok, adamw8bit_reason=reason)
    if ao_ok and caps.device_kind in ("cuda", "cpu"):
        from diffusion_kit.quant_probe import smoke_probe_schemes

        ok, failures = smoke_probe_schemes(caps)
        caps = replace(caps, quant_schemes=frozenset(ok), quant_failures=failures)
    return caps


def caps_to_json(caps: HostCaps) -> str:
    data = asdict(caps)
    data["quant_schemes"] = sorted(caps.quant_schemes)
    return json.dumps(data)


def caps_from_json(text: str) -> HostCaps:
    data = json.loads(text)
    data["capability"] = tuple(data["capability"]) if data.get("capability") else None
    data["quant_schemes"] = frozenset(data.get("quant_schemes", ()))
    return HostCaps(**data)


def probe_host_in_child(optimizers: bool = False, timeout_s: float = 600) -> HostCaps:
    """probe_host in a short-lived child process, so the caller never creates a CUDA context.

    For a process that computes nothing on the device itself (the training service's parent: its jobs
    run in their own processes): a context there would hold device memory that no lease covers."""
    import subprocess
    import sys

    args = [sys.executable, "-m", "diffusion_kit.host_caps"] + (["--optimizers"] if optimizers else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the host probe failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return caps_from_json(lines[-1].removeprefix(_MARK))


def nvml_free_bytes(device_index: int = 0):
    """A function returning the device's free bytes as NVML sees them (no CUDA context), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
    except Exception:  # no NVML library or no NVIDIA device
        return None
    return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)


_MARK = "HOSTCAPS "

if __name__ == "__main__":
    import sys

    print(_MARK + caps_to_json(probe_host(optimizers="--optimizers" in sys.argv[1:])), flush=True)
