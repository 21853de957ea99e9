"""CUDA graphs over the denoiser's calls: whether a model's denoiser replays captured graphs, and doing it.

A compiled denoiser's step on the H200 launches 800-1,600 kernels, and where its kernels are short (fp8) the
host launching them is the bound: the GPU sat idle for 28-37% of a compiled fp8 step (docs/bench/
inference.md). One CUDA graph launch replaces them. Inductor's own CUDA graphs (cudagraph trees) cannot be used:
the repeated blocks share one compiled function, and each re-entry of it within a step starts a new tree
generation that overwrites the previous block's output (measured: the run failed with "accessing tensor output
of CUDAGraphs that has been overwritten by a subsequent run"). So the whole denoiser call is captured here, with
its compiled blocks inside it.

How a call runs (`StepGraphs`), keyed on everything a graph fixes (each tensor's shape, stride, dtype and device,
every other argument's value, the grad mode and the device):
- the first call with a new key runs as usual, on copies of its inputs kept for the key (so any trace the
  compiler needs for them happens outside a capture);
- the second captures the call on those copies, then replays it;
- later ones copy their inputs into the copies, replay, and return clones of the outputs (a true-CFG step's two
  calls each keep their own).
At most SLOTS graphs are kept, least recently used first out; all share one memory pool, so they need one call's
activations, not one each. A call under a dispatch mode (a FLOP counter), with grad enabled, or with an argument
a graph cannot fix runs as usual. A capture that fails turns graphs off for the model, said in the stream and the
model's record; one out of memory frees the graphs and lets the caller's backoff split the batch.

Weights are read where they are when captured: adapters hotswapped in place and LoRA scaling tensors filled in
place (lora_runtime) stay valid; the first adapter's new layers are not, so the graphs are dropped first
(`forget`). Weights that move between host and device (offload tiers) never get graphs.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from diffusion_kit.resolved import Resolved, Source, Status

CONTROL = "cuda_graphs"
SLOTS = 2  # one key per denoiser call of a step: a true-CFG family (Qwen-Image) has two, with different prompts

log = logging.getLogger("inference_service.step_graphs")


def plan(*, enabled: bool, device_kind: str, compiled: bool, memory_mode: str) -> Resolved:
    """Whether the denoiser's calls replay CUDA graphs. `enabled`: the operator's --cuda-graphs (default on)."""
    if not compiled:
        return Resolved(CONTROL, "", "off", Source.AUTO,
                        reason="the denoiser is not compiled: speed mode OFF runs every call as it is")
    if not enabled:
        return Resolved(CONTROL, "on", "off", Source.EXPLICIT, reason="the service runs with --no-cuda-graphs")
    if device_kind != "cuda":
        return Resolved(CONTROL, "on", "off", Source.AUTO, Status.UNSUPPORTED, "CUDA graphs need a CUDA device")
    if memory_mode != "resident":
        return Resolved(CONTROL, "on", "off", Source.AUTO, Status.UNSUPPORTED,
                        f"memory mode {memory_mode} moves weights between host and device, and a graph reads them "
                        "where they were when it was captured")
    return Resolved(CONTROL, "on", "on", Source.AUTO,
                    reason=f"each denoiser call's kernels replay as one graph from the second call of its shape "
                           f"on; up to {SLOTS} graphs kept, sharing one memory pool")


def signature(leaves: list, device_type: str = "cuda") -> tuple | None:
    """What a graph captured for these call arguments (flattened) fixes, or None when one cannot be captured: a
    tensor off the graph's device type, a tensor subclass, a tensor that needs grad, or another object."""
    import torch

    key = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            if leaf.device.type != device_type or type(leaf) is not torch.Tensor or leaf.requires_grad:
                return None
            key.append(("t", tuple(leaf.shape), leaf.stride(), leaf.dtype, leaf.device))
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            key.append((type(leaf).__name__, leaf))
        else:
            return None
    return tuple(key)


@dataclass
class Counts:
    """Denoiser calls since the last take: replayed from a graph, captured, and run as usual."""
    replayed: int = 0
    captured: int = 0
    regular: int = 0


class _Graph:
    def __init__(self, inputs: list):
        self.inputs = inputs  # the copies the graph reads: one per tensor argument, in flattened order
        self.graph = None
        self.outputs: list = []
        self.out_spec = None


class StepGraphs:
    """Installed as the denoiser's forward (an instance attribute over its class's); `uninstall` restores it."""

    def __init__(self, module):
        self.module = module
        self.forward = module.forward
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.pool = None
        self.counts = Counts()
        self.failed: str | None = None  # why graphs are off for this model after a capture failed

    def install(self) -> None:
        self.module.forward = self

    def uninstall(self) -> None:
        self.forget()
        self.module.__dict__.pop("forward", None)

    def forget(self) -> None:
        """Drops every graph (their weights are about to change shape or place) and the pool they shared."""
        self.graphs.clear()
        self.pool = None

    def take(self) -> Counts:
        counts, self.counts = self.counts, Counts()
        return counts

    def __call__(self, *args, **kwargs):
        import torch
        from torch.utils._pytree import tree_flatten

        if self.failed is not None or torch.is_grad_enabled() or torch._C._len_torch_dispatch_stack():
            return self._regular(args, kwargs)
        leaves, spec = tree_flatten((args, kwargs))
        key = signature(leaves)
        if key is None:
            return self._regular(args, kwargs)
        key = (key, spec, torch.is_inference_mode_enabled(), torch.cuda.current_device())
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        entry = self.graphs.get(key)
        if entry is None:  # first sight: run on kept copies, so the capture later sees what this call traced
            entry = self.graphs[key] = _Graph([t.clone() for t in tensors])
            self._evict()
            self.counts.regular += 1
            copied_args, copied_kwargs = self._on(entry, leaves, spec)
            return self._guarded(lambda: self.forward(*copied_args, **copied_kwargs))
        self.graphs.move_to_end(key)
        for copy, t in zip(entry.inputs, tensors):
            copy.copy_(t)
        if entry.graph is None:
            if not self._capture(entry, leaves, spec):
                return self._regular(args, kwargs)
            self.counts.captured += 1
        else:
            self.counts.replayed += 1
        entry.graph.replay()
        return _outputs(entry)

    def _regular(self, args, kwargs):
        self.counts.regular += 1
        return self._guarded(lambda: self.forward(*args, **kwargs))

    def _guarded(self, call):
        import torch

        try:
            return call()
        except torch.OutOfMemoryError:
            self.forget()  # the graphs' pool goes first: the caller's backoff may then fit a smaller batch
            raise

    @staticmethod
    def _on(entry: _Graph, leaves: list, spec):
        """The call's arguments with each tensor replaced by the entry's copy of it."""
        import torch
        from torch.utils._pytree import tree_unflatten

        copies = iter(entry.inputs)
        return tree_unflatten([next(copies) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)

    def _capture(self, entry: _Graph, leaves: list, spec) -> bool:
        import torch
        from torch.utils._pytree import tree_flatten

        args, kwargs = self._on(entry, leaves, spec)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        try:
            # thread_local: other threads' CUDA calls (a lease's memory probe) neither fail nor spoil the capture
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                out = self.forward(*args, **kwargs)
            outputs, out_spec = tree_flatten(out)
            if not all(o is None or isinstance(o, (torch.Tensor, bool, int, float, str)) for o in outputs):
                raise TypeError(f"the denoiser returned {', '.join(sorted({type(o).__name__ for o in outputs}))}")
        except torch.OutOfMemoryError:
            _release_rng_from_capture()
            self.forget()
            raise
        except Exception as e:  # noqa: BLE001 - any capture failure turns graphs off, said in the record
            _release_rng_from_capture()
            self.failed = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            self.forget()
            log.warning("CUDA graph capture failed; the denoiser runs without graphs", extra={"fields": {
                "event": "cuda_graphs.fell_back", "error": self.failed}})
            return False
        entry.graph, entry.outputs, entry.out_spec = graph, outputs, out_spec
        return True

    def _evict(self) -> None:
        while len(self.graphs) > SLOTS:
            self.graphs.popitem(last=False)


def _release_rng_from_capture() -> None:
    """A capture that failed leaves the device's default random generator marked as capturing (torch ends its
    capture only when the graph's own end succeeds), and every later use of it fails ("Offset increment outside
    graph capture", measured: it failed the next compile of a model on that device). The generator gets a fresh
    state with the same seed and offset."""
    import torch

    generator = torch.cuda.default_generators[torch.cuda.current_device()]
    fresh = torch.Generator(device=generator.device)
    try:
        fresh.set_state(generator.get_state())
    except RuntimeError:  # the state cannot be read back: a fresh seed is still better than a generator that fails
        fresh.seed()
    generator.graphsafe_set_state(fresh.graphsafe_get_state())


def _outputs(entry: _Graph):
    import torch
    from torch.utils._pytree import tree_unflatten

    return tree_unflatten([o.clone() if isinstance(o, torch.Tensor) else o for o in entry.outputs], entry.out_spec)


def record(counts: Counts, failed: str | None) -> Resolved | None:
    """One generation's use of the graphs, for its resolved settings; None when it made no denoiser call."""
    calls = counts.replayed + counts.captured + counts.regular
    if failed is not None:
        return Resolved(CONTROL, "on", "off", Source.AUTO, Status.FELL_BACK,
                        f"a capture failed ({failed}); the denoiser runs without graphs")
    if not calls:
        return None
    return Resolved(CONTROL, "on", f"{counts.replayed + counts.captured} of {calls} denoiser calls from a graph",
                    Source.AUTO, reason=f"{counts.captured} captured in this generation; a call shape's first call "
                                        "runs as usual")
