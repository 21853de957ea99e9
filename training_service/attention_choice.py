"""Which fused attention kernels (PyTorch SDPA backends) a training step may use, in the order it prefers them.

Pure, so the service states in the resolved record exactly what the trainer child will pin. The pin holds over
backward too: gradient checkpointing recomputes the forward there, and another kernel saves other tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

KERNELS = ("cudnn", "flash", "efficient")  # the fused SDPA backends a pin may name
# Flash first, memory-efficient where flash cannot run the call (a mask, an odd head size). PyTorch's default
# order puts cuDNN first on Hopper, and cuDNN crashed a FLUX training step with an illegal memory access.
PINNED = ("flash", "efficient")
# SPEED_MODE_MAX on Z-Image's compiled bf16 step without gradient checkpointing puts cuDNN first: there its losses
# agree with flash's to 1e-4 over three bucket shapes and its warm steps are faster, while an example whose
# sequence length is new costs it one slower step (docs/bench/training.md, 2026-12-07). Nothing else has been
# measured under it: nf4, fp8 and checkpointing keep PINNED, and so does FLUX, where cuDNN crashed.
CUDNN_FIRST = ("cudnn", *PINNED)


@dataclass(frozen=True)
class AttentionChoice:
    kernels: tuple[str, ...]  # empty: PyTorch's own choice (no GPU)
    reason: str

    def describe(self) -> str:
        return " / ".join(self.kernels) + " SDPA (pinned, in this order)" if self.kernels else \
            "SDPA (PyTorch's choice on CPU)"


def training_attention(family_key: str, device: str, asked: tuple[str, ...] = (), *, speed_max: bool = False,
                       precision: str = "", compiled: bool = False, checkpointing: bool = False) -> AttentionChoice:
    """The kernels a step pins on `device`. `asked` (an operator's override, as the benchmarks pass) wins when
    every name in it is a fused kernel; ValueError otherwise. `speed_max`: the job asked for SPEED_MODE_MAX, whose
    step is `compiled` or not, at base `precision` ("bf16", ...), with gradient `checkpointing` or without."""
    if not device.startswith("cuda"):
        return AttentionChoice((), "")
    if asked:
        unknown = [k for k in asked if k not in KERNELS]
        if unknown:
            raise ValueError(f"attention kernels are {', '.join(KERNELS)}; not {', '.join(unknown)}")
        return AttentionChoice(tuple(asked), "asked for")
    if speed_max and family_key == "zimage" and precision == "bf16" and compiled and not checkpointing:
        return AttentionChoice(CUDNN_FIRST, "SPEED_MODE_MAX: cuDNN first on Z-Image's compiled bf16 step without "
                                            "gradient checkpointing, where its losses were measured to agree with "
                                            "flash's; each new sequence length costs one slower step")
    return AttentionChoice(PINNED, "cuDNN SDPA crashed on FLUX training shapes (an illegal memory access)"
                                   + (" and is measured for SPEED_MODE_MAX on Z-Image's compiled bf16 step without "
                                      "gradient checkpointing only" if speed_max else ""))


def compile_cache_tag(kernels: tuple[str, ...]) -> str:
    """The tag a step pinned to `kernels` puts in torch.compile's cache keys (torch.compiler.config.cache_key_tag).
    The compile caches on disk key a graph without the SDPA kernel selection it was traced under, and a traced
    graph holds the kernel chosen then: without the tag, a job under one pin is handed the graphs a job under
    another pin compiled (measured: a cuDNN pin ran flash kernels after a flash-pinned job on the same host)."""
    return "sdpa:" + ",".join(kernels) if kernels else ""


def sdpa_backends(kernels: tuple[str, ...]) -> list:
    """The torch SDPBackend values of `kernels`, in order."""
    from torch.nn.attention import SDPBackend

    names = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}
    return [names[k] for k in kernels]
