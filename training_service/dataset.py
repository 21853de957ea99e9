"""The training images and their captions, discovered and checked before any GPU is asked for.

Captions come from a .txt or .caption sidecar, or a metadata.jsonl ({"file_name", "text"} per line),
or the instance prompt. Every image is decoded once here: a corrupt upload fails the request, not
the trainer child after the resident models were evicted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from service_kit.errors import InvalidArgument, NotFound

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}


@dataclass(frozen=True)
class Example:
    image: Path
    caption: str
    width: int
    height: int


def discover(image_dir: str, instance_prompt: str = "") -> list[Example]:
    from PIL import Image, UnidentifiedImageError

    root = Path(image_dir).expanduser()
    if not image_dir:
        raise InvalidArgument("dataset.image_dir is required", reason="MISSING_DATASET")
    if not root.is_dir():
        raise NotFound(f"dataset folder {root} does not exist", reason="DATASET_NOT_FOUND")
    metadata = _metadata(root)
    images = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise InvalidArgument(f"{root} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})", reason="EMPTY_DATASET")
    examples, uncaptioned, broken = [], [], []
    for path in images:
        caption = _caption(path, metadata) or instance_prompt
        if not caption:
            uncaptioned.append(path.name)
            continue
        try:
            with Image.open(path) as img:
                img.load()  # a full decode: verify() alone misses truncated data
                size = img.size
        except (UnidentifiedImageError, OSError, ValueError) as e:
            broken.append(f"{path.name} ({type(e).__name__})")
            continue
        examples.append(Example(path, caption, *size))
    if broken:
        raise InvalidArgument(f"{len(broken)} image(s) do not decode: {', '.join(broken[:10])}", reason="BAD_IMAGE")
    if uncaptioned:
        raise InvalidArgument(f"{len(uncaptioned)} image(s) have no caption and no instance_prompt was given: "
                              f"{', '.join(uncaptioned[:10])}", reason="MISSING_CAPTION")
    return examples


def _metadata(root: Path) -> dict[str, str]:
    path = root / "metadata.jsonl"
    if not path.is_file():
        return {}
    out = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out[row["file_name"]] = row["text"]
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidArgument(f"metadata.jsonl line {n} is not {{\"file_name\", \"text\"}}: {e}",
                                  reason="BAD_METADATA") from e
    return out


def _caption(path: Path, metadata: dict[str, str]) -> str:
    for suffix in (".txt", ".caption"):
        sidecar = path.with_suffix(suffix)
        if sidecar.is_file():
            return sidecar.read_text().strip()
    return metadata.get(path.name, "").strip()


def fingerprint(examples: list[Example]) -> str:
    """Identity of a dataset for checkpoint checks: names, sizes, modification times, captions.

    A replaced image (same name, new pixels) changes it, so a resume cannot silently train on other data."""
    import hashlib

    h = hashlib.sha256()
    for ex in examples:
        st = ex.image.stat()
        h.update(f"{ex.image.name}\0{st.st_size}\0{st.st_mtime_ns}\0{ex.caption}\n".encode())
    return h.hexdigest()[:16]
