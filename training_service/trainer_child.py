"""One training job in its own process: `python -m training_service.trainer_child JOB_DIR [SERVICE_PID]`, or
forked from the warm trainer (training_service.trainer_zygote), which calls run_guarded the same way.

Reads JOB_DIR/run.json, runs the recipe, prints one JSON event per line on stdout, and takes
`stop save`, `stop discard`, `stop suspend preempted` (the broker preempted the GPU) or
`stop suspend draining` (the service is stopping) or `stop suspend lease-lost` (the broker went away
with the lease) on stdin, honoured at the next step boundary; and `yield on CLIENT_ID` / `yield off`
(the broker asked this batch work to pause for busy inference on its GPU, or let it resume), honoured
at the next pause point: between steps, or before a backward pass (training_service.gpu_yield). A crash here never
takes the service down: the service sees the process end without a `finished` event.
"""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path


def die_with_the_service(service_pid: int) -> None:
    """If the service dies (even by SIGKILL), so does this job, at once: its lease went with the service, and a
    child still loading or compiling would otherwise hold GPU memory the broker has already handed to someone else."""
    import ctypes
    import os
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        return  # not Linux: the next event write fails instead, within one step
    if os.getppid() != service_pid:  # the service died before the line above ran
        os._exit(1)


PID_FILE = "trainer.pid"


def write_pid(job_dir: Path) -> None:
    """The trainer's process id in its job folder, for an operator (a forked trainer's command line is the
    warm trainer's, so `pgrep` by job id does not find it)."""
    import os

    staged = job_dir / f"{PID_FILE}.{os.getpid()}"  # whole or absent: a reader never sees it empty
    staged.write_text(f"{os.getpid()}\n")
    os.replace(staged, job_dir / PID_FILE)


_reached = {"step": 0}  # the last step this process reported, for a failure's steps_completed


def emit(kind: str, data: dict) -> None:
    if kind == "step":
        _reached["step"] = data["step"]
    print(json.dumps({"kind": kind, "data": data}), flush=True)


def main(job_dir: Path) -> int:
    from diffusion_kit.adapter_store import WEIGHTS, AdapterInfo, AdapterStore
    from diffusion_kit.families import FAMILIES
    from service_kit.errors import FailedPrecondition
    from service_kit.heap_freeze import freeze_imported
    from training_service.gpu_yield import YieldGate
    from training_service.lora_recipe import LoraRecipe
    from training_service.recipe_config import RecipeConfig

    cfg = RecipeConfig.from_json((job_dir / "run.json").read_text())
    freeze_imported((FAMILIES[cfg.family].pipeline_class,))  # the recipe's collections then skip the imports
    stop: dict[str, str] = {}
    gate = YieldGate(emit, should_stop=lambda: "mode" in stop)

    def read_stdin():
        for line in sys.stdin:
            parts = line.split()
            if len(parts) in (2, 3) and parts[0] == "stop":
                stop["why"] = parts[2] if len(parts) == 3 else ""
                stop["mode"] = parts[1]
                gate.release()
            elif len(parts) in (2, 3) and parts[0] == "yield":
                gate.ask(parts[2] if len(parts) == 3 else "") if parts[1] == "on" else gate.release()

    threading.Thread(target=read_stdin, daemon=True).start()
    if cfg.hub_repo:
        from diffusion_kit.hub_fetch import fetch_hub_repo

        repo_id, revision = cfg.hub_repo
        emit("phase", {"phase": "downloading", "message": f"scoped download of {repo_id}"})
        fetched = fetch_hub_repo(repo_id, revision)
        if fetched.resolve() != Path(cfg.base_dir).resolve():
            raise RuntimeError(f"{repo_id} moved to another revision since the preflight ({fetched.name})")
    recipe = LoraRecipe(cfg, emit)
    recipe.setup()
    if cfg.resume_from:
        recipe.load_checkpoint(Path(cfg.resume_from))
        emit("phase", {"phase": "training", "message": f"resumed at step {recipe.state.step}"})
    else:
        emit("phase", {"phase": "training"})
    recipe.train(should_stop=lambda: "mode" in stop, checkpoint_dir=job_dir / "checkpoint",
                 sample_dir=job_dir / "samples", pause=gate, trace_dir=job_dir / "trace")
    steps = recipe.state.step
    if stop.get("mode") != "discard" and recipe.checkpointed_step != steps:
        recipe.save_checkpoint(job_dir / "checkpoint")  # a stopped or finished run can be continued
    if stop.get("mode") == "discard":
        emit("finished", {"state": "CANCELLED", "steps_completed": steps, "message": "stopped; adapter discarded"})
        return 0
    if stop.get("mode") == "suspend":
        why = {"draining": "the training service stopped",
               "lease-lost": "the GPU lease was lost (the broker went away)"}.get(stop.get("why", ""),
                                                                                  "the GPU was preempted")
        emit("finished", {"state": "SUSPENDED", "steps_completed": steps,
                          "message": f"{why} at step {steps}; checkpoint saved, resume with resume_job_id"})
        return 0
    emit("phase", {"phase": "saving"})
    export = recipe.export_adapter(job_dir / "export")
    emit("phase", {"phase": "publishing"})
    lora_config = json.loads(json.dumps(recipe.model.peft_config["default"].to_dict(),
                                        default=lambda o: sorted(o) if isinstance(o, set) else str(o)))
    base = cfg.hub_repo[0] if cfg.hub_repo else cfg.base_dir
    info = AdapterInfo(adapter_id=cfg.adapter_id, family=cfg.family, base=base, rank=cfg.rank,
                       alpha=cfg.alpha, lora_config=lora_config,
                       steps=steps, resolution=cfg.resolution, trigger_words=tuple(cfg.trigger_words),
                       job_id=job_dir.name, owner=cfg.owner)
    try:
        AdapterStore(Path(cfg.adapter_store)).publish(info, export / WEIGHTS)
    except FailedPrecondition as e:  # the id was taken while this job trained: keep the work, say where it is
        emit("finished", {"state": "FAILED", "steps_completed": steps,
                          "message": f"trained {steps} steps but could not publish: {e}. The adapter is at "
                                     f"{export / WEIGHTS} and the checkpoint resumes with resume_job_id"})
        return 0
    state = "CANCELLED" if "mode" in stop else "SUCCEEDED"
    emit("finished", {"state": state, "steps_completed": steps, "adapter_id": cfg.adapter_id,
                      "message": "stopped and saved" if "mode" in stop else "done"})
    return 0


def out_of_memory_advice(cfg, step: int, peak_bytes: int, total_bytes: int) -> str:
    """What to change when a run ran out of GPU memory, cheapest first, skipping what it already does."""
    from diffusion_kit.precision import Precision
    from training_service.precision_policy import StepShape, memory_relief

    where = f"at step {step + 1}" if step else "before the first step finished"
    shape = StepShape(cfg.resolution, cfg.batch_size, cfg.gradient_checkpointing, cfg.checkpoint_interval)
    ideas = memory_relief(shape, nf4=cfg.precision == Precision.NF4)
    head = (f"out of GPU memory {where} (peak {peak_bytes / 2**30:.1f} of {total_bytes / 2**30:.1f} GiB; "
            "another process may hold the rest)")
    return head + (f"; try {', '.join(ideas)}" if ideas else "")


def divergence_advice(cfg, step: int, value: float) -> str:
    """What to change when a run's loss stopped being finite. Resuming would not help: a resumed run repeats the
    same steps bit for bit (the checkpoint pins the seed, the data and every setting that shapes them)."""
    from diffusion_kit.precision import Precision

    ideas = [f"a lower learning_rate (this run: {cfg.learning_rate:g})"]
    if cfg.warmup_steps < max(1, cfg.steps) // 10:
        ideas.append(f"more warmup_steps (this run: {cfg.warmup_steps})")
    if cfg.precision == Precision.FP16:
        ideas.append("bf16 precision, whose range fp16 lacks")
    return (f"training diverged: the loss became {value} at step {step}. A resumed run repeats the same steps and "
            f"would diverge again; start a new job with {', or '.join(ideas)}")


def run_guarded(job_dir: Path) -> int:
    """main(), with running out of GPU memory, or a loss that is no longer finite, turned into a FAILED job that
    says what to change."""
    import torch

    from training_service.lora_recipe import TrainingDiverged
    from training_service.recipe_config import RecipeConfig

    try:
        return main(job_dir)
    except (TrainingDiverged, torch.OutOfMemoryError) as e:
        error = e  # `e` is unbound once this block ends
    cfg = RecipeConfig.from_json((job_dir / "run.json").read_text())
    if isinstance(error, TrainingDiverged):
        message = divergence_advice(cfg, error.step, error.value)
    else:
        total = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
        message = out_of_memory_advice(cfg, _reached["step"], peak, total)
    emit("finished", {"state": "FAILED", "steps_completed": _reached["step"], "message": message})
    return 1


if __name__ == "__main__":
    if len(sys.argv) > 2:
        die_with_the_service(int(sys.argv[2]))
    write_pid(Path(sys.argv[1]))
    sys.exit(run_guarded(Path(sys.argv[1])))
