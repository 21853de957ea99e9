"""Long-lived objects out of the cyclic collector's reach (gc.freeze), once a process has imported its libraries.

The recipe, after each phase, and the model unload run a full collection to give a model's memory back, and
Python runs its own now and then. Each walked every object alive: after torch, diffusers and transformers, half a
million, nearly all modules, classes and functions that live as long as the process (0.4 s a collection on the
CPU, more as the process grows, holding the interpreter lock throughout). Frozen, they are skipped. The warm
interpreters (service_kit.fork_server), the trainer child and the inference service call it after their imports.
"""
from __future__ import annotations

import gc


def freeze_imported(pipelines: tuple[str, ...] = ()) -> None:
    """Imports the diffusers `pipelines` (diffusers imports a pipeline's modules, in diffusers and transformers,
    when it is first named), collects once, and freezes what is left: later collections walk only what was made
    since. Call it after the imports, never with a model loaded: what it freezes is never freed."""
    if pipelines:
        import diffusers

        for name in pipelines:
            getattr(diffusers, name)  # diffusers imports a pipeline's modules when it is first named
    gc.collect()
    gc.freeze()
