"""How many parameters a pipeline's components hold, read from safetensors headers without loading weights.

Both services size their memory requests from it: inference plans offload and leases, training its lease.
"""
from __future__ import annotations

import json
from pathlib import Path


def safetensors_params(path: Path) -> int:
    """Parameter count from a safetensors header: the first 8 bytes give its length, then JSON."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    total = 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in meta["shape"]:
            count *= dim
        total += count
    return total


def component_params(pipeline_dir: Path) -> dict[str, int]:
    index = json.loads((pipeline_dir / "model_index.json").read_text())
    out = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list):
            continue
        files = list((pipeline_dir / name).glob("*.safetensors")) if (pipeline_dir / name).is_dir() else []
        if files:
            out[name] = sum(safetensors_params(f) for f in files)
    return out
