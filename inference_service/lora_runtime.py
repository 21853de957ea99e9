"""LoRA adapters at generation time: loaded by id from the store, family-checked, weighted, pinned while loaded.

Two strategies, chosen by whether the denoiser is compiled:
- eager: each adapter is its own peft adapter; any set of adapters and weights.
- compiled: one hotswap slot, prepared before compile (`enable_lora_hotswap`). The first adapter
  recompiles the blocks once; later adapters are hotswapped into the slot and weights are written
  into the slot's scaling tensors in place, so neither recompiles. (Measured on the CPU with
  aot_eager: setting weights through `set_adapters` recompiled on every new weight and hit
  dynamo's recompile limit, which fails a fullgraph compile.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from diffusion_kit.adapter_store import WEIGHTS, AdapterStore
from diffusion_kit.families import FamilySpec
from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.errors import FailedPrecondition, InvalidArgument

SLOT = "hotswap"


@dataclass
class LoraState:
    """Adapters currently loaded into one pipeline."""

    loaded: set[str] = field(default_factory=set)
    active: bool = False
    slot_adapter: str | None = None  # compiled pipelines: the adapter in the hotswap slot


def check_adapters(store: AdapterStore | None, uses, family: FamilySpec, compiled: bool = False,
                   max_rank: int = 64) -> None:
    """Before queueing: every adapter exists, fits the family, and fits the compiled strategy."""
    if uses and store is None:
        raise InvalidArgument("this service has no adapter store configured (--adapter-store)", reason="NO_ADAPTER_STORE")
    if compiled and len(uses) > 1:
        raise FailedPrecondition("a compiled model takes one adapter per generation (hotswapped without "
                                 "recompiling); load with SPEED_MODE_OFF to combine several", reason="ONE_ADAPTER_WHEN_COMPILED")
    for use in uses:
        info = store.get(use.adapter_id)
        if info.family != family.key:
            raise InvalidArgument(f"adapter {use.adapter_id!r} was trained for {info.family}, the loaded model is "
                                  f"{family.display}", reason="ADAPTER_FAMILY_MISMATCH")
        if compiled and info.rank > max_rank:
            raise FailedPrecondition(f"adapter {use.adapter_id!r} has rank {info.rank}; the compiled model's hotswap "
                                     f"slot holds rank <= {max_rank} (--lora-max-rank)", reason="ADAPTER_RANK_TOO_HIGH")


def apply_adapters(pipe, store: AdapterStore | None, uses, state: LoraState, holder: str,
                   compiled: bool, on_first_adapter: Callable[[], str] | None = None) -> list[Resolved]:
    """Runs on the GPU worker before the pipeline call. `on_first_adapter`: called before a model's first adapter
    changes its blocks (what was fused, captured or compiled ahead of time for them gives way); it returns what
    gave way, for the record, or ""."""
    if compiled:
        return _apply_hotswap(pipe, store, uses, state, holder, on_first_adapter)
    records = []
    if uses and not state.loaded and on_first_adapter is not None:
        on_first_adapter()  # what gives way (fused projections) is said in the model's record
    for use in uses:
        if use.adapter_id not in state.loaded:
            pipe.load_lora_weights(str(store.path(use.adapter_id)), weight_name=WEIGHTS, adapter_name=use.adapter_id)
            state.loaded.add(use.adapter_id)
            store.pin(use.adapter_id, holder)
        records.append(Resolved(f"adapter:{use.adapter_id}", f"{use.weight:g}", f"{use.weight:g}", Source.EXPLICIT))
    if uses:
        pipe.set_adapters([u.adapter_id for u in uses], adapter_weights=[u.weight for u in uses])
        if not state.active:
            pipe.enable_lora()
        state.active = True
    elif state.active:
        pipe.disable_lora()
        state.active = False
    return records


def _apply_hotswap(pipe, store: AdapterStore, uses, state: LoraState, holder: str,
                   on_first_adapter: Callable[[], str] | None) -> list[Resolved]:
    if not uses:
        if state.slot_adapter is not None:
            _set_slot_weight(pipe, 0.0)  # weight 0 is the base image exactly, with no graph change
        return []
    (use,) = uses
    records = []
    path = str(store.path(use.adapter_id))
    if state.slot_adapter is None:
        gave_way = on_first_adapter() if on_first_adapter is not None else ""
        pipe.load_lora_weights(path, weight_name=WEIGHTS, adapter_name=SLOT)
        records.append(Resolved("adapter_hotswap", "on", "on", Source.AUTO, Status.APPLIED,
                                "first adapter on this compiled model: the blocks recompile once" +
                                (f" ({gave_way})" if gave_way else "")))
    elif state.slot_adapter != use.adapter_id:
        pipe.load_lora_weights(path, weight_name=WEIGHTS, adapter_name=SLOT, hotswap=True)
        store.unpin(state.slot_adapter, holder)
        state.loaded.discard(state.slot_adapter)
        records.append(Resolved("adapter_hotswap", "on", "on", Source.AUTO, Status.APPLIED,
                                f"hotswapped {state.slot_adapter} for {use.adapter_id} without recompiling"))
    if state.slot_adapter != use.adapter_id:
        store.pin(use.adapter_id, holder)
        state.loaded.add(use.adapter_id)
        state.slot_adapter = use.adapter_id
    _set_slot_weight(pipe, use.weight)
    records.append(Resolved(f"adapter:{use.adapter_id}", f"{use.weight:g}", f"{use.weight:g}", Source.EXPLICIT))
    return records


def _set_slot_weight(pipe, weight: float) -> None:
    """Writes weight * alpha / r into each LoRA layer's scaling tensor in place (no recompile)."""
    import torch
    from peft.tuners.lora import LoraLayer

    for name in ("transformer", "unet"):
        denoiser = getattr(pipe, name, None)
        if denoiser is None:
            continue
        for module in denoiser.modules():
            if isinstance(module, LoraLayer) and SLOT in module.scaling:
                value = weight * module.lora_alpha[SLOT] / module.r[SLOT]
                scaling = module.scaling[SLOT]
                if torch.is_tensor(scaling):
                    scaling.fill_(value)
                else:
                    module.scaling[SLOT] = value


def release_adapters(store: AdapterStore | None, state: LoraState, holder: str) -> None:
    if store is None:
        return
    for adapter_id in state.loaded:
        store.unpin(adapter_id, holder)
    state.loaded.clear()
    state.slot_adapter = None
