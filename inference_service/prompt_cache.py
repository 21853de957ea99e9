"""Repeated prompts skip the text encoders: the pipeline's `encode_prompt` results, kept by its arguments.

Every family's pipeline encodes through its own `encode_prompt` (one call per prompt, and one more for a
negative prompt under CFG); this wraps that method on the loaded pipeline, so the cache knows no family. The
key is every argument the call was given (prompt texts, images per prompt, sequence length, device, LoRA scale);
a call handed precomputed embeddings is not cached. Results are kept on the host, within a byte budget, least
recently used out first, and copied to the device on a hit: nothing here counts against the model's GPU lease.

The text encoders are frozen (adapters apply to the denoiser), so a hit returns what encoding would: the same
embeddings, not an approximation. The cache lives and dies with the loaded model.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from diffusion_kit.resolved import Resolved, Source

CONTROL = "prompt_encoding"
MAX_BYTES = 1 << 30  # host memory for cached embeddings: a FLUX prompt is 4 MiB per image
MAX_ENTRIES = 64


class _Held:
    """A result tensor kept on the host, and the device it goes back to."""

    def __init__(self, tensor, device):
        self.tensor, self.device = tensor, device


def _tensors(obj, fn):
    """obj with every tensor (or held tensor) in it replaced by fn(it): tuples, lists and dicts walked."""
    import torch

    if isinstance(obj, (torch.Tensor, _Held)):
        return fn(obj)
    if isinstance(obj, tuple):
        return tuple(_tensors(x, fn) for x in obj)
    if isinstance(obj, list):
        return [_tensors(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: _tensors(v, fn) for k, v in obj.items()}
    return obj


def _nbytes(obj) -> int:
    total = [0]

    def add(held):
        total[0] += held.tensor.numel() * held.tensor.element_size()
        return held

    _tensors(obj, add)
    return total[0]


def _key(args: tuple, kwargs: dict):
    """A hashable key of the call's arguments, or None when one of them is a tensor (embeddings handed in)."""
    import torch

    parts = []
    for name, value in [*enumerate(args), *sorted(kwargs.items())]:
        if isinstance(value, torch.Tensor) or (isinstance(value, (list, tuple)) and
                                               any(isinstance(v, torch.Tensor) for v in value)):
            return None
        if isinstance(value, torch.device):
            value = str(value)
        parts.append((name, repr(value)))
    return tuple(parts)


class PromptCache:
    def __init__(self, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES):
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._entries: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0  # of the current generation (reset by `counts`)

    def install(self, pipe) -> None:
        """Wraps `pipe.encode_prompt` (its own bound method stays reachable as the wrapped original)."""
        original = pipe.encode_prompt

        def encode_prompt(*args, **kwargs):
            key = _key(args, kwargs)
            if key is None:
                return original(*args, **kwargs)
            with self._lock:
                found = self._entries.get(key)
                if found is not None:
                    self._entries.move_to_end(key)
            if found is not None:
                self.hits += 1  # a fresh copy each time: the pipeline may change what it is given in place
                return _tensors(found[0], lambda held: held.tensor.to(held.device, copy=True))
            self.misses += 1
            result = original(*args, **kwargs)
            self._keep(key, _tensors(result, lambda t: _Held(t.detach().to("cpu", copy=True), t.device)))
            return result

        pipe.encode_prompt = encode_prompt

    def _keep(self, key, value) -> None:
        size = _nbytes(value)
        if size > self.max_bytes:
            return
        with self._lock:
            self._entries[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes or len(self._entries) > self.max_entries:
                _, (_, freed) = self._entries.popitem(last=False)
                self._bytes -= freed

    def counts(self) -> tuple[int, int]:
        """(hits, misses) since the last call: one generation's."""
        hits, misses, self.hits, self.misses = self.hits, self.misses, 0, 0
        return hits, misses

    def record(self, hits: int, misses: int) -> Resolved | None:
        if not hits and not misses:
            return None
        if not misses:
            applied = f"cached ({hits} of {hits} encodings reused)"
        elif not hits:
            applied = f"encoded ({misses} of {misses}; kept for a repeat)"
        else:
            applied = f"{hits} of {hits + misses} encodings reused"
        return Resolved(CONTROL, "", applied, Source.AUTO,
                        reason="the text encoders' results for the same prompt and settings are kept on the host "
                               "while the model is loaded; a repeat reuses them (the same embeddings)")


def for_model(pipe, max_bytes: int) -> tuple[PromptCache | None, Resolved]:
    """A loaded model's cache (None when the service turned it off) and the model record's line about it."""
    cache = None
    if max_bytes > 0:
        cache = PromptCache(max_bytes=max_bytes)
        cache.install(pipe)
    return cache, Resolved("prompt_cache", "", f"repeats reused, up to {max_bytes // 2**20} MiB of host memory"
                           if cache else "off", Source.DEFAULT,
                           reason="a repeated prompt's text-encoder results are kept while the model is loaded "
                                  "(the service's --prompt-cache-mib)")
