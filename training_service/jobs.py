"""Training jobs: one child process each, events kept on disk, re-attachable watchers, cooperative stop."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from collections import Counter
from pathlib import Path

from dataclasses import replace

from diffusion_kit.resolved import Resolved, Source, Status
from service_kit.auth import ANONYMOUS, Caller
from service_kit.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, Unavailable
from service_kit.units import format_bytes
from training_service import metrics
from training_service.job_store import TERMINAL, JobRecord, JobStore
from training_service.recipe_config import RecipeConfig
from training_service.trainer_launcher import TrainerLauncher
from training_service.training_plan import TrainingPlan
from training_service.nf4_weights import DEFAULT_BACKEND as NF4_DEFAULT

log = logging.getLogger("training_service.jobs")


STDERR_TAIL = 2000
MAX_WATCHERS_PER_JOB = 64


class JobManager:
    def __init__(self, store: JobStore, adapter_store_root: Path, broker=None, client_id: str = "training-0",
                 compile_backend: str = "inductor", checkpoint_minutes: float = 10.0,
                 encode_cache_dir: Path | None = None, launcher: TrainerLauncher | None = None,
                 aot_dir: Path | None = None, trace_steps: tuple[int, int] | None = None,
                 nf4_backend: str = NF4_DEFAULT):
        self.store = store
        self.launcher = launcher or TrainerLauncher()
        self.encode_cache_dir = encode_cache_dir  # text encodings and latents shared by the jobs; None off
        self.checkpoint_minutes = checkpoint_minutes  # the safety net under every job, whatever it asks
        self.compile_backend = compile_backend
        self.aot_dir = aot_dir  # where compiled jobs keep the blocks' graphs compiled ahead of time; None off
        self.trace_steps = trace_steps  # (first, count): every job's steps run under the profiler (step_trace)
        self.nf4_backend = nf4_backend  # what holds nf4 jobs' base weights (nf4_weights)
        self.adapter_store_root = adapter_store_root
        self.broker = broker  # gpu_broker.client.BrokerClient, or None to train without a lease
        self.client_id = client_id
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._changed = asyncio.Condition()
        self._draining = False
        self._runners: dict[str, asyncio.Task] = {}  # job id -> lease + child + follower, until the lease is back
        self._claimed: dict[str, str] = {}  # adapter id -> the running job that will publish it
        self._stopped_waiting: set[str] = set()  # jobs StopTraining ended while they waited for the GPU
        self._watching: Counter[str] = Counter()  # live WatchTraining streams per job
        self._disk_failed: dict[str, OSError] = {}  # jobs whose events or record could not be written
        self._yielding: dict[str, str] = {}  # job id -> the busy holder its GPU is yielded to, while the broker asks
        metrics.watch_store(store)

    async def start(self, plan: TrainingPlan, caller: Caller = ANONYMOUS) -> JobRecord:
        if self._draining:
            raise Unavailable("the training service is stopping; start the job on its next run",
                              reason="SERVICE_STOPPING")
        job_id = "job-" + uuid.uuid4().hex[:12]
        adapter_id = plan.recipe.adapter_id or job_id
        self._check_adapter_id_free(adapter_id)
        device = await self._check_device(plan)
        recipe = replace(plan.recipe, adapter_id=adapter_id, adapter_store=str(self.adapter_store_root),
                         owner=caller.identity, checkpoint_minutes=self.checkpoint_minutes,
                         compile_backend=self.compile_backend, encode_cache_dir=str(self.encode_cache_dir or ""),
                         aot_dir=str(self.aot_dir or ""), trace_steps=list(self.trace_steps or ()),
                         nf4_backend=self.nf4_backend)
        if plan.resume_job_id:
            recipe = replace(recipe, resume_from=str(self._resumable_checkpoint(plan.resume_job_id, recipe, caller)))
        record = self.store.create(JobRecord(job_id, plan.family.key, plan.request_json, total_steps=recipe.steps,
                                             owner=caller.identity))
        self._claimed[adapter_id] = job_id
        (self.store.dir(job_id) / "run.json").write_text(recipe.to_json())
        estimate = Resolved("gpu_memory", "", format_bytes(plan.need_bytes), Source.AUTO,
                            reason="the estimated peak of this job (its base on disk, resolution, batch and "
                                   "checkpointing), asked of the broker" if self.broker else
                                   "the estimated peak of this job; no broker, so nothing reserves it")
        resolved = (*plan.resolved, estimate, *device, self._checkpoints(recipe.checkpoint_every))
        await self._append(record, "resolved", {"resolved": [r.to_dict() for r in resolved]})
        for r in resolved:  # a fallback is said on the stream too, where a watcher reading events sees it
            if r.status is Status.FELL_BACK:
                await self._append(record, "warning", {
                    "reason": "SETTING_FELL_BACK",
                    "message": f"{r.control}: {r.requested or 'unset'} fell back to {r.applied}: {r.reason}"})
        pin = plan.device_index if self.broker is not None else None
        self._runners[job_id] = asyncio.get_running_loop().create_task(self._run(record, plan.priority,
                                                                                 plan.need_bytes, pin))
        return record

    async def _check_device(self, plan: TrainingPlan) -> tuple[Resolved, ...]:
        """A job pinned to a device: the broker has it and it can hold the job, before the job exists. The
        record says where the job asked to train."""
        index = plan.device_index
        if index is None:
            return ()
        if self.broker is None:
            return (Resolved("device", str(index), "the service's own devices", Source.EXPLICIT, Status.FELL_BACK,
                             "a device is placed and checked by the GPU broker, and this service runs without one: "
                             "the trainer uses the devices the service sees"),)
        import grpc

        try:
            devices = list((await self.broker.status()).devices)
        except grpc.aio.AioRpcError as e:
            raise Unavailable(f"the GPU broker cannot be asked ({e.code().name}); no job was created, retry",
                              reason="BROKER_UNAVAILABLE") from e
        if index >= len(devices):
            raise InvalidArgument(f"device_index {index} does not exist; the broker has devices 0..{len(devices) - 1}",
                                  reason="UNKNOWN_DEVICE", field="device_index")
        total = devices[index].total_bytes
        if plan.need_bytes > total:
            raise ResourceExhausted(f"this job needs about {format_bytes(plan.need_bytes)} and device {index} has "
                                    f"{format_bytes(total)} in all; ask for another device, or lower the resolution, "
                                    "batch or base precision", reason="NEVER_FITS")
        return (Resolved("device", str(index), f"device {index}", Source.EXPLICIT,
                         reason="the job's lease is asked of this device only"),)

    def _checkpoints(self, every: int) -> Resolved:
        when = [f"every {every} steps"] if every else []
        if self.checkpoint_minutes:
            when.append(f"at least every {self.checkpoint_minutes:g} min (the service's --checkpoint-minutes)")
        when.append("at stop, preemption and service drain")
        return Resolved("checkpoints", str(every), ", ".join(when), Source.EXPLICIT if every else Source.DEFAULT)

    async def _run(self, record: JobRecord, priority: int, need_bytes: int, device_index: int | None) -> None:
        try:
            await self._run_leased(record, priority, need_bytes, device_index)
        except asyncio.CancelledError:  # stopped, or the service stopped, while this job still waited for the GPU
            if record.state not in TERMINAL:
                why = ("stopped by StopTraining while waiting for the GPU; nothing ran"
                       if record.job_id in self._stopped_waiting else
                       "the training service stopped before the GPU was granted; nothing ran, start the job again")
                await self._append(record, "finished", {"state": "CANCELLED", "steps_completed": 0, "message": why})
        except Exception as e:  # never lose a job silently: whatever broke is its final event
            log.exception("job runner failed")
            if record.state not in TERMINAL:
                await self._append(record, "finished", {"state": "FAILED", "steps_completed": record.steps_completed,
                                                        "message": f"{type(e).__name__}: {e}"})
        finally:
            self._runners.pop(record.job_id, None)

    async def _run_leased(self, record: JobRecord, priority: int, need_bytes: int, device_index: int | None) -> None:
        """Lease (when a broker is configured), then the child; the lease is released when the child ends, and
        only then is the job's end recorded: a watcher that sees it finished finds the GPU given back."""
        lease_ctx, env = None, None
        if self.broker is not None:
            from gpu_broker.client import LeaseError, LeaseRequest

            await self._append(record, "phase", {"phase": "waiting_for_gpu"})
            lease_ctx = self.broker.lease(
                LeaseRequest(self.client_id, purpose=f"training {record.job_id} ({record.family})", priority=priority,
                             memory_bytes=need_bytes, release_grace_s=60, batch=True, device_index=device_index),
                on_preempt=lambda event: self._suspend(record, event),
                on_lost=lambda error: self._suspend_lease_lost(record),
                on_yield=lambda yielding, event: self._yield(record, yielding, event))
            try:
                held = await lease_ctx.__aenter__()
            except LeaseError as e:
                await self._append(record, "finished", {"state": "FAILED", "steps_completed": 0,
                                                        "message": f"the GPU broker did not grant a lease: {e}"})
                return
            env = await self._on_granted_device(record, held.device_index)
        final = None
        try:
            started = await self.launcher.start(self.store.dir(record.job_id), os.getpid(), env)
            proc = started.process
            self._procs[record.job_id] = proc
            if started.fell_back:
                await self._append(record, "warning", {"reason": "TRAINER_STARTED_FRESH", "message": started.how})
            if record.job_id in self._yielding:  # asked before the trainer was there to hear it
                await self._tell(proc, f"yield on {self._yielding[record.job_id]}")
            try:
                self.store.update(record, state="RUNNING")
            except OSError as e:
                self._disk_failed.setdefault(record.job_id, e)
            final = await self._follow(record, proc)
        finally:
            proc = self._procs.pop(record.job_id, None)
            if proc is not None and proc.returncode is None:  # never give the lease back under a live child
                proc.kill()
                await proc.wait()
            self._yielding.pop(record.job_id, None)
            metrics.job_ended(record.job_id)
            if lease_ctx is not None:
                await lease_ctx.__aexit__(None, None, None)
        if final is not None:
            await self._append(record, "finished", final)

    async def _on_granted_device(self, record: JobRecord, index: int) -> dict | None:
        """What the child's environment adds: it sees only the device the lease is on (CUDA_VISIBLE_DEVICES set to
        that device's UUID from the broker's inventory), and the job's stream says which. None: inherit as is."""
        import grpc

        try:
            devices = list((await self.broker.status()).devices)
        except grpc.aio.AioRpcError:
            devices = []
        uuid = devices[index].uuid if 0 <= index < len(devices) else ""
        real = uuid.startswith(("GPU-", "MIG-"))
        message = (f"granted device {index} ({uuid}); the trainer sees only it" if real else
                   f"granted device {index} ({uuid or 'unknown'}) of a fake inventory; the trainer's devices are "
                   "left as they are")
        await self._append(record, "phase", {"phase": "waiting_for_gpu", "message": message})
        return {"CUDA_VISIBLE_DEVICES": uuid} if real else None

    async def drain(self, timeout_s: float) -> None:
        """The service is stopping: every running job checkpoints at its next step and ends SUSPENDED.

        A job that cannot reach a step boundary in time (still loading, or compiling) is killed and
        fails with a message that says so; its last periodic checkpoint, if any, still resumes."""
        self._draining = True
        for job_id, task in list(self._runners.items()):
            if job_id not in self._procs:  # still waiting for a lease: withdraw the request, nothing ran
                task.cancel()
        running = [(self.store.get(job_id), proc) for job_id, proc in self._procs.items() if proc.returncode is None]
        for record, proc in running:
            await self._stop_child(record, "suspend draining", "SERVICE_STOPPING",
                                   "the training service is stopping: saving a checkpoint; resume with resume_job_id")
        waits = [asyncio.ensure_future(proc.wait()) for _, proc in running]
        if waits:
            _, late = await asyncio.wait(waits, timeout=timeout_s)
            for (record, proc), waiter in zip(running, waits):
                if waiter in late:
                    proc.kill()
                    await proc.wait()
        # Each runner records the child's end (its `finished` event, or the failure) and gives its lease back
        # to the broker before the event loop stops: a clean release, not a holder the broker sees vanish.
        runners = [task for task in self._runners.values() if not task.done()]
        if runners:
            await asyncio.wait(runners, timeout=30)
        await self.launcher.close()

    async def _suspend(self, record: JobRecord, event) -> None:
        """Preempted: the child checkpoints at its next step and exits; then the client library releases."""
        metrics.SUSPENDED.inc()
        proc = await self._stop_child(record, "suspend preempted", "PREEMPTED",
                                      f"GPU preempted by {event.for_holder.client_id!r}: saving a checkpoint and "
                                      "releasing")
        if proc is not None:
            await proc.wait()

    async def _suspend_lease_lost(self, record: JobRecord) -> None:
        """The broker went away with this job's lease: nothing may compute outside the books, so the child
        checkpoints at its next step and the job ends SUSPENDED (resume it once the broker is back)."""
        await self._stop_child(record, "suspend lease-lost", "LEASE_LOST",
                               "the GPU broker went away with this job's lease: saving a checkpoint and stopping")

    async def _yield(self, record: JobRecord, yielding: bool, event) -> None:
        """The broker asks this batch job to pause between steps for busy inference on its GPU, or lets it resume.
        The trainer says on the job's stream when it actually pauses and resumes (training_service.gpu_yield)."""
        if yielding:
            self._yielding[record.job_id] = event.for_holder.client_id or "unknown"
        else:
            self._yielding.pop(record.job_id, None)
        proc = self._procs.get(record.job_id)
        if proc is not None and proc.returncode is None:
            await self._tell(proc, f"yield on {self._yielding[record.job_id]}" if yielding else "yield off")

    @staticmethod
    async def _tell(proc, line: str) -> None:
        """One command on the trainer's stdin; a trainer already exiting is left to be reaped."""
        try:
            proc.stdin.write(f"{line}\n".encode())
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass

    async def _stop_child(self, record: JobRecord, how: str, reason: str, message: str):
        """Says why on the job's stream, then tells its child `stop <how>` (honoured at the next step boundary).
        Returns the child, or None when none runs."""
        proc = self._procs.get(record.job_id)
        if proc is None or proc.returncode is not None:
            return None
        await self._append(record, "warning", {"reason": reason, "message": message})
        await self._tell(proc, f"stop {how}")
        return proc

    async def _append(self, record: JobRecord, kind: str, data: dict) -> None:
        """Under the watchers' lock: a watcher never sees a final state without its `finished` event.

        A write that fails (a full disk) never loses the event for live watchers: it is kept in memory, the
        job is marked as unable to record (its child is then stopped, see _follow), and the error logged."""
        async with self._changed:
            if kind == "finished":
                try:
                    self._finish(record, data)
                except OSError as e:  # job.json kept its last whole version; the state is right in memory
                    self._disk_failed.setdefault(record.job_id, e)
            try:
                self.store.append(record, kind, data)
            except OSError as e:
                self._disk_failed.setdefault(record.job_id, e)
                self.store.remember(record, kind, data)
                log.error("job event not written", extra={"fields": {
                    "event": "training.event_not_written", "job_id": record.job_id, "kind": kind, "error": str(e)}})
            self._changed.notify_all()

    async def _follow(self, record: JobRecord, proc) -> dict:
        """Records the child's events until it exits, and returns its end (the `finished` event's data) for the
        caller to record once the lease is back. A job whose events cannot be written (a full disk) is stopped at
        once: nothing may train that the job's record does not show."""
        finished = None
        stderr_task = asyncio.get_running_loop().create_task(proc.stderr.read())
        async for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg["kind"] == "finished":
                finished = msg["data"]
                continue  # recorded by the caller, after the lease is given back
            if msg["kind"] == "step":
                metrics.step(record.family, msg["data"], record.job_id)
                try:
                    self.store.update(record, steps_completed=msg["data"]["step"])
                except OSError as e:
                    self._disk_failed.setdefault(record.job_id, e)
            if record.job_id in self._disk_failed:
                if proc.returncode is None:
                    proc.kill()
                continue  # read what it wrote before it died, so it never blocks on a full pipe
            await self._append(record, msg["kind"], msg["data"])
        code = await proc.wait()
        stderr = (await stderr_task).decode(errors="replace")[-STDERR_TAIL:]
        try:
            (self.store.dir(record.job_id) / "trainer.stderr").write_text(stderr)  # kept for the operator
        except OSError:
            pass
        disk_error = self._disk_failed.pop(record.job_id, None)
        if disk_error is not None:
            why = (f"the job's files could not be written ({disk_error.strerror or disk_error}); it was stopped so "
                   "that nothing trains unrecorded. Free space on the service's --output-dir" +
                   self.store.resume_hint(record))
            return {"state": "FAILED", "steps_completed": record.steps_completed, "message": why}
        if finished is None:
            why = _trainer_end(code, stderr)
            why += self.store.resume_hint(record)
            return {"state": "FAILED", "steps_completed": record.steps_completed, "message": why}
        return finished

    def _check_adapter_id_free(self, adapter_id: str) -> None:
        """Before anything starts: a run must not train for hours and then find its id taken."""
        from diffusion_kit.adapter_store import AdapterStore

        if AdapterStore(self.adapter_store_root).path(adapter_id).exists():
            raise FailedPrecondition(f"adapter {adapter_id!r} already exists in the store; choose another "
                                     "adapter_id or delete that adapter first", reason="ADAPTER_EXISTS")
        if adapter_id in self._claimed:
            raise FailedPrecondition(f"job {self._claimed[adapter_id]} is already training adapter {adapter_id!r}; "
                                     "choose another adapter_id", reason="ADAPTER_EXISTS")

    def _finish(self, record: JobRecord, finished: dict) -> None:
        for adapter_id, job_id in list(self._claimed.items()):
            if job_id == record.job_id:
                del self._claimed[adapter_id]
        self.store.update(record, state=finished["state"], adapter_id=finished.get("adapter_id", ""),
                          steps_completed=finished["steps_completed"],
                          error=finished["message"] if finished["state"] == "FAILED" else "")

    async def watch(self, job_id: str, from_sequence: int, caller: Caller = ANONYMOUS):
        """A job's events from `from_sequence`, then live ones until it ends. Recent events come from memory; an
        older replay is read from disk in bounded chunks off the event loop."""
        record = self.store.get(job_id, caller)
        if self._watching[job_id] >= MAX_WATCHERS_PER_JOB:
            raise ResourceExhausted(f"job {job_id} already has {MAX_WATCHERS_PER_JOB} watchers; close one or watch "
                                    "again later", reason="TOO_MANY_WATCHERS")
        self._watching[job_id] += 1
        try:
            next_seq = max(1, from_sequence)
            log = self.store.log(job_id)
            while True:
                if log.in_memory(next_seq):
                    batch = log.read(next_seq)
                else:
                    batch = await asyncio.to_thread(log.read, next_seq)
                for event in batch:
                    yield event
                    next_seq = event["sequence"] + 1
                    if event["kind"] == "finished":
                        return
                if batch:
                    continue
                async with self._changed:
                    if record.last_sequence < next_seq and record.state not in TERMINAL:
                        await self._changed.wait()
                    elif record.state in TERMINAL and record.last_sequence < next_seq:
                        return
        finally:
            self._watching[job_id] -= 1
            if not self._watching[job_id]:
                del self._watching[job_id]

    async def stop(self, job_id: str, discard: bool, caller: Caller = ANONYMOUS) -> JobRecord:
        record = self.store.get(job_id, caller)
        proc = self._procs.get(job_id)
        runner = self._runners.get(job_id)
        if record.state in TERMINAL or (proc is None and runner is None):
            raise FailedPrecondition(f"job {job_id} has already ended ({record.state})", reason="JOB_ENDED")
        if proc is None:  # still waiting for its lease: withdraw the request; nothing ran, so nothing to save
            self._stopped_waiting.add(job_id)
            runner.cancel()
            await asyncio.wait([runner])
            return record
        await self._tell(proc, f"stop {'discard' if discard else 'save'}")
        return record

    def delete(self, job_id: str, caller: Caller = ANONYMOUS) -> JobRecord:
        """Removes an ended job's record and files; a job still waiting or running is refused."""
        record = self.store.get(job_id, caller)
        if job_id in self._runners or job_id in self._procs:
            raise FailedPrecondition(f"job {job_id} is still {record.state}; stop it before deleting it",
                                     reason="JOB_NOT_ENDED")
        self.store.delete(record)
        return record

    def _resumable_checkpoint(self, job_id: str, recipe: RecipeConfig, caller: Caller = ANONYMOUS) -> Path:
        """The checkpoint a resumed run continues from, checked against the new run before anything starts."""
        old = self.store.get(job_id, caller)
        checkpoint = self.store.dir(job_id) / "checkpoint"
        if old.state not in TERMINAL or not (checkpoint / "identity.json").is_file():
            raise FailedPrecondition(f"job {job_id} ({old.state}) has no checkpoint to resume from",
                                     reason="NOTHING_TO_RESUME")
        changed = recipe.identity_differences(json.loads((checkpoint / "identity.json").read_text()))
        if changed:
            raise FailedPrecondition(f"job {job_id}'s checkpoint is for a different run: {', '.join(changed)} "
                                     "differ; resume with the same settings", reason="CHECKPOINT_MISMATCH")
        return checkpoint


def _trainer_end(code: int, stderr: str) -> str:
    """Why a trainer ended without its `finished` event: the signal that killed it, or the error it printed.

    The last stderr line alone was often a library warning printed long before the cause."""
    import signal

    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why = f"the trainer process was killed by {name} before finishing"
        return why + (" (the kernel's out-of-memory killer sends SIGKILL)" if name == "SIGKILL" else "")
    why = f"the trainer process ended with exit code {code} before finishing"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if _looks_like_an_error(line)]
    if errors or lines:
        why += f": {(errors or lines)[-1].strip()[:300]}"
    return why


def _looks_like_an_error(line: str) -> bool:
    """A Python exception line ('ValueError: ...', 'torch.OutOfMemoryError: ...'), not a warning."""
    head = line.split(":", 1)[0].strip()
    return ":" in line and (head.endswith(("Error", "Exception", "Interrupt")) or head == "Killed") and \
        "Warning" not in head and " " not in head

