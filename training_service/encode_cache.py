"""Text-encoder outputs and VAE latents kept on disk between jobs.

A rerun on the same base and data can then skip loading the text encoders (about 8 to 10 GB at full size)
and the VAE. This is the common case when a user sweeps learning rates or ranks.

Each entry is keyed by everything that decides its value:
- the component's files: names, sizes and modification times, plus every small JSON/text file's content;
- the exact input: the caption, or the image file's fingerprint with its crop and target size;
- the dtype it is kept in;
- the objective that encoded it.

A changed image, caption or base therefore misses the cache and is encoded again. An entry is written to
a temporary file and renamed into place, so a crash never leaves a half-written entry behind.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

SMALL_FILE = 1 << 20  # configs and tokenizer files: hashed by content, weights by name, size and mtime


def component_id(base_dir: str | Path, subfolders: list[str]) -> str:
    """A digest of the files that make up these pipeline components."""
    digest = hashlib.sha256()
    base = Path(base_dir)
    for sub in sorted(subfolders):
        folder = base / sub
        for path in sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else ():
            stat = path.stat()
            digest.update(f"{path.relative_to(base)}\0{stat.st_size}\0".encode())
            if stat.st_size <= SMALL_FILE:
                digest.update(path.read_bytes())
            else:
                digest.update(str(stat.st_mtime_ns).encode())
    return digest.hexdigest()


def file_fingerprint(path: str | Path) -> str:
    stat = Path(path).stat()
    return f"{Path(path).resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"


class EncodeCache:
    """One folder per kind ("text", "latents"). A cache without a root stores nothing and finds nothing."""

    def __init__(self, root: str | Path | None):
        self.root = Path(root) if root else None

    def _path(self, kind: str, key: dict) -> Path:
        name = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
        return self.root / kind / f"{name}.safetensors"

    def get(self, kind: str, key: dict) -> dict[str, torch.Tensor] | None:
        if self.root is None:
            return None
        path = self._path(kind, key)
        if not path.is_file():
            return None
        from safetensors.torch import load_file

        try:
            return load_file(path)
        except Exception:  # noqa: BLE001 - a damaged entry is a miss; the fresh value replaces it
            return None

    def put(self, kind: str, key: dict, tensors: dict[str, torch.Tensor]) -> None:
        if self.root is None:
            return
        from safetensors.torch import save_file

        path = self._path(kind, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        save_file({k: v.contiguous() for k, v in tensors.items()}, staging)
        os.replace(staging, path)
