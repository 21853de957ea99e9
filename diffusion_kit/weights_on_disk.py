"""How many parameters a pipeline's components hold, read from safetensors headers without loading weights,
and whether each file is whole: every tensor's offsets against the file's size, its dtype and shape.

Both services size their memory requests from it (inference plans offload and leases, training its
lease), and both run it before any GPU is asked for, so a corrupt or truncated file is refused
while the resident model keeps running.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from service_kit.errors import InvalidArgument

# Bytes per element of each safetensors dtype.
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit


def _corrupt(path: Path, why: str) -> InvalidArgument:
    return InvalidArgument(f"{path.name} is not a whole safetensors file: {why}", reason="CORRUPT_WEIGHTS",
                           metadata={"file": path.name})


def safetensors_params(path: Path) -> int:
    """Parameter count from a safetensors header (8-byte length, then JSON), after checking the file is whole."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _corrupt(path, "shorter than its 8-byte header length")
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise _corrupt(path, f"its header claims {n} bytes, the file has {size - 8} after the length")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise _corrupt(path, f"the header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "the header is not a JSON object")
    data_bytes = size - 8 - n
    total, covered = 0, 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        total += _tensor_elements(path, name, meta, data_bytes)
        covered = max(covered, meta["data_offsets"][1])
    if covered > data_bytes:
        raise _corrupt(path, f"truncated: the tensors need {covered} data bytes, the file has {data_bytes}")
    return total


def _tensor_elements(path: Path, name: str, meta, data_bytes: int) -> int:
    label = name[:80]
    if not isinstance(meta, dict) or not isinstance(meta.get("shape"), list) or \
            not isinstance(meta.get("data_offsets"), list) or len(meta["data_offsets"]) != 2:
        raise _corrupt(path, f"tensor {label!r} lacks dtype, shape or data_offsets")
    dtype, shape, (begin, end) = meta.get("dtype"), meta["shape"], meta["data_offsets"]
    if dtype not in DTYPE_BYTES:
        raise _corrupt(path, f"tensor {label!r} has an unknown dtype {str(dtype)[:20]!r}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**48 for d in shape) or len(shape) > 8:
        raise _corrupt(path, f"tensor {label!r} has an impossible shape")
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in (begin, end)) or not 0 <= begin <= end:
        raise _corrupt(path, f"tensor {label!r} has impossible data_offsets")
    count = math.prod(shape)
    if end - begin != count * DTYPE_BYTES[dtype]:
        raise _corrupt(path, f"tensor {label!r} spans {end - begin} bytes, its shape and dtype need "
                             f"{count * DTYPE_BYTES[dtype]}")
    if end > data_bytes:
        raise _corrupt(path, f"truncated: tensor {label!r} ends at byte {end}, the data has {data_bytes}")
    return count


def component_params(pipeline_dir: Path, variant: str = "") -> dict[str, int]:
    """Parameters per component of a diffusers directory, counting the weights of one variant ("" the plain ones,
    as from_pretrained loads them); every file counted is checked whole on the way."""
    from diffusion_kit.hub_files import weights_of_variant

    try:
        index = json.loads((pipeline_dir / "model_index.json").read_text())
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidArgument(f"model_index.json of {pipeline_dir.name} is not JSON ({type(e).__name__})",
                              reason="NOT_A_PIPELINE") from None
    if not isinstance(index, dict):
        raise InvalidArgument(f"model_index.json of {pipeline_dir.name} is not a JSON object", reason="NOT_A_PIPELINE")
    out = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list):
            continue
        files = weights_of_variant(list((pipeline_dir / name).glob("*.safetensors")), variant) \
            if (pipeline_dir / name).is_dir() else []
        if files:
            out[name] = sum(safetensors_params(f) for f in files)
    return out
