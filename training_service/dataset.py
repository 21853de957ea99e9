"""The training images and their captions, discovered and checked before any GPU is asked for.

Captions come from a .txt or .caption sidecar, or a metadata.jsonl ({"file_name", "text"} per line),
or the instance prompt. Every image is decoded once here: a corrupt upload fails the request, not
the trainer child after the resident models were evicted. The folder must be inside the dataset
roots, and so must every file read from it (a symlink may point anywhere).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from diffusion_kit.path_roots import Roots
from service_kit.errors import InvalidArgument, NotFound

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}
# The largest training image, read from its header before any pixel is decoded (a 20000x20000 PNG
# would otherwise take gigabytes to check). Far above any training resolution.
MAX_IMAGE_PIXELS = 64 * 10**6
MAX_IMAGES = 100_000
MAX_CAPTION_BYTES = 64 * 2**10


@dataclass(frozen=True)
class Example:
    image: Path
    caption: str
    width: int
    height: int


def discover(image_dir: str, instance_prompt: str = "", roots: Roots | None = None) -> list[Example]:
    """The examples of a dataset folder; `roots` confine the folder and every file read from it."""
    from PIL import Image, UnidentifiedImageError

    if not image_dir:
        raise InvalidArgument("dataset.image_dir is required", reason="MISSING_DATASET")
    root = roots.confine(image_dir, "dataset.image_dir") if roots else Path(image_dir).expanduser()
    if not root.is_dir():
        raise NotFound(f"dataset folder {root} does not exist", reason="DATASET_NOT_FOUND")
    confine = (lambda p: roots.confine_found(p, f"dataset file {p.name}")) if roots else (lambda p: p)
    metadata = _metadata(root, confine)
    images = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise InvalidArgument(f"{root} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})", reason="EMPTY_DATASET")
    if len(images) > MAX_IMAGES:
        raise InvalidArgument(f"{root} holds {len(images)} images; a job takes at most {MAX_IMAGES}",
                              reason="DATASET_TOO_LARGE")
    examples, uncaptioned, broken = [], [], []
    for path in images:
        confine(path)
        caption = _caption(path, metadata, confine) or instance_prompt
        if not caption:
            uncaptioned.append(path.name)
            continue
        try:
            with Image.open(path) as img:
                size = img.size
                if size[0] * size[1] > MAX_IMAGE_PIXELS:
                    broken.append(f"{path.name} ({size[0]}x{size[1]}: more than {MAX_IMAGE_PIXELS // 10**6} "
                                  "megapixels)")
                    continue
                img.load()  # a full decode: verify() alone misses truncated data
        except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
            broken.append(f"{path.name} ({type(e).__name__})")
            continue
        examples.append(Example(path, caption, *size))
    if broken:
        raise InvalidArgument(f"{len(broken)} image(s) do not decode: {', '.join(broken[:10])}", reason="BAD_IMAGE")
    if uncaptioned:
        raise InvalidArgument(f"{len(uncaptioned)} image(s) have no caption and no instance_prompt was given: "
                              f"{', '.join(uncaptioned[:10])}", reason="MISSING_CAPTION")
    return examples


def _metadata(root: Path, confine) -> dict[str, str]:
    path = root / "metadata.jsonl"
    if not path.is_file():
        return {}
    confine(path)
    if path.stat().st_size > MAX_IMAGES * MAX_CAPTION_BYTES:
        raise InvalidArgument("metadata.jsonl is larger than any dataset this service takes", reason="BAD_METADATA")
    out = {}
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            name, text = row["file_name"], row["text"]
            if not isinstance(name, str) or not isinstance(text, str):
                raise TypeError("file_name and text must be strings")
            out[name] = text
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidArgument(f"metadata.jsonl line {n} is not {{\"file_name\", \"text\"}} ({type(e).__name__})",
                                  reason="BAD_METADATA") from e
    return out


def _caption(path: Path, metadata: dict[str, str], confine) -> str:
    for suffix in (".txt", ".caption"):
        sidecar = path.with_suffix(suffix)
        if sidecar.is_file():
            confine(sidecar)
            if sidecar.stat().st_size > MAX_CAPTION_BYTES:
                raise InvalidArgument(f"{sidecar.name} is longer than a caption may be ({MAX_CAPTION_BYTES} bytes)",
                                      reason="BAD_CAPTION")
            return sidecar.read_text(errors="replace").strip()
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
