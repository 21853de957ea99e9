"""A repair of inductor's slice lowering, applied where the installed torch lacks it.

Compiled loads trace sizes size-obliviously (inference_service.backend_flags). torch 2.11's inductor then cannot
lower a slice that runs to the end of a dimension whose size is a sum of symbols: its lowering takes the open end
(`sys.maxsize`) for an index it cannot place against a size with no upper bound, and fails with
`KeyError: 'unbacked_bindings'`. FLUX.1's single-stream blocks make exactly that slice
(`hidden_states[:, text_seq_len:]` after joining text and image tokens), so every compiled FLUX load failed on
that torch as soon as a size became symbolic. Later torch releases read an open end as the dimension's size;
this does the same, in front of the installed lowering, and only where the installed lowering does not.
"""
from __future__ import annotations

import inspect
import logging
import sys

log = logging.getLogger("inference_service.inductor_fixes")

_applied = False


def open_slice_end_needs_fix() -> bool:
    """Whether the installed inductor's slice lowering defaults its end to something other than `sys.maxsize`,
    the mark of a lowering without the open-end case."""
    from torch._inductor import lowering

    return inspect.signature(lowering.slice_).parameters["end"].default != sys.maxsize


def fix_open_slice_ends(force: bool = False) -> bool:
    """Routes every slice whose end is open (`sys.maxsize` or beyond) to the installed lowering with the
    dimension's size as its end, which means the same and needs no bound on the size. Once per process; True
    when the repair is in place."""
    global _applied
    if _applied:
        return True
    if not force and not open_slice_end_needs_fix():
        return False
    import torch
    from torch._inductor import lowering

    originals = {op: fn for op, fn in lowering.lowerings.items()
                 if isinstance(op, torch._ops.OpOverload) and op.overloadpacket is torch.ops.aten.slice}

    def make(original):
        def slice_with_closed_end(x, dim=0, start=0, end=sys.maxsize, step=1, clamp=True):
            if isinstance(end, int) and end >= sys.maxsize:
                end = x.get_size()[lowering._validate_dim(x, dim, 0)]
            return original(x, dim, start, end, step, clamp)
        return slice_with_closed_end

    for op, original in originals.items():
        lowering.lowerings[op] = make(original)
    _applied = True
    log.info("inductor's slice lowering reads an open end as the dimension's size",
             extra={"fields": {"event": "inductor_fixes.open_slice_end", "torch": torch.__version__}})
    return True
