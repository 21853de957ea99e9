"""The denoiser's repeated blocks compiled ahead of time: traced and compiled once, saved to disk, and loaded
by later processes in place of tracing them again.

A compiled load's second-process warm-up was mostly dynamo tracing the blocks again (the persistent inductor
cache spares only the code generation; docs/bench/compile_warmup_probe.jsonl). With `--aot-blocks`, a compiled
load looks for artifacts keyed on each block's structure (its modules' types and settings, its parameters'
names, shapes and dtypes), the software (torch, triton, diffusers, Python), the device and the compile settings.
Found, they are loaded and installed as the blocks' compiled call. Missing, the warm-up's calls (one image,
then two) run eagerly and capture every distinct input each block sees; each is compiled with dynamo's
`aot_compile` (inductor, dynamic shapes, fullgraph) unless a graph of that structure already covers it; the
warm-up then runs again on the installed graphs, and any call they miss gets a graph of its own (guards can
tell calls apart that looked alike when captured); then the graphs are saved.

What keeps a loaded graph honest: every guard that can be written to disk is kept and checked on each call
(tensor dtypes, devices, dispatch keys and symbolic shapes, parameters included; grad mode and global state;
module types, constants and dictionary keys), and only identity guards, which name objects of the process that
traced them, are dropped. A call that no graph of its block covers runs the block eagerly, and is counted (the
generation's record says so). The blocks run under no_grad, not inference_mode: the graphs are traced on
ordinary tensors, whose dispatch keys inference tensors do not share.

Graphs that will not load, and blocks that cannot be compiled ahead of time, leave a marker with the error: every
later load of them uses the regular regional compile and says why (delete the folder to try again). Folders of
other software (another torch, triton, diffusers or Python: their key can never match again) are deleted by a
later load once no process has used them for a week (prune). Graphs that
could not be saved (a full disk) still run in the process that compiled them; the next load compiles them again.
An adapter changes the blocks' structure: the first one uninstalls the graphs and compiles the blocks the
regular way (inference_service.lora_runtime), as a compiled model's first adapter always recompiled.

Training uses the same mechanism (training_service.lora_recipe, `grad=True`): its warm-up is a forward with
gradients of one micro-batch per bucket, the graphs carry their backward, and they are traced and loaded in the
step's own context (autocast, the attention pin), whose state their guards check. A job's buckets and batch size
are its own, so training runs its warm-up on loaded graphs too (`verify_loaded`): a shape they do not cover gets
a graph compiled and saved beside them (an `extra-` subfolder, loaded with the folder from then on).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from diffusion_kit.resolved import Resolved, Source, Status

log = logging.getLogger("diffusion_kit.aot_blocks")

CONTROL = "compile_ahead_of_time"
FAILED = "failed.json"  # in a block's folder: it could not be compiled ahead of time, and why
META = "meta.json"  # in a block's folder, written last: its graphs are complete


def signature(block) -> str:
    """A block's structure: every submodule's name and type, and every parameter's and buffer's name, shape, dtype,
    device type and tensor type. Blocks of one structure share a folder of graphs; a setting the forward reads
    (a head count, a layer's flag) is a guard of the graph, so blocks that differ in one get graphs of their own."""
    parts = [(name, type(module).__module__ + "." + type(module).__qualname__) for name, module in block.named_modules()]
    for name, tensor in [*block.named_parameters(), *block.named_buffers()]:
        parts.append((name, tuple(tensor.shape), str(tensor.dtype), tensor.device.type, type(tensor).__qualname__))
    return json.dumps(parts)


def environment(device: str, settings: dict) -> dict:
    """The software, device and compile settings a graph was made under: any change compiles anew."""
    import diffusers
    import torch

    env = {"torch": torch.__version__, "torch_git": torch.version.git_version, "diffusers": diffusers.__version__,
           "python": sys.version.split()[0], **settings}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = ""
    if device.startswith("cuda"):
        # The index too: a graph allocates on, and guards, the device it was compiled on.
        index = torch.device(device).index or 0
        capability = "".join(map(str, torch.cuda.get_device_capability(index)))
        env["device"] = f"{torch.cuda.get_device_name(index)} sm_{capability} cuda:{index}"
    else:
        env["device"] = device
    return env


def key_of(block_signature: str, env: dict) -> str:
    return hashlib.sha256(json.dumps([block_signature, env], sort_keys=True).encode()).hexdigest()[:32]


SOFTWARE = ("torch", "torch_git", "triton", "diffusers", "python")  # the environment's fields no upgrade keeps
UNUSED_BEFORE_PRUNE_S = 7 * 24 * 3600
STAGING = ".staging-"  # a folder being written: renamed into place when whole


def stale(folder_env: dict | None, current: dict, idle_s: float) -> bool:
    """Whether a folder of graphs can be deleted: written under other software (its key names the software, so
    no process of this software will read it) and unused for UNUSED_BEFORE_PRUNE_S (a process of that other
    software may share the compile cache, as during a rolling upgrade). A folder whose software is unknown
    stays."""
    if not folder_env:
        return False
    return idle_s >= UNUSED_BEFORE_PRUNE_S and any(folder_env.get(k) != current.get(k) for k in SOFTWARE)


def prune(directory: Path, current: dict, now: float | None = None) -> list[str]:
    """Deletes the folders `stale` allows, and staging folders abandoned for UNUSED_BEFORE_PRUNE_S (a process
    that died while saving), at the top or inside a folder (an extra- subfolder's). Returns the names deleted
    (`folder/subfolder` for those inside)."""
    now = time.time() if now is None else now
    removed = []
    try:
        folders = [f for f in directory.iterdir() if f.is_dir()]
        folders += [sub for f in folders if STAGING not in f.name for sub in f.iterdir()
                    if sub.is_dir() and STAGING in sub.name]
    except OSError:
        return removed
    for folder in folders:
        marker = folder / META if (folder / META).exists() else folder / FAILED
        try:
            idle = now - (marker if marker.exists() else folder).stat().st_mtime
            if STAGING in folder.name:
                doomed = idle >= UNUSED_BEFORE_PRUNE_S
            else:
                doomed = marker.exists() and stale(json.loads(marker.read_text()).get("env"), current, idle)
        except (OSError, ValueError):
            continue
        if doomed:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.relative_to(directory).as_posix())
    if removed:
        log.info("ahead-of-time graphs of other software deleted", extra={"fields": {
            "event": "aot_blocks.pruned", "folder": str(directory), "removed": len(removed)}})
    return removed


def keep_serialisable_guards(entries) -> list[bool]:
    """Every guard but those that cannot be written to disk: identity guards (ids of this process's objects),
    guards on globals, and guards on a tensor subclass's instance or the tensors inside it. Dynamo writes a
    subclass instance by asking it for `empty_like`, which torchao's quantised weights (Float8Tensor,
    Int8Tensor) do not implement; those weights' names, shapes, dtypes and types key the graphs' folder
    (signature), and the quantisation scheme the environment."""
    from torch._dynamo.guards import CheckFunctionManager
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    unsupported = set(CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
    subclasses = {g.name for g in entries if g.has_value and is_traceable_wrapper_subclass(g.value)}

    def inside_subclass(name: str) -> bool:
        return any(name == s or name.startswith(s + ".") for s in subclasses)

    return [not g.is_global and g.guard_type not in unsupported and not set(g.derived_guard_types) & unsupported
            and not inside_subclass(g.name) for g in entries]


def plain_reprs(blocks: list) -> None:
    """Drops the `extra_repr` that torchao's quantize_ binds on each quantised layer (a bound functools.partial):
    dynamo writes the blocks' modules with the graphs and cannot write that. It changes only the layers' repr."""
    import functools

    for block in blocks:
        for module in block.modules():
            bound = module.__dict__.get("extra_repr")
            if isinstance(getattr(bound, "__func__", None), functools.partial):
                del module.__dict__["extra_repr"]


class _Dispatch:
    """A block's forward, installed on the block (its hooks still run around it): the first graph whose guards
    pass, else the class's own forward, eagerly (counted; while new graphs are verified, kept in `uncovered` to
    compile one for)."""

    def __init__(self, block, graphs: list, misses: list[int], uncovered: list | None = None):
        self.block, self.graphs, self.misses, self.uncovered = block, graphs, misses, uncovered

    def __call__(self, *args, **kwargs):
        for graph in self.graphs:
            if graph.guard_check(self.block, *args, **kwargs):
                return graph(self.block, *args, **kwargs)
        if self.uncovered is not None:
            self.uncovered.append((self.block, args, kwargs))
        self.misses[0] += 1
        return type(self.block).forward(self.block, *args, **kwargs)


@dataclass
class AotBlocks:
    """The graphs installed on one denoiser's blocks."""
    blocks: list
    graphs: int
    loaded: int  # graphs read from disk (the rest were compiled by this load)
    seconds: float
    fallback: Callable[[], None]  # the regular regional compile, for when the graphs no longer fit the blocks
    misses: list[int] = field(default_factory=lambda: [0])
    installed: bool = True
    unsaved: int = 0  # graphs compiled by this load that could not be written (the log says why)
    kind: str = "block"  # what the modules are, in the records

    def take_misses(self) -> int:
        count, self.misses[0] = self.misses[0], 0
        return count

    def uninstall(self) -> None:
        """Back to the regular regional compile (traced at the next call)."""
        if not self.installed:
            return
        self.discard()
        self.fallback()

    def discard(self) -> None:
        """The blocks run their own forward again, uncompiled."""
        _uninstall(self.blocks)
        self.installed = False

    def how(self) -> str:
        """Where the graphs came from and how long that took: "6 graph(s) loaded from disk in 1.0s"."""
        saved = "not saved (see the log)" if self.unsaved else "saved"
        how = (f"{self.loaded} graph(s) loaded from disk" if self.loaded == self.graphs else
               f"{self.graphs - self.loaded} graph(s) compiled and {saved}" +
               (f", {self.loaded} loaded" if self.loaded else ""))
        return f"{how} in {self.seconds:.1f}s"

    def record(self, where: str = "the generation's record") -> Resolved:
        return Resolved(CONTROL, "on", self.how(), Source.EXPLICIT,
                        reason=f"{len(self.blocks)} repeated blocks run graphs compiled ahead of time; guards are "
                               f"checked on every call, and a call no graph covers runs eagerly and is said in {where}")

    def miss_record(self, misses: int) -> Resolved:
        return Resolved(CONTROL, "on", f"{misses} {self.kind} call(s) ran eagerly", Source.AUTO, Status.FELL_BACK,
                        reason="no graph compiled ahead of time covered these calls' inputs (their guards failed); "
                               "they ran uncompiled")


class AotUnavailable(Exception):
    def __init__(self, why: str, remembered: bool = False):
        super().__init__(why)
        self.why = f"an earlier load could not compile these blocks ahead of time: {why}" if remembered else why


def fell_back(why: str) -> Resolved:
    return Resolved(CONTROL, "on", "off", Source.EXPLICIT, Status.FELL_BACK,
                    reason=f"{why}; the blocks use the regular regional compile (traced in this process)")


def install(denoiser, directory: Path, env: dict, capture: Callable[[], None], backend: str, options: dict,
            fallback: Callable[[], None], grad: bool = False, context: Callable[[], Any] | None = None,
            verify_loaded: bool = False) -> AotBlocks:
    """Loads or compiles every repeated block's graphs and installs them (install_modules)."""
    names = getattr(denoiser, "_repeated_blocks", None) or ()
    blocks = [m for m in denoiser.modules() if type(m).__name__ in names]
    if not blocks:
        raise AotUnavailable(f"{type(denoiser).__name__} names no repeated blocks")
    return install_modules(blocks, directory, env, capture, backend, options, fallback, grad=grad, context=context,
                           verify_loaded=verify_loaded)


def install_modules(blocks: list, directory: Path, env: dict, capture: Callable[[], None], backend: str,
                    options: dict, fallback: Callable[[], None], kind: str = "block", grad: bool = False,
                    context: Callable[[], Any] | None = None, verify_loaded: bool = False) -> AotBlocks:
    """Loads or compiles the graphs of `blocks` (modules; those of one structure share graphs) and installs them
    as their forward. `capture()` runs the warm-up's calls: under no_grad for inference, or with gradients for
    training (`grad`: the graphs are traced with gradients on and carry their backward, which autograd runs as
    the regular compile's would; a call with gradients off then runs eagerly). It is called only when some module
    has no graphs on disk: once eagerly, to capture every distinct input of every module, then on the new graphs,
    to compile more for any call they do not cover (VERIFY_ROUNDS at most), before they are saved. Raises
    AotUnavailable (with the reason) where a module cannot be compiled ahead of time; nothing is installed then.
    `kind` names the modules in the records ("block", "VAE decoder"). `context()` is the context the calls run
    in (training's autocast and attention pin): the graphs are traced in it, since its state is among their guards.
    `verify_loaded`: graphs loaded from disk are checked too, by one `capture()` on them, and a call they do not
    cover gets a graph of its own, saved beside them (a training job whose buckets or batch size differ from the
    job's that compiled them; without this its calls of those shapes would run eagerly for the whole job)."""
    t0 = time.perf_counter()
    plain_reprs(blocks)
    prune(directory, env)
    groups: dict[str, list] = {}
    for block in blocks:
        groups.setdefault(signature(block), []).append(block)
    folders = {sig: directory / key_of(sig, env) for sig in groups}
    for sig, folder in folders.items():
        if (folder / FAILED).exists():
            raise AotUnavailable(json.loads((folder / FAILED).read_text())["error"], remembered=True)
    graphs: dict[str, list] = {}
    loaded = 0
    for sig, folder in folders.items():
        found = _load(folder, env, context)
        if found is not None:
            graphs[sig] = found
            loaded += len(found)
    missing = {sig: groups[sig] for sig in groups if sig not in graphs}
    misses, unsaved = [0], 0
    if missing or verify_loaded:
        known = {sig: len(graphs.get(sig, ())) for sig in groups}  # graphs loaded, per structure
        try:
            if missing:
                inputs = _capture_inputs(missing, capture)  # detached: they keep no autograd graph alive
                for sig in missing:
                    graphs[sig] = []
                    for args, kwargs, members in inputs[sig]:
                        for member in members:
                            _cover(graphs[sig], member, args, kwargs, backend, options, grad, context)
            _verify(groups, graphs, misses, capture, backend, options, grad, context)
        except AotUnavailable as e:
            _uninstall(blocks)
            for sig in missing:  # a loaded folder's graphs still load; only these shapes failed
                _remember_failure(folders[sig], e.why, env)
            raise
        except BaseException:  # a graph failing on its verification call, a cancel: nothing stays installed
            _uninstall(blocks)
            raise
        for sig, count in known.items():
            new = graphs[sig][count:]
            if new:
                folder = folders[sig] if sig in missing else folders[sig] / f"{EXTRA}{uuid.uuid4().hex}"
                if not _save(new, folder, env, type(groups[sig][0]).__name__):
                    unsaved += len(new)
        misses[0] = 0
    _install(groups, graphs, misses, None)
    count = sum(len(g) for g in graphs.values())
    return AotBlocks(blocks, count, loaded, time.perf_counter() - t0, fallback, misses, unsaved=unsaved, kind=kind)


VERIFY_ROUNDS = 2  # warm-up runs on new graphs, each compiling graphs for the calls the last one missed
EXTRA = "extra-"  # a subfolder of graphs a later load compiled for calls the folder's graphs did not cover
# (named uniquely: two processes extending one folder at once each keep theirs)


def _verify(groups: dict[str, list], graphs: dict[str, list], misses: list[int], capture: Callable[[], None],
            backend: str, options: dict, grad: bool, context: Callable[[], Any] | None) -> None:
    """Runs the warm-up on the installed graphs, and compiles a graph for each call none of them covers (guards
    can tell calls apart that looked alike when captured), VERIFY_ROUNDS times at most."""
    blocks = [block for members in groups.values() for block in members]
    uncovered: list = []
    _install(groups, graphs, misses, uncovered)
    for _ in range(VERIFY_ROUNDS):
        uncovered.clear()
        capture()
        if not uncovered:
            return
        _uninstall(blocks)  # traced as it will be called: without the installed forward
        for block, args, kwargs in list(uncovered):
            _cover(graphs[signature(block)], block, _detached(args), _detached(kwargs), backend, options, grad,
                   context)
        _install(groups, graphs, misses, uncovered)




def _install(groups: dict[str, list], graphs: dict[str, list], misses: list[int], uncovered: list | None) -> None:
    for sig, members in groups.items():
        for block in members:
            block.forward = _Dispatch(block, graphs[sig], misses, uncovered)


def _uninstall(blocks: list) -> None:
    for block in blocks:
        block.__dict__.pop("forward", None)


def _cover(graphs: list, block, args, kwargs, backend: str, options: dict, grad: bool = False,
           context: Callable[[], Any] | None = None) -> None:
    """Compiles a graph for this call unless one of `graphs` covers it already (with gradients on, for training,
    where `grad`)."""
    import torch

    with torch.set_grad_enabled(grad), (context or contextlib.nullcontext)():
        if any(g.guard_check(block, *args, **kwargs) for g in graphs):
            return
        try:
            # enable_aot_compile: off by default in torch 2.11 (the GPU image's), on in later releases;
            # specialize_float: a float traced as a symbol asks for a restart aot_compile cannot make.
            with torch._dynamo.config.patch(enable_aot_compile=True, specialize_float=True):
                graph = torch.compile(type(block).forward, fullgraph=True, dynamic=True, backend=backend,
                                      options={**options, "guard_filter_fn": keep_serialisable_guards}
                                      ).aot_compile(((block, *args), kwargs))
        except Exception as e:  # noqa: BLE001 - said, remembered, and the regular compile is used instead
            raise AotUnavailable(f"{type(e).__name__}: {str(e)[:300]}") from e
    graph.disable_guard_check()  # checked by _Dispatch, once per call
    graphs.append(graph)


def _remember_failure(folder: Path, why: str, env: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FAILED).write_text(json.dumps({"error": why, "env": env}))


def _save(graphs: list, folder: Path, env: dict, block_name: str) -> bool:
    """Writes the graphs through a staging folder renamed into place, so a folder with META is whole."""
    staging = folder.with_name(f"{folder.name}{STAGING}{os.getpid()}")
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for i, graph in enumerate(graphs):
            graph.save_compiled_function(str(staging / f"{i}.bin"))
    except Exception as e:  # noqa: BLE001 - a full disk, say: the graphs run in this process, the next load tries again
        shutil.rmtree(staging, ignore_errors=True)
        log.warning("ahead-of-time graphs not saved", extra={"fields": {
            "event": "aot_blocks.unsaved", "folder": str(folder), "error": repr(e)}})
        return False
    (staging / META).write_text(json.dumps({"graphs": len(graphs), "block": block_name, "env": env,
                                            "created": time.time()}, indent=1))
    try:
        staging.rename(folder)
    except OSError:  # another process saved the same graphs first: theirs stay
        shutil.rmtree(staging, ignore_errors=True)
    return True


def _load(folder: Path, env: dict, context: Callable[[], Any] | None = None) -> list | None:
    """The folder's graphs, and those of its extra- subfolders; None when it has none yet. Graphs that will not
    load (each folder is written whole, under a key that names the software, so this is not a torn file or
    another torch) are remembered as a failure, and the regular compile is used from then on. Loaded in the calls'
    context: a tensor's guard takes the dispatch keys it expects from the context it is rebuilt in (autocast's
    among them)."""
    import torch
    from torch._inductor import config as inductor_config

    if not (folder / META).exists():
        return None
    try:
        extras = sorted(f for f in folder.iterdir() if f.name.startswith(EXTRA) and STAGING not in f.name
                        and (f / META).exists())
        graphs = []
        for part in [folder, *extras]:
            for i in range(json.loads((part / META).read_text())["graphs"]):
                # One compile thread: a graph's kernels are built from the cache here, in this process. Otherwise
                # the first kernel starts inductor's pool of compile workers, whose start-up takes a core for the
                # first steps and stalls the host's multi-threaded tensor ops (the inputs' noise) behind it.
                with (part / f"{i}.bin").open("rb") as f, (context or contextlib.nullcontext)(), \
                        inductor_config.patch(compile_threads=1):
                    graph = torch.compiler.load_compiled_function(f)
                graph.disable_guard_check()  # checked by _Dispatch, once per call
                graphs.append(graph)
    except Exception as e:  # noqa: BLE001 - said, remembered, and the regular compile is used instead
        error = f"its saved graphs would not load: {type(e).__name__}: {str(e)[:300]}"
        log.warning("ahead-of-time graphs not loaded", extra={"fields": {
            "event": "aot_blocks.unreadable", "folder": str(folder), "error": error}})
        (folder / FAILED).write_text(json.dumps({"error": error, "env": env}))
        raise AotUnavailable(error) from e
    try:
        os.utime(folder / META)  # last used: prune keeps it while any process of its software loads it
    except OSError:
        pass  # a read-only cache is still read
    return graphs


def _input_key(args, kwargs) -> tuple:
    """What a block call's guards can tell apart: each input's shape, dtype, device and layout, or its value."""
    import torch

    def one(value):
        if torch.is_tensor(value):
            return ("tensor", tuple(value.shape), str(value.dtype), value.device.type, value.is_contiguous(),
                    value.requires_grad)
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, tuple(one(v) for v in value))
        if isinstance(value, dict):
            return ("dict", tuple((k, one(v)) for k, v in sorted(value.items())))
        return ("value", repr(value)[:64])

    return one(args), one(kwargs)


def _detached(value):
    """The call's inputs without their autograd history (a training warm-up's would keep its whole graph alive),
    each tensor still asking for gradients where it did: that is one of the graph's guards."""
    import torch

    if torch.is_tensor(value):
        return value.detach().requires_grad_(value.requires_grad) if value.requires_grad else value
    if type(value) in (list, tuple):
        return type(value)(_detached(v) for v in value)
    if type(value) is dict:
        return {k: _detached(v) for k, v in value.items()}
    return value


def _capture_inputs(groups: dict[str, list], capture: Callable[[], None]) -> dict[str, list]:
    """Per structure, every distinct input the warm-up's calls give its blocks: [(args, kwargs, blocks that were
    called with inputs of that kind)]. Blocks of one structure may sit at different stages of the model (a
    refiner and the main stack) and take different inputs."""
    seen: dict[str, dict] = {sig: {} for sig in groups}

    def hook_for(sig):
        def hook(module, args, kwargs):
            key = _input_key(args, kwargs)
            if key not in seen[sig]:
                seen[sig][key] = (_detached(args), _detached(kwargs), [])
            entry = seen[sig][key]
            if not any(module is m for m in entry[2]):
                entry[2].append(module)
        return hook

    handles = [block.register_forward_pre_hook(hook_for(sig), with_kwargs=True)
               for sig, members in groups.items() for block in members]
    try:
        capture()
    finally:
        for h in handles:
            h.remove()
    for sig, calls in seen.items():
        if not calls:
            raise AotUnavailable(f"the warm-up never called {type(groups[sig][0]).__name__}")
    return {sig: list(calls.values()) for sig, calls in seen.items()}
