"""LoRA adapters at generation time: loaded by id from the store, family-checked, weighted, pinned while loaded."""
from __future__ import annotations

from dataclasses import dataclass, field

from diffusion_kit.adapter_store import WEIGHTS, AdapterStore
from diffusion_kit.families import FamilySpec
from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.errors import InvalidArgument


@dataclass
class LoraState:
    """Adapters currently loaded into one pipeline."""

    loaded: set[str] = field(default_factory=set)
    active: bool = False


def check_adapters(store: AdapterStore | None, uses, family: FamilySpec) -> None:
    """Before queueing: every adapter exists and fits the family. Reads sidecars only."""
    if uses and store is None:
        raise InvalidArgument("this service has no adapter store configured (--adapter-store)", reason="NO_ADAPTER_STORE")
    for use in uses:
        info = store.get(use.adapter_id)
        if info.family != family.key:
            raise InvalidArgument(f"adapter {use.adapter_id!r} was trained for {info.family}, the loaded model is "
                                  f"{family.display}", reason="ADAPTER_FAMILY_MISMATCH")


def apply_adapters(pipe, store: AdapterStore | None, uses, state: LoraState, holder: str,
                   compiled: bool) -> list[Resolved]:
    """Runs on the GPU worker before the pipeline call."""
    records = []
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
        if compiled:
            records.append(Resolved("adapter_hotswap", "on", "off", Source.AUTO, Status.FELL_BACK,
                                    "the compiled blocks recompile when the set of adapters changes; weights "
                                    "changes alone reuse the compiled graph"))
    elif state.active:
        pipe.disable_lora()
        state.active = False
    return records


def release_adapters(store: AdapterStore | None, state: LoraState, holder: str) -> None:
    if store is None:
        return
    for adapter_id in state.loaded:
        store.unpin(adapter_id, holder)
    state.loaded.clear()
