"""Whether a GGUF file is whole, read from its header and tensor table without loading a weight.

A garbage or truncated file is refused before any GPU is asked for, as a safetensors file is
(diffusion_kit.weights_on_disk); the resident model keeps running.
"""
from __future__ import annotations

from pathlib import Path

from service_kit.errors import InvalidArgument


def check_gguf(path: Path) -> int:
    """The number of tensors in a whole GGUF file; INVALID_ARGUMENT (CORRUPT_WEIGHTS) otherwise."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise _corrupt(path, "it does not start with the GGUF magic bytes")
    try:
        from gguf import GGUFReader

        reader = GGUFReader(path)
        tensors = list(reader.tensors)
    except Exception as e:  # noqa: BLE001 - the reader raises anything from ValueError to IndexError on garbage
        raise _corrupt(path, f"its header or tensor table does not parse ({type(e).__name__})") from None
    if not tensors:
        raise _corrupt(path, "it holds no tensors")
    for t in tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise _corrupt(path, f"truncated: tensor {t.name[:80]!r} ends at byte {end}, the file has {size}")
    return len(tensors)


def _corrupt(path: Path, why: str) -> InvalidArgument:
    return InvalidArgument(f"{path.name} is not a whole GGUF file: {why}", reason="CORRUPT_WEIGHTS",
                           metadata={"file": path.name})
