"""Which files of a hub repo a pipeline load fetches: the components the pipeline loads, in safetensors, of one
weight variant. Pure: names and sizes in, names out.

diffusers names a variant's weights `<name>.<variant>.safetensors` (sharded `<name>.<variant>-00001-of-00002
.safetensors`, index `<name>.safetensors.index.<variant>.json`). No variant asked: the plain files, as
`from_pretrained` loads them. A variant asked: that variant's weights where a component has them, its plain
weights where it has not (as diffusers falls back), each such component named.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from service_kit.errors import InvalidArgument

SIDE_FILES = ("*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken")
_WEIGHTS = re.compile(r"[^./]+(?:\.(?P<variant>[A-Za-z0-9_]+))?(?:-\d{5}-of-\d{5})?\.safetensors")
_INDEX = re.compile(r"[^./]+\.safetensors\.index(?:\.(?P<variant>[A-Za-z0-9_]+))?\.json")


@dataclass(frozen=True)
class FileChoice:
    files: tuple[str, ...]  # repo paths to fetch
    total_bytes: int
    plain_fallbacks: tuple[str, ...]  # components without the variant asked for: their plain weights


def components(model_index: dict) -> list[str]:
    return [name for name, spec in model_index.items()
            if not name.startswith("_") and isinstance(spec, list) and spec[0] is not None]


def _variant_of(filename: str) -> tuple[bool, str | None]:
    """(is a weight or weight index, its variant or None)."""
    for pattern in (_WEIGHTS, _INDEX):
        match = pattern.fullmatch(filename)
        if match:
            return True, match.group("variant")
    return False, None


def weights_of_variant(paths: list, variant: str = "") -> list:
    """The weight files from_pretrained loads for `variant` (plain where a folder has none of that variant)."""
    by_variant: dict[str | None, list] = {}
    for path in paths:
        is_weight, v = _variant_of(getattr(path, "name", str(path)))
        if is_weight:
            by_variant.setdefault(v, []).append(path)
    return by_variant.get(variant or None) or by_variant.get(None) or []


def choose_files(listing: list[tuple[str, int]], model_index: dict, variant: str = "") -> FileChoice:
    """The repo's files the pipeline loads (model_index.json, each component's configs, tokenizer files and one
    variant of its weights), from the repo's (path, size) listing."""
    sizes = dict(listing)
    chosen = ["model_index.json"] if "model_index.json" in sizes else []
    fallbacks, only_variant = [], []
    for name in components(model_index):
        inside = [p for p in sizes if p.startswith(name + "/") and "/" not in p[len(name) + 1:]]
        weights: dict[str | None, list[str]] = {}
        for path in inside:
            base = path[len(name) + 1:]
            is_weight, v = _variant_of(base)
            if is_weight:
                weights.setdefault(v, []).append(path)
            elif any(fnmatch.fnmatch(base, p) for p in SIDE_FILES):
                chosen.append(path)
        want = variant or None
        if want in weights:
            chosen += weights[want]
        elif None in weights:
            chosen += weights[None]
            if want is not None:
                fallbacks.append(name)
        elif weights:
            only_variant.append(f"{name} ({', '.join(sorted(v for v in weights if v))})")
    if only_variant:
        raise InvalidArgument(f"these components have only variant weights: {'; '.join(only_variant)}; ask for "
                              "one of those variants (HubRepo.variant)", reason="VARIANT_REQUIRED")
    chosen = sorted(set(chosen))
    return FileChoice(tuple(chosen), sum(sizes[p] for p in chosen), tuple(fallbacks))
