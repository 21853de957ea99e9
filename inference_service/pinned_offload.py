"""The low_vram tier's placement: whole models moved onto the device when called, from host copies that are
page-locked in place.

Generating never changes a weight, so a model's host copy stays valid while the model is on the device:
moving it off is dropping the device copy, with nothing copied back, and moving it on is one asynchronous
copy from page-locked memory. A tensor that did change on the device (an adapter loaded while its model was
there, a cast) is copied back when its model moves off. Which models stay on the device is
model_residency's rule.

The pipeline's own call is unchanged: each model gets an accelerate hook whose pre_forward moves it on
(diffusers' `apply_forward_hook` calls it for `vae.decode` too, and the pipeline's `_execution_device` reads
the hook's `execution_device`). The pipeline's end-of-call `maybe_free_model_hooks` leaves these hooks alone,
so models stay where they are between generations.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from itertools import chain

from diffusion_kit.resolved import Resolved, Source, Status
from inference_service.model_residency import evictions, weights_budget

GiB = 2**30
# Page-locked memory cannot be swapped out or reclaimed; past this share of the host's memory, the weights
# stay pageable (slower moves) rather than starve the rest of the host.
MAX_PINNED_SHARE = 0.5


def pin_refusal(weight_bytes: int, host_bytes: int) -> str | None:
    """Why the weights should not be page-locked on this host, or None when they may be."""
    if weight_bytes > host_bytes * MAX_PINNED_SHARE:
        return (f"{weight_bytes / GiB:.1f} GiB of weights is over {MAX_PINNED_SHARE:.0%} of this host's "
                f"{host_bytes / GiB:.1f} GiB of memory")
    return None


def host_memory_bytes() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def unswappable(model) -> str | None:
    """Why this model's tensors cannot be swapped between host and device copies (a quantised tensor type
    whose storage is not a plain tensor), or None when they can."""
    import torch

    for name, t in chain(model.named_parameters(), model.named_buffers()):
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or type(t.data) is not torch.Tensor:
            return f"{name} is a {type(t).__name__}"
    return None


@dataclass
class _Copy:
    """One tensor of a model: its host copy, and the device copy this offload installed (with the tensor's
    version then), so that an unchanged device copy can simply be dropped."""

    tensor: object  # the Parameter or buffer object the model holds
    host: object
    device_ptr: int = 0
    version: int = -1


@dataclass
class Moves:
    """Models moved onto the device since the last `take`."""

    names: list[str] = field(default_factory=list)
    bytes: int = 0
    seconds: float = 0.0
    copied_back: int = 0  # bytes that had changed on the device and were copied back on moving off


class _OnloadHook:
    """accelerate's hook protocol (duck-typed: add_hook_to_module needs only these methods)."""

    no_grad = False

    def __init__(self, offload: "PinnedOffload", name: str):
        self.offload, self.name = offload, name
        self.execution_device = offload.device

    def init_hook(self, module):
        return module

    def pre_forward(self, module, *args, **kwargs):
        from accelerate.utils import send_to_device

        self.offload.bring(self.name)
        return send_to_device(args, self.execution_device), send_to_device(kwargs, self.execution_device)

    def post_forward(self, module, output):
        return output

    def detach_hook(self, module):
        return module


class PinnedOffload:
    """Moves a pipeline's models between host and device, whole, within a budget of device bytes."""

    def __init__(self, models: dict, device: str, budget_bytes: int | None = None, pin: bool = True,
                 host_bytes: int | None = None):
        """`budget_bytes`: device bytes the models' weights may take at once; by default
        model_residency.weights_budget of the largest model. `pin`: page-lock the host copies (a CUDA device),
        unless they would take too much of the host's memory (`host_bytes`, this host's by default)."""
        import torch

        self.device = torch.device(device)
        self._models = dict(models)
        self._copies: dict[str, dict[int, _Copy]] = {}
        self._bytes: dict[str, int] = {}
        self._resident: list[str] = []  # least recently used first
        self._lock = threading.RLock()
        self._moves = Moves()
        self._registered: list[int] = []  # host pointers page-locked in place (unregistered on close)
        self._retired: list = []  # page-locked host copies replaced after a change, kept until close
        self.pinned_bytes = self.pageable_bytes = 0
        for name, model in self._models.items():
            self._copies[name] = {}
            for t in self._tensors(model):
                host = t.data if t.device.type == "cpu" else t.data.to("cpu")
                with torch.inference_mode(False), torch.no_grad():
                    t.data = host
                self._copies[name][id(t)] = _Copy(t, host)
            self._bytes[name] = self._size(name)
        self.unpinned_why = None if pin else "no accelerator: the device copies are made in host memory"
        if pin:
            self.unpinned_why = pin_refusal(sum(self._bytes.values()), host_bytes or host_memory_bytes())
        for name in self._models:
            if self.unpinned_why is None:
                self._pin(name)
            else:
                self.pageable_bytes += self._bytes[name]
        self.budget_bytes = budget_bytes if budget_bytes is not None else weights_budget(max(self._bytes.values()))

    # ---- wiring -------------------------------------------------------------------------

    def attach(self) -> None:
        """Hooks every model so that calling it (or `vae.decode`) moves it onto the device first."""
        from accelerate.hooks import add_hook_to_module

        for name, model in self._models.items():
            add_hook_to_module(model, _OnloadHook(self, name))

    def record(self) -> Resolved:
        total = self.pinned_bytes + self.pageable_bytes
        status = Status.APPLIED if not self.pageable_bytes else Status.FELL_BACK
        applied = "pinned" if not self.pageable_bytes else "pageable" if not self.pinned_bytes else "partly pinned"
        why = (f"whole models move onto the device when called and stay until one that does not fit beside them "
               f"within {self.budget_bytes / GiB:.1f} GiB is called; {self.pinned_bytes / GiB:.1f} of "
               f"{total / GiB:.1f} GiB of host weights page-locked in place")
        if self.unpinned_why:
            why += f"; not page-locked: {self.unpinned_why}, so moves copy from pageable memory (slower)"
        elif self.pageable_bytes:
            why += "; the rest could not be page-locked and copies from it are slower"
        return Resolved("model_offload", "pinned", applied, Source.AUTO, status, why)

    # ---- moving -------------------------------------------------------------------------

    def model_bytes(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bytes)

    def resident(self) -> list[str]:
        """The models on the device, least recently used first."""
        with self._lock:
            return list(self._resident)

    def bring(self, name: str) -> None:
        """Moves `name` onto the device, moving off what does not fit beside it."""
        import torch

        with self._lock:
            if name in self._resident:
                self._resident.remove(name)
                self._resident.append(name)
                return
            t0 = time.perf_counter()
            out = evictions([(n, self._bytes[n]) for n in self._resident], self._bytes[name], self.budget_bytes)
            for victim in out:
                self._move_off(victim)
            if out and self.device.type == "cuda":
                torch.cuda.empty_cache()  # the next model's tensors differ in size from the freed ones
            self._move_on(name)
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()  # its weights are needed next anyway
            self._resident.append(name)
            self._moves.names.append(name)
            self._moves.bytes += self._bytes[name]
            self._moves.seconds += time.perf_counter() - t0

    def take(self) -> Moves:
        """The moves since the last call."""
        with self._lock:
            moves, self._moves = self._moves, Moves()
            return moves

    def _move_on(self, name: str) -> None:
        import torch

        copies = self._copies[name]
        with torch.inference_mode(False), torch.no_grad():
            for t in self._tensors(self._models[name]):
                copy = copies.get(id(t))
                if copy is None or copy.tensor is not t:  # new since the last move (an adapter's weights)
                    copy = copies[id(t)] = _Copy(t, t.data if t.device.type == "cpu" else t.data.to("cpu"))
                on_device = copy.host.to(self.device, non_blocking=True, copy=True)
                t.data = on_device
                copy.device_ptr, copy.version = on_device.data_ptr(), t._version
        self._bytes[name] = self._size(name)

    def _move_off(self, name: str) -> None:
        import torch

        kept: dict[int, _Copy] = {}
        copies = self._copies[name]
        with torch.inference_mode(False), torch.no_grad():
            for t in self._tensors(self._models[name]):
                copy = copies.get(id(t))
                unchanged = (copy is not None and copy.tensor is t and t.data_ptr() == copy.device_ptr
                             and t._version == copy.version)
                if not unchanged:
                    copy = self._copy_back(t, copy)
                t.data = copy.host
                copy.device_ptr, copy.version = 0, -1
                kept[id(t)] = copy
        self._copies[name] = kept  # tensors the model no longer holds (a deleted adapter) are let go
        self._resident.remove(name)
        self._bytes[name] = self._size(name)

    def _copy_back(self, t, copy: _Copy | None) -> _Copy:
        """A tensor that changed on the device (or is new there): its values become the host copy. Into the
        old host copy where the shape and type still match (it may be page-locked); else a new host copy, the
        old one kept until close if page-locked (freeing registered pages is not allowed)."""
        self._moves.copied_back += t.numel() * t.element_size()
        if copy is not None and copy.tensor is t and copy.host.shape == t.shape and copy.host.dtype == t.dtype:
            copy.host.copy_(t.data)
            return copy
        if copy is not None and copy.host.untyped_storage().data_ptr() in self._registered:
            self._retired.append(copy.host)
        return _Copy(t, t.data.to("cpu", copy=True))

    # ---- host memory --------------------------------------------------------------------

    def _pin(self, name: str) -> None:
        """Page-locks the model's host copies where they are (no second copy; exact sizes, where pinned
        allocations would round up to powers of two)."""
        import torch

        cudart = torch.cuda.cudart()
        for storage_ptr, size in self._storages(name):
            if size and cudart.cudaHostRegister(storage_ptr, size, 0) == 0:
                self._registered.append(storage_ptr)
                self.pinned_bytes += size
            else:
                self.pageable_bytes += size

    def close(self) -> None:
        """Releases the page-locked host memory; call before the pipeline is dropped."""
        import torch

        with self._lock:
            if not self._registered:
                return
            torch.cuda.synchronize(self.device)  # no copy from these pages is still in flight
            cudart = torch.cuda.cudart()
            for ptr in self._registered:
                cudart.cudaHostUnregister(ptr)
            self._registered.clear()
            self._retired.clear()

    # ---- helpers ------------------------------------------------------------------------

    @staticmethod
    def _tensors(model):
        seen = set()
        for t in chain(model.parameters(), model.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                yield t

    def _storages(self, name: str):
        seen = {}
        for copy in self._copies[name].values():
            storage = copy.host.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return seen.items()

    def _size(self, name: str) -> int:
        return sum(size for _, size in self._storages(name))


def _nbytes(t) -> int:
    return t.untyped_storage().nbytes()


def moves_record(moves: Moves) -> Resolved | None:
    """One generation's moves, for its resolved settings; None when every model it called was already on the
    device."""
    if not moves.names:
        return None
    why = "low_vram: these models were not on the device and were moved onto it, each once"
    if moves.copied_back:
        why += f"; {moves.copied_back / 2**20:.0f} MiB had changed on the device and were copied back first"
    return Resolved("model_moves", "", f"{', '.join(moves.names)}: {moves.bytes / GiB:.2f} GiB in "
                                       f"{moves.seconds:.2f}s", Source.AUTO, reason=why)
