"""The persistent torch.compile cache both services share, so a restarted process compiles warm."""
from __future__ import annotations

import os
from pathlib import Path


def configure_compile_cache(directory: Path) -> None:
    """Inductor's FX-graph and autograd caches on disk; set before torch is imported anywhere.

    Environment variables, so child processes (the trainer) inherit them."""
    directory.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(directory))
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
