"""Which of a job's steps run under torch.profiler, and what is kept of them: where a service job's step time goes.

An operator's switch, the service's `--trace-steps FIRST:COUNT`: in every job, steps FIRST to FIRST + COUNT - 1
(numbered from 1, as the stream numbers them) run under the profiler, and the job folder's `trace/` gets
`summary.json` (each step's wall milliseconds and, on a GPU, its own kernel and idle milliseconds, and how much of
the idle came before its first kernel and after its last, so steps of one shape that run at two speeds say whether
the slow ones ran longer kernels or left the GPU waiting on the host, and where in the step; which host operators
ran while the device was idle, and how much of the idle no operator covered; and per step on average: the share of
it CUDA kernels ran, kernel, GEMM and attention milliseconds, which fused SDPA kernels ran, the host calls that
launch, copy or wait, and the host's milliseconds in all and in guard checks, compiled graphs' wrappers and
launches), `ops.txt` (the busiest operators by host and by device time) and `trace.json.gz` (the Chrome trace).
Traced steps run slower than the others (the profiler's own host work), so the job's record says which steps were
traced.

The summary is what benchmarks/step_profile computes of its bare loops, so a job's step and a bare loop's compare.
"""
from __future__ import annotations

import bisect
import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

HOST_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaEventSynchronize",
              "cudaLaunchKernel", "aten::item", "aten::_local_scalar_dense", "aten::to", "aten::copy_")
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm")
ATTENTION_KERNELS = {"flash": "flash_attention", "efficient": "efficient_attention", "cudnn": "cudnn_attention"}
MAX_TRACED = 20  # steps one window may trace: the profiler holds every operator and kernel of each in memory
STEP_MARK = "## training step "  # the profiler range each traced step runs in, with its number
PHASE_MARK = "## loop phase "  # the profiler range of one part of a traced step (StepTracer.phase), with its name
# the parts of a step the recipe marks: making its inputs, the forward pass and loss, the backward pass, the
# gradient clip and optimizer step, and reading the loss back and reporting the step
LOOP_PHASES = ("inputs", "forward", "backward", "optimizer", "report")


def parse_window(text: str) -> tuple[int, int]:
    """`FIRST:COUNT` as (first step, steps), for the service's flag; ValueError says what is wrong."""
    parts = text.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--trace-steps is FIRST:COUNT (two whole numbers, e.g. 6:4), got {text!r}")
    first, count = int(parts[0]), int(parts[1])
    if first < 1 or not 1 <= count <= MAX_TRACED:
        raise ValueError(f"--trace-steps counts steps from 1 and traces 1 to {MAX_TRACED} of them, got {text!r}")
    return first, count


def kernel_breakdown(ops: list[tuple[str, float]], steps: int) -> tuple[dict[str, float], tuple[str, ...]]:
    """From (operator, CUDA time it launched itself, us) pairs of a profile over `steps` steps: the GEMM and SDPA
    kernels' milliseconds per step, and which fused SDPA kernels ran (the names of training_service's pins), so a
    pin that did not take is seen in the rows, not only in the tables."""
    gemm = sum(us for op, us in ops if op in GEMM_OPS)
    ran = {name: sum(us for op, us in ops if op.startswith("aten::") and marker in op)
           for name, marker in ATTENTION_KERNELS.items()}
    ms = {"gemm_kernel_ms_per_step": gemm / 1e3 / steps,
          "attention_kernel_ms_per_step": sum(ran.values()) / 1e3 / steps}
    return ms, tuple(name for name, us in ran.items() if us > 0)


# A kernel's family by its name, for kernels no operator launched (a CUDA graph's replay): (family, markers, any
# of which in the lower-cased name places it), first match wins: cuDNN's SDPA kernels name "flash" too.
KERNEL_FAMILIES = (
    ("cudnn", ("cudnn_generated_fort_native_sdpa", "cudnn_sdpa")),
    ("flash", ("flash_fwd", "flash_bwd", "pytorch_flash::")),
    ("efficient", ("fmha_cutlass", "attention_kernel_backward", "attentionkernel")),
    ("gemm", ("gemm", "nvjet", "xmma", "gemv", "cutlass", "triton_tem_fused_mm", "triton_tem_fused_addmm")),
)


def kernel_family(name: str) -> str | None:
    """"gemm", the SDPA kernel (training_service's pin names) or None for anything else, by a kernel's name."""
    lowered = name.lower()
    return next((family for family, markers in KERNEL_FAMILIES if any(m in lowered for m in markers)), None)


def kernel_name_breakdown(kernels: list[tuple[str, float]], steps: int) -> tuple[dict[str, float], tuple[str, ...]]:
    """kernel_breakdown from (kernel name, its us) pairs: for steps replayed as CUDA graphs, whose kernels no
    operator launched on the host, so only their names say what they are."""
    spent: dict[str, float] = {}
    for name, us in kernels:
        if (family := kernel_family(name)) is not None:
            spent[family] = spent.get(family, 0.0) + us
    ran = tuple(pin for pin in ATTENTION_KERNELS if spent.get(pin))
    return ({"gemm_kernel_ms_per_step": spent.get("gemm", 0.0) / 1e3 / steps,
             "attention_kernel_ms_per_step": sum(spent.get(pin, 0.0) for pin in ATTENTION_KERNELS) / 1e3 / steps},
            ran)


# Where a compiled step's host time goes, by the profiler's operator names: (what the summary calls it, the
# operators it counts, each by its name or its name and a suffix, as a compiled graph's hash). Self CPU time, so
# nothing counts twice.
HOST_PARTS = (
    ("guard_ms", ("TorchDynamo Cache Lookup",)),  # dynamo checking a compiled region's guards, once per call
    ("compiled_graph_ms", ("## Call CompiledFxGraph",)),  # inductor's generated Python around its kernels
    ("autograd_wrapper_ms", ("CompiledFunction", "CompiledFunctionBackward")),  # AOTAutograd's runtime wrappers
    ("launch_ms", ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")),
)
LAUNCHES = HOST_PARTS[-1][1]


def host_breakdown(ops: list[tuple[str, float, int]], steps: int) -> dict[str, float]:
    """From (operator, its self CPU time in us, calls) triples of a profile over `steps` steps: per step, the host's
    milliseconds in all (`host_ms`) and in each of HOST_PARTS, and the kernel launches (`launches`, every launch
    call, inductor's Triton kernels' included). A step whose host time nears its kernel time is host-bound. The
    ranges the steps run in are not operators: their own time, all a step's time outside its operators, is left out
    as before they existed."""
    ops = [(op, us, n) for op, us, n in ops if not op.startswith(STEP_MARK)]
    out = {"host_ms": sum(us for _, us, _ in ops) / 1e3 / steps}
    for part, names in HOST_PARTS:
        out[part] = sum(us for op, us, _ in ops if _named(op, names)) / 1e3 / steps
    out["launches"] = sum(n for op, _, n in ops if _named(op, LAUNCHES)) / steps
    return out


def host_rows(host: dict[str, float]) -> list[tuple[str, float, str]]:
    """The (metric, value, unit) rows of a host_breakdown, as the benchmarks write them."""
    return [(f"{key.removesuffix('_ms')}_ms_per_step" if key.endswith("_ms") else f"{key}_per_step", value,
             "ms" if key.endswith("_ms") else "calls") for key, value in host.items()]


def _named(op: str, names: tuple[str, ...]) -> bool:
    """`op` is one of `names`, or one of them followed by a space and more (a compiled graph's hash)."""
    return any(op == name or op.startswith(name + " ") for name in names)


@dataclass(frozen=True)
class StepDeviceTime:
    """One step's device side, in milliseconds: kernels ran `busy` of it (overlaps counted once) and none ran
    `idle`, of which `lead` before its first kernel began and `tail` after its last ended (the host's own work at
    the step's edges: making its inputs, reading its loss back, its bookkeeping); the rest of `idle` lies between
    its kernels."""
    busy: float
    idle: float
    lead: float
    tail: float


class _Spans:
    """(start, end, ...) tuples sorted by start, so that those overlapping a window are found without a scan."""

    def __init__(self, spans):
        self.spans = sorted(spans, key=lambda span: span[0])
        self.starts = [span[0] for span in self.spans]
        self.longest = max((span[1] - span[0] for span in self.spans), default=0.0)

    def overlapping(self, start: float, end: float) -> list:
        first = bisect.bisect_left(self.starts, start - self.longest)
        last = bisect.bisect_left(self.starts, end)
        return [span for span in self.spans[first:last] if span[1] > start]


def _merged(start: float, end: float, spans) -> list[tuple[float, float]]:
    """The union of `spans` (each overlapping the window (start, end)) within the window, in order."""
    merged: list[tuple[float, float]] = []
    for k_start, k_end in sorted((max(a, start), min(b, end)) for a, b, *_ in spans):
        if merged and k_start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], k_end))
        else:
            merged.append((k_start, k_end))
    return merged


def step_device_time(steps: list[tuple[float, float]], kernels: list[tuple[float, float]]) -> list[StepDeviceTime]:
    """Per step, given as its (start, end) on the profiler's clock in microseconds, its StepDeviceTime.
    `kernels`: (start, end) of each."""
    out, kernels = [], _Spans(kernels)
    for start, end in steps:
        merged = _merged(start, end, kernels.overlapping(start, end))
        busy = sum(b - a for a, b in merged)
        lead, tail = (merged[0][0] - start, end - merged[-1][1]) if merged else (end - start, 0.0)
        out.append(StepDeviceTime(*(round(us / 1e3, 3) for us in (busy, end - start - busy, lead, tail))))
    return out


NO_OPERATOR = "(no operator: the host's own code)"
OTHER_OPERATORS = "(other operators)"
OUTSIDE_PHASES = "(outside the loop's marked phases)"


def top_level(ops: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Of one thread's (name, start, end) operators, those no other contains: what that thread itself called."""
    out: list[tuple[str, float, float]] = []
    for name, start, end in sorted(ops, key=lambda op: (op[1], -op[2])):
        if not out or start >= out[-1][2]:
            out.append((name, start, end))
    return out


def idle_host_time(steps: list[tuple[float, float]], kernels: list[tuple[float, float]],
                   host_ops: list[tuple[str, float, float]], keep: int = 12,
                   uncovered: str = NO_OPERATOR) -> dict[str, float]:
    """What the host was doing while the device ran no kernel, in milliseconds per step: for each top-level host
    operator (`host_ops`: (name, start, end), each thread's top_level), the time it overlapped the steps' device
    idle; `uncovered` the idle that no operator of any thread overlapped (the host's Python between calls); the
    `keep` largest named, the rest under OTHER_OPERATORS. Two threads' operators at once (the main thread's and the
    autograd engine's) both count, so the named can add up to more than the idle. Microseconds in."""
    spent: dict[str, float] = {}
    kernels, ops = _Spans(kernels), _Spans((op_start, op_end, name) for name, op_start, op_end in host_ops)
    for start, end in steps:
        merged = _merged(start, end, kernels.overlapping(start, end))
        edges = [start] + [t for interval in merged for t in interval] + [end]
        gaps = _Spans((a, b) for a, b in zip(edges[::2], edges[1::2]) if b > a)
        pieces = []
        for op_start, op_end, name in ops.overlapping(start, end):
            mine = [(max(a, op_start), min(b, op_end)) for a, b in gaps.overlapping(op_start, op_end)]
            if mine:
                spent[name] = spent.get(name, 0.0) + sum(b - a for a, b in mine)
                pieces += mine
        covered = sum(b - a for a, b in _merged(start, end, pieces))
        spent[uncovered] = spent.get(uncovered, 0.0) + sum(b - a for a, b in gaps.spans) - covered
    named = sorted(((us, name) for name, us in spent.items() if name != uncovered), reverse=True)
    out = {name: us for us, name in named[:keep]}
    if rest := sum(us for us, _ in named[keep:]):
        out[OTHER_OPERATORS] = rest
    out[uncovered] = spent.get(uncovered, 0.0)
    return {name: round(us / 1e3 / max(1, len(steps)), 3) for name, us in out.items()}


def device_kernels(events) -> list:
    """The profiler events that are kernels run on a CUDA device: not the device-side spans of ranges (the steps'
    own, STEP_MARK, and any other record_function), which would count a step's kernels twice."""
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    return [e for e in events if e.device_type == cuda and not e.is_user_annotation]


def _ranges_kernels_and_host_ops(events) -> tuple[list[tuple[float, float]], list[tuple[str, float, float]],
                                                  list[tuple[float, float]], list[tuple[str, float, float]]]:
    """A trace's steps' ranges in step order, the loop phases' ranges (name, start, end), the kernels, and each
    host thread's top-level operators (the marks left out)."""
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    marks, phases = [], []
    by_thread: dict[int, list[tuple[str, float, float]]] = {}
    for e in events:
        span = (e.time_range.start, e.time_range.end)
        if e.device_type == cuda:
            continue
        if e.name.startswith(STEP_MARK):
            marks.append((int(e.name[len(STEP_MARK):]), *span))
        elif e.name.startswith(PHASE_MARK):
            phases.append((e.name[len(PHASE_MARK):], *span))
        else:
            by_thread.setdefault(e.thread, []).append((e.name, *span))
    host_ops = [op for ops in by_thread.values() for op in top_level(ops)]
    kernels = [(e.time_range.start, e.time_range.end) for e in device_kernels(events)]
    return [(a, b) for _, a, b in sorted(marks)], phases, kernels, host_ops


@dataclass(frozen=True)
class Trace:
    """What a profiler trace of a few steps says, per step."""
    busy_share: float  # CUDA kernel time over wall time
    calls: dict[str, float]  # HOST_CALLS counts
    kernel_ms: float
    gemm_ms: float
    attention_ms: float
    attention_ran: tuple[str, ...]
    host: dict[str, float] = field(default_factory=dict)  # host_breakdown
    kernels_named_by: str = "operators"  # what placed the GEMM and attention kernels: "operators" or "kernel names"


def summarize(prof, steps: int, wall_s: float, table: Path | None = None, events=None) -> Trace:
    """The Trace of a finished torch.profiler `prof` that covered `steps` steps in `wall_s` seconds (`events`: its
    events, where the caller has them already). `table` gets the profiler's busiest operators, by host time and by
    device time. GEMM and attention kernels are those their operators launched, or, where operators launched none
    of either while kernels ran (a CUDA graph's replay), those their names say (kernel_name_breakdown)."""
    kernels = device_kernels(prof.events() if events is None else events)
    busy_us = sum(e.device_time for e in kernels)  # overlapping kernels would count twice; one stream here
    averages = prof.key_averages()
    ms, ran = kernel_breakdown([(e.key, e.self_device_time_total) for e in averages], steps)
    named_by = "operators"
    if kernels and not any(ms.values()):
        ms, ran = kernel_name_breakdown([(e.name, e.device_time) for e in kernels], steps)
        named_by = "kernel names"
    if table is not None:
        table.parent.mkdir(parents=True, exist_ok=True)
        by_device = averages.table(sort_by="self_device_time_total", row_limit=25) if kernels else ""
        table.write_text(averages.table(sort_by="self_cpu_time_total", row_limit=40) + "\n\n" + by_device)
    return Trace(busy_us / 1e6 / wall_s, {e.key: e.count / steps for e in averages if e.key in HOST_CALLS},
                 busy_us / 1e3 / steps, ms["gemm_kernel_ms_per_step"], ms["attention_kernel_ms_per_step"], ran,
                 host_breakdown([(e.key, e.self_cpu_time_total, e.count) for e in averages], steps), named_by)


class StepTracer:
    """The recipe's loop calls `before(done)` ahead of each step (`done`: steps finished so far) and `after(done)`
    once it has finished one; the window's first step starts the profiler and its last writes `directory`."""

    def __init__(self, window: tuple[int, int], directory: Path, device: str,
                 say: Callable[[str], None] = lambda _: None):
        self.first, self.count = window
        self.directory = Path(directory)
        self.cuda = device.startswith("cuda")
        self.say = say  # told once the trace is written (the job's log)
        self._prof = None
        self._step_range = None  # the profiler range of the step under way
        self._started = 0.0
        self._marks: list[float] = []
        self.summary: dict | None = None  # once written

    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def phase(self, name: str):
        """A context in which one part of the loop (LOOP_PHASES) runs: a profiler range while a step is traced,
        so the summary's `idle_phase_ms` says in which part the device waited; nothing otherwise."""
        if self._prof is None:
            return contextlib.nullcontext()
        from torch.profiler import record_function

        return record_function(PHASE_MARK + name)

    def before(self, done: int) -> None:
        if self._prof is None and done + 1 == self.first and self.summary is None:
            from torch.profiler import ProfilerActivity, profile

            self._sync()
            self._prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else []))
            self._prof.__enter__()
            self._started = time.perf_counter()
            self._marks = [self._started]
        if self._prof is not None:
            from torch.profiler import record_function

            self._step_range = record_function(f"{STEP_MARK}{done + 1}")
            self._step_range.__enter__()

    def after(self, done: int) -> None:
        if self._prof is None:
            return
        self._sync()
        self._end_step_range()
        self._marks.append(time.perf_counter())
        if done >= self.first + self.count - 1:
            self.finish()

    def _end_step_range(self) -> None:
        if self._step_range is not None:
            self._step_range.__exit__(None, None, None)
            self._step_range = None

    def finish(self) -> None:
        """Stops the profiler, and writes what it saw of the steps that finished under it (the run may stop inside
        the window)."""
        if self._prof is None:
            return
        self._end_step_range()  # a step stopped part way: its range ends here, and only finished steps count
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        steps = len(self._marks) - 1
        if not steps:
            return
        wall = self._marks[-1] - self._started
        self.directory.mkdir(parents=True, exist_ok=True)
        events = prof.events()
        trace = summarize(prof, steps, wall, self.directory / "ops.txt", events)
        prof.export_chrome_trace(str(self.directory / "trace.json.gz"))
        ranges, phases, kernels, host_ops = _ranges_kernels_and_host_ops(events)
        device_time = step_device_time(ranges[:steps], kernels)
        self.summary = {"first_step": self.first, "steps": steps, "device": "cuda" if self.cuda else "cpu",
                        "step_wall_ms": [round((b - a) * 1e3, 2) for a, b in zip(self._marks, self._marks[1:])],
                        "step_kernel_ms": [t.busy for t in device_time],
                        "step_idle_ms": [t.idle for t in device_time],
                        "step_lead_ms": [t.lead for t in device_time],
                        "step_tail_ms": [t.tail for t in device_time],
                        "idle_host_ms": idle_host_time(ranges[:steps], kernels, host_ops),
                        "idle_phase_ms": idle_host_time(ranges[:steps], kernels, phases,
                                                        keep=len(LOOP_PHASES), uncovered=OUTSIDE_PHASES),
                        **asdict(trace)}
        (self.directory / "summary.json").write_text(json.dumps(self.summary, indent=1))
        self.say(f"steps {self.first}-{self.first + steps - 1} traced into {self.directory}")
