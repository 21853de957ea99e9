"""The inference engine: one model resident at a time, one GPU worker thread, a bounded generation queue.

Concurrency rules (docs/architecture.md shows where this sits):
- Every torch call runs on the single GPU worker thread; the event loop never blocks on it.
- A generation holds only the generate lock. Status, cancel and unload never wait behind a denoise.
- A replacement load cancels the running generation and waits for it to stop, so two
  pipelines never sit in device memory at once.
- With a broker, the model's lease is held while it is resident; a preempt cancels, unloads, releases.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import AsyncIterator, Awaitable, Callable

from diffusion_kit.adapter_store import AdapterStore
from diffusion_kit.compile_errors import compile_failed
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.model_sources import HubRepo
from diffusion_kit.path_roots import Roots
from diffusion_kit.resolved import Resolved, Source
from inference_service import (generation, lora_runtime, metrics, pinned_offload, pipeline_builder, prompt_cache,
                               step_cache, step_graphs)
from inference_service.busy_signal import BusySignal
from inference_service.image_encoding import MIME, encode_image
from inference_service.load_plan import EngineSettings, LoadPlan, check_request, plan_load
from inference_service.model_source import resolve_source
from inference_service.requests import GenerateRequest, LoadRequest
from service_kit.auth import Caller, current_caller
from service_kit.errors import clip
from service_kit.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ServiceError,
    Unavailable,
)

log = logging.getLogger("inference_service.engine")


@dataclass
class LoadEvent:
    phase: str
    message: str = ""
    elapsed_s: float = 0.0
    bytes_done: int = 0
    bytes_total: int = 0
    model: "LoadedModel | None" = None


@dataclass
class GenerationEvent:
    phase: str
    queued_position: int | None = None
    progress: generation.StepReport | None = None
    image: "GeneratedImage | None" = None
    result: "GenerationResult | None" = None


@dataclass
class GeneratedImage:
    data: bytes
    mime_type: str
    seed: int
    width: int
    height: int


@dataclass
class GenerationResult:
    image_count: int  # the images went out as events before this summary
    queued_s: float
    encode_prompt_s: float
    denoise_s: float
    decode_s: float
    encode_images_s: float
    total_s: float
    resolved: list[Resolved]
    peak_memory_bytes: int = 0


@dataclass
class LoadedModel:
    model_id: str
    built: pipeline_builder.BuiltPipeline
    loaded_at: float
    device_index: int
    request: LoadRequest
    owner: str = "anonymous"  # the identity that loaded it: only it (or an admin) may unload or replace it
    lease: object = None  # gpu_broker.client.HeldLease while the broker lends the device
    lora: lora_runtime.LoraState = field(default_factory=lora_runtime.LoraState)

    @property
    def plan(self) -> LoadPlan:
        return self.built.plan


@dataclass
class _Job:
    id: str
    request: GenerateRequest
    spec: generation.GenerationSpec  # parsed once, against the model loaded when it was queued
    events: asyncio.Queue
    owner: str = "anonymous"  # only the caller that started it (or an admin) sees and cancels it
    control: generation.RunControl = field(default_factory=generation.RunControl)
    enqueued_at: float = field(default_factory=time.perf_counter)
    running: bool = False
    last_progress: generation.StepReport | None = None


_END = object()


@dataclass(frozen=True)
class EngineStatus:
    model: LoadedModel | None
    running_generation_id: str  # "" when none runs (or it is another caller's)
    running_progress: generation.StepReport | None
    queue_depth: int
    max_queue_depth: int
    lease_id: str  # "" without a broker lease


class InferenceEngine:
    def __init__(self, caps: HostCaps, settings: EngineSettings | None = None, *, broker=None,
                 client_id: str = "inference-0", max_queue_depth: int = 8, reload_after_preempt: bool = False,
                 probe_free_memory=None, adapter_store: AdapterStore | None = None, model_roots: Roots | None = None,
                 reload_on_demand: bool = False):
        self.caps = caps
        self.model_roots = model_roots or Roots.of([], "--model-root")  # the folders a Load may read
        self.settings = settings or EngineSettings()
        self.broker = broker  # gpu_broker.client.BrokerClient or None
        self.client_id = client_id
        self.max_queue_depth = max_queue_depth
        self.reload_after_preempt = reload_after_preempt
        self.reload_on_demand = reload_on_demand  # a Generate for a model keep-alive unloaded loads it again
        self._probe_free = probe_free_memory
        self.adapters = adapter_store
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpu-worker")
        self._encoders = ThreadPoolExecutor(max_workers=2, thread_name_prefix="image-encode")
        self._model: LoadedModel | None = None
        self._load_lock = asyncio.Lock()
        self._generate_lock = asyncio.Lock()
        self._pending: list[_Job] = []
        self._jobs: dict[str, _Job] = {}
        self._wake = asyncio.Event()
        self._runner: asyncio.Task | None = None
        self._pin_renewer: asyncio.Task | None = None
        # (the request, who preempted it, who had loaded it): what --reload-after-preempt loads again.
        self._unloaded_by_preempt: tuple[LoadRequest, str, str] | None = None
        # (the request, who had loaded it, its keep-alive): the model keep-alive unloaded, for --reload-on-demand.
        self._unloaded_idle: tuple[LoadRequest, str, float] | None = None
        self._idle_timer: asyncio.Task | None = None
        self._draining = False  # SIGTERM: new work answers UNAVAILABLE, what runs may finish
        self._step_rate: dict[str, float] = {}  # model id -> measured denoise seconds per step per megapixel
        self._load_abort: threading.Event | None = None
        self._busy = BusySignal(self.settings.busy_linger_s)  # training on this GPU yields while work runs or waits
        # Told (model id, ready) when a model becomes ready or goes away: the server's per-model health status.
        self.on_model_change: Callable[[str, bool], Awaitable[None]] | None = None
        metrics.watch_queue(lambda: len(self._pending))

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._runner = loop.create_task(self._run_queue())
        if self.adapters is not None:
            self._pin_renewer = loop.create_task(self._renew_adapter_pins())

    async def _renew_adapter_pins(self) -> None:
        """The adapters a loaded model uses stay pinned (not deletable) from every pod sharing the store."""
        while True:
            await asyncio.sleep(self.adapters.pin_ttl_s / 3)
            try:
                await asyncio.to_thread(self.adapters.renew_pins)
            except OSError as e:  # the store's volume hiccuped: the next round tries again
                log.warning("adapter pins not renewed", extra={"fields": {"event": "adapters.pin_renew_failed",
                                                                          "error": str(e)}})

    # ---- load / unload ------------------------------------------------------------------

    async def load(self, req: LoadRequest, caller: Caller | None = None) -> AsyncIterator[LoadEvent]:
        caller = caller or current_caller()
        self._refuse_if_draining()
        t0 = time.perf_counter()
        yield LoadEvent("validating", "checking the request, the files and the host")
        check_request(req)
        caller.check_priority(req.priority)
        self._check_may_replace(caller, f"load {req.model_id}")
        if isinstance(req.source, HubRepo):
            source = None
            async for event in self._download(req, t0):
                if isinstance(event, LoadEvent):
                    yield event
                else:
                    source = event
        else:
            source = await asyncio.to_thread(resolve_source, req.source, req.family, self.model_roots)
        plan = plan_load(req, source, self._caps_now(req.device_index), self.settings)
        await self._check_grantable(req, plan)
        events: asyncio.Queue = asyncio.Queue()
        task = asyncio.get_running_loop().create_task(self._load_plan(req, plan, events, t0, caller))
        try:
            while True:
                event = await events.get()
                if event is _END:
                    break
                yield event
            yield LoadEvent("ready", f"{plan.model_id} ready", time.perf_counter() - t0, model=await task)
        finally:
            if not task.done():
                if self._load_abort is not None:
                    self._load_abort.set()
                await asyncio.shield(asyncio.wait([task]))

    async def _download(self, req: LoadRequest, t0: float):
        """Resolves a hub source in a thread, yielding DOWNLOADING events with bytes as they land, then the source."""
        loop = asyncio.get_running_loop()
        progress: asyncio.Queue = asyncio.Queue()
        what = f"scoped download of {req.source.repo_id}"

        def on_progress(done: int, total: int) -> None:
            loop.call_soon_threadsafe(progress.put_nowait, (done, total, what))

        def before_download(planned) -> None:
            """The plan from the hub's listing and headers: a load that cannot fit is refused before a weight
            byte moves (the memory plan, and the broker's devices)."""
            plan = plan_load(req, planned, self._caps_now(req.device_index), self.settings)
            asyncio.run_coroutine_threadsafe(self._check_grantable(req, plan), loop).result()
            total = planned.stored_bytes
            loop.call_soon_threadsafe(progress.put_nowait, (0, total, f"scoped download of {planned.describe}: "
                                                                      f"{total / 2**20:.1f} MiB to fetch"))

        yield LoadEvent("downloading", what, time.perf_counter() - t0)
        work = loop.run_in_executor(None, lambda: resolve_source(req.source, req.family, self.model_roots,
                                                                 on_progress=on_progress,
                                                                 before_download=before_download))
        while True:
            getter = loop.create_task(progress.get())
            await asyncio.wait([work, getter], return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                done, total, message = getter.result()
                yield LoadEvent("downloading", message, time.perf_counter() - t0, bytes_done=done, bytes_total=total)
                continue
            getter.cancel()
            while not progress.empty():
                done, total, message = progress.get_nowait()
                yield LoadEvent("downloading", message, time.perf_counter() - t0, bytes_done=done, bytes_total=total)
            yield await work
            return

    def _caps_now(self, device_index: int | None = None) -> HostCaps:
        """Free memory measured now, counting what the resident model will give back when replaced."""
        if self._probe_free is None:
            return self.caps
        index = device_index or 0
        model = self._model
        mine = model.plan.lease_bytes if model and model.device_index == index else 0
        return self.caps.with_free(self._probe_free(index) + mine)

    async def _check_grantable(self, req: LoadRequest, plan: LoadPlan) -> None:
        """Before the resident model is evicted: the broker has the device asked for, and it is big enough."""
        if self.broker is None:
            return
        import grpc

        try:
            devices = list((await self.broker.status()).devices)
        except grpc.aio.AioRpcError as e:
            raise Unavailable(f"the GPU broker cannot be asked ({e.code().name}); nothing was unloaded, retry",
                              reason="BROKER_UNAVAILABLE") from e
        if req.device_index is not None and req.device_index >= len(devices):
            raise InvalidArgument(f"device_index {req.device_index} does not exist; the broker has devices "
                                  f"0..{len(devices) - 1}", reason="UNKNOWN_DEVICE", field="device_index")
        pool = [devices[req.device_index]] if req.device_index is not None else devices
        largest = max((d.total_bytes for d in pool), default=0)
        if plan.lease_bytes > largest:
            raise ResourceExhausted(f"{plan.model_id} needs {plan.lease_bytes / 2**30:.1f} GiB; the largest "
                                    f"device it may use has {largest / 2**30:.1f} GiB", reason="NEVER_FITS")

    @staticmethod
    def _on_granted_device(plan: LoadPlan, req: LoadRequest, index: int) -> LoadPlan:
        """The lease names a device: the pipeline goes there (cuda:N), and the record says which."""
        device = f"cuda:{index}" if plan.device == "cuda" else plan.device
        where = device if device.startswith("cuda") else f"{device} (the broker's device {index}; this host has no GPU)"
        record = Resolved("device", "any" if req.device_index is None else str(req.device_index), where, Source.AUTO
                          if req.device_index is None else Source.EXPLICIT, reason="the device the broker granted")
        return replace(plan, device=device, resolved=[*plan.resolved, record])

    def _check_may_replace(self, caller: Caller, what: str) -> None:
        """A resident model is its loader's: another identity may not unload or replace it (admins may)."""
        model = self._model
        if model is not None and not caller.may_act_on(model.owner):
            raise PermissionDenied(f"cannot {what}: model {model.model_id!r} was loaded by {model.owner!r}; only it "
                                   "or an admin may unload or replace it", reason="NOT_OWNER",
                                   metadata={"model_id": model.model_id})

    async def _load_plan(self, req: LoadRequest, plan: LoadPlan, events: asyncio.Queue,
                         t0: float, caller: Caller) -> LoadedModel:
        loop = asyncio.get_running_loop()

        def emit(phase: str, message: str = "") -> None:
            loop.call_soon_threadsafe(events.put_nowait, LoadEvent(phase, message, time.perf_counter() - t0))

        try:
            async with self._load_lock:
                self._check_may_replace(caller, f"load {plan.model_id}")  # again: the model may have changed
                await self._evict(f"replaced by a load of {plan.model_id}", "replaced")
                abort = threading.Event()
                self._load_abort = abort
                lease = None
                if self.broker is not None:
                    emit("waiting_for_gpu", f"asking the broker for {plan.lease_bytes / 2**30:.1f} GiB")
                    lease = await self._acquire(req, plan, abort)
                    plan = self._on_granted_device(plan, req, lease.device_index)
                try:
                    built = await loop.run_in_executor(self._worker, partial(pipeline_builder.build, plan, emit, abort))
                except BaseException:
                    if lease is not None:
                        await lease.close()
                    raise
                built.prompt_cache, record = prompt_cache.for_model(built.pipe, self.settings.prompt_cache_bytes)
                built.resolved.append(record)
                device_index = lease.device_index if lease is not None else (0 if plan.device != "cpu" else -1)
                self._model = LoadedModel(plan.model_id, built, time.time(), device_index, req, caller.identity, lease)
                self._unloaded_by_preempt = self._unloaded_idle = None
                await self._model_changed(plan.model_id, True)
                metrics.model_loaded(plan.model_id, plan.family.key, time.perf_counter() - t0, plan.device,
                                     device_index, plan.lease_bytes if lease is not None else 0)
                if plan.keep_alive_s:  # 0 waits for the first generation to end
                    self._arm_idle()
                log.info("model loaded", extra={"fields": {"event": "model.loaded", "model_id": plan.model_id,
                                                           "family": plan.family.key, "mode": plan.memory.mode}})
                return self._model
        except ServiceError:
            raise
        except Exception as e:
            log.exception("load failed")
            raise Internal(f"load of {plan.model_id} failed: {type(e).__name__}: {e}") from e
        finally:
            self._load_abort = None
            events.put_nowait(_END)

    async def _acquire(self, req: LoadRequest, plan: LoadPlan, abort: threading.Event):
        from gpu_broker.client import LeaseError, LeaseRequest

        async def on_abort(event):
            abort.set()

        request = LeaseRequest(self.client_id, purpose=f"inference: {plan.model_id} ({plan.family.display})",
                               priority=req.priority, memory_bytes=plan.lease_bytes,
                               device_index=req.device_index)
        ctx = self.broker.lease(request, on_preempt=self._on_preempt, on_abort=on_abort)
        try:
            return await ctx.__aenter__()
        except LeaseError as e:
            raise Unavailable(f"the GPU broker did not grant a lease: {e}", reason="NO_LEASE") from e

    async def unload(self, model_id: str, caller: Caller | None = None) -> int:
        if self._model is None or self._model.model_id != model_id:
            raise NotFound(f"model {clip(model_id)} is not loaded", reason="MODEL_NOT_LOADED")
        self._check_may_replace(caller or current_caller(), f"unload {model_id}")
        async with self._load_lock:
            return await self._evict(f"{model_id} unloaded", "unload")

    async def _evict(self, reason: str, why: str) -> int:
        """Stops generations, frees the pipeline, releases the lease. Safe with nothing loaded. `why` is one word
        (unload, replaced, preempted, idle, shutdown) for the metrics."""
        self._disarm_idle()
        for job in list(self._pending):
            self._fail(job, Unavailable(f"generation {job.id} did not start: {reason}", reason="MODEL_UNLOADED"))
        for job in self._jobs.values():
            if job.running:
                job.control.stop(reason, Unavailable(f"generation {job.id} stopped: {reason}; retry once a model is "
                                                     "loaded", reason="MODEL_UNLOADED"))
        async with self._generate_lock:  # the running generation stops at its next step
            model, self._model = self._model, None
            if model is None:
                return 0
            lora_runtime.release_adapters(self.adapters, model.lora, self.client_id)
            freed = await asyncio.get_running_loop().run_in_executor(self._worker, pipeline_builder.unload, model.built)
        await self._model_changed(model.model_id, False)
        metrics.model_unloaded(model.model_id, why)
        if model.lease is not None:
            await model.lease.close()
        log.info("model unloaded", extra={"fields": {"event": "model.unloaded", "model_id": model.model_id,
                                                     "reason": reason}})
        return freed

    # ---- keep-alive ---------------------------------------------------------------------

    def _arm_idle(self) -> None:
        """Starts the loaded model's idle timer (its keep-alive), replacing any running one."""
        model = self._model
        self._disarm_idle()
        if model is None or model.plan.keep_alive_s is None:
            return
        self._idle_timer = asyncio.get_running_loop().create_task(self._unload_when_idle(model))

    def _disarm_idle(self) -> None:
        timer, self._idle_timer = self._idle_timer, None
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()

    async def _unload_when_idle(self, model: LoadedModel) -> None:
        ttl = model.plan.keep_alive_s
        await asyncio.sleep(ttl)
        async with self._load_lock:
            if self._model is not model or self._pending or self._running_job():
                return  # replaced, or busy again: the next idle moment re-arms
            self._unloaded_idle = (model.request, model.owner, ttl)
            await self._evict(f"{model.model_id} idle for {ttl:g}s (its keep_alive)", "idle")

    async def _model_changed(self, model_id: str, ready: bool) -> None:
        if self.on_model_change is not None:
            await self.on_model_change(model_id, ready)

    async def _on_preempt(self, event) -> None:
        """The broker needs the device: stop, unload; the client library then releases the lease."""
        if self._load_abort is not None:
            self._load_abort.set()  # a load in flight stops at its next phase and gives the lease back
        model = self._model
        if model is None:
            return
        who = event.for_holder.client_id
        self._unloaded_by_preempt = (model.request, who, model.owner)
        model.lease = None  # the client library releases it after this callback
        await self._evict(f"GPU preempted by {who!r}", "preempted")

    # ---- generation ---------------------------------------------------------------------

    @staticmethod
    def new_generation_id() -> str:
        return "gen-" + uuid.uuid4().hex[:12]

    async def generate(self, req: GenerateRequest, generation_id: str = "", caller: Caller | None = None,
                       deadline_s: float | None = None) -> AsyncIterator[GenerationEvent]:
        """Queues a generation and yields its events. `deadline_s` (the call's time left) refuses at once a request
        this model's measured step rate says cannot finish in time, so it never holds the GPU for nothing."""
        caller = caller or current_caller()
        self._refuse_if_draining()
        job_id = generation_id or req.generation_id or self.new_generation_id()
        if job_id in self._jobs:
            raise FailedPrecondition(f"generation id {job_id} is already in use", reason="DUPLICATE_GENERATION_ID")
        await self._ensure_loaded(req.model_id)
        model = self._model
        spec = generation.parse_generate(req, model.plan.family, model.built.limits)  # fail fast, before queueing
        step_cache.check_runnable(spec.step_cache, model.plan.speed.compile)
        lora_runtime.check_adapters(self.adapters, spec.adapters, model.plan.family, model.plan.speed.compile,
                                    model.plan.lora_max_rank)
        if len(self._pending) >= self.max_queue_depth:
            raise ResourceExhausted(f"{len(self._pending)} generations are already waiting (the most is "
                                    f"{self.max_queue_depth}); retry later", reason="QUEUE_FULL")
        self._refuse_if_too_slow(model, spec, deadline_s)
        self._refuse_without_lease(model)
        self._disarm_idle()  # busy: re-armed when the queue is empty again
        job = _Job(job_id, req, spec, asyncio.Queue(), owner=caller.identity)
        self._jobs[job_id] = job
        self._pending.append(job)
        self._wake.set()
        self._say_busy()
        position = len(self._pending) - 1 + (1 if self._running_job() else 0)
        job.events.put_nowait(GenerationEvent("queued", queued_position=position))
        finished = False
        try:
            while True:
                event = await job.events.get()
                if isinstance(event, ServiceError):
                    finished = True
                    raise event
                yield event
                if event.result is not None:
                    finished = True
                    return
        finally:
            if not finished:
                self.cancel_generation(job_id, "the caller went away or its deadline expired", missing_ok=True,
                                       caller=None)
            self._jobs.pop(job_id, None)

    async def _ensure_loaded(self, model_id: str) -> None:
        if self._model is not None and self._model.model_id == model_id:
            return
        if self._unloaded_by_preempt and self._unloaded_by_preempt[0].model_id == model_id:
            request, who, owner = self._unloaded_by_preempt
            if not self.reload_after_preempt:
                raise Unavailable(f"model {model_id} was unloaded because the GPU was preempted by {who!r}; "
                                  "Load it again (or start the service with --reload-after-preempt)",
                                  reason="UNLOADED_BY_PREEMPTION")
            # Reloaded as the identity that loaded it, whose priority was checked then.
            async for _ in self.load(request, Caller(owner, "user")):
                pass
            return
        if self._unloaded_idle and self._unloaded_idle[0].model_id == model_id:
            request, owner, ttl = self._unloaded_idle
            if not self.reload_on_demand:
                raise FailedPrecondition(f"model {model_id} was unloaded after {ttl:g}s idle (its keep_alive); Load "
                                         "it again (or start the service with --reload-on-demand)",
                                         reason="MODEL_UNLOADED_IDLE")
            async for _ in self.load(request, Caller(owner, "user")):  # as the identity that loaded it
                pass
            return
        loaded = self._model.model_id if self._model else "none"
        raise FailedPrecondition(f"model {clip(model_id)} is not loaded (loaded: {loaded}); call Load first",
                                 reason="MODEL_NOT_LOADED")

    def cancel_generation(self, generation_id: str, reason: str = "cancelled by request", missing_ok: bool = False,
                          caller: Caller | None = ...) -> bool:
        """Stops a generation. `caller` must own it (None: the engine itself; default: the RPC's caller)."""
        caller = current_caller() if caller is ... else caller
        job = self._jobs.get(generation_id)
        if job is not None and caller is not None and not caller.may_act_on(job.owner):
            job = None  # another caller's generation answers like an unknown one: its id says nothing
        if job is None:
            if missing_ok:
                return False
            raise NotFound(f"no queued or running generation {clip(generation_id)}", reason="GENERATION_NOT_FOUND")
        if job.running:
            job.control.stop(reason)
            return True
        if job in self._pending:
            self._pending.remove(job)
            self._fail(job, Cancelled(f"generation {generation_id} cancelled while queued: {reason}",
                                      reason="GENERATION_CANCELLED"))
            self._notify_positions()
            self._say_busy()
        return False

    def _fail(self, job: _Job, error: ServiceError) -> None:
        if job in self._pending:
            self._pending.remove(job)
        job.events.put_nowait(error)

    def _say_busy(self) -> None:
        """The broker hears whether generations run or wait on the model's lease (inference_service.busy_signal)."""
        lease = self._model.lease if self._model is not None else None
        self._busy.set(lease, bool(self._pending) or self._running_job() is not None)

    def _running_job(self) -> _Job | None:
        return next((j for j in self._jobs.values() if j.running), None)

    def _notify_positions(self) -> None:
        offset = 1 if self._running_job() else 0
        for i, job in enumerate(self._pending):
            job.events.put_nowait(GenerationEvent("queued", queued_position=i + offset))

    async def _run_queue(self) -> None:
        while True:
            if not self._pending:
                self._wake.clear()
                await self._wake.wait()
                continue
            job = self._pending.pop(0)
            try:
                await self._run_job(job)
            except Exception:  # a bug in one job must not stop the queue
                log.exception("generation crashed")
                job.events.put_nowait(Internal(f"generation {job.id} failed unexpectedly; see the service log"))
            if not self._pending:
                self._arm_idle()
            self._say_busy()

    async def _run_job(self, job: _Job) -> None:
        loop = asyncio.get_running_loop()
        async with self._generate_lock:
            model = self._model
            if model is None or model.model_id != job.request.model_id:
                job.events.put_nowait(Unavailable(f"model {job.request.model_id} was unloaded before generation "
                                                  f"{job.id} started", reason="MODEL_UNLOADED"))
                return
            try:
                self._refuse_without_lease(model)
            except Unavailable as e:
                job.events.put_nowait(e)
                return
            job.running = True
            self._notify_positions()
            started = time.perf_counter()
            lease = model.lease
            job.control.still_leased = (lambda: lease.valid.is_set()) if lease is not None else (lambda: True)
            family = model.plan.family
            spec = job.spec
            attempt = 1
            try:
                def on_step(report):
                    report = replace(report, attempt=attempt)
                    job.last_progress = report
                    loop.call_soon_threadsafe(job.events.put_nowait, GenerationEvent("denoising", progress=report))

                def on_phase(phase):
                    if phase != "denoising":
                        loop.call_soon_threadsafe(job.events.put_nowait, GenerationEvent(phase))

                if model.built.offload is not None:
                    model.built.offload.take()  # moves of a generation that failed are not this one's
                if model.built.graphs is not None:
                    model.built.graphs.take()  # nor its graph replays
                adapter_records = await loop.run_in_executor(self._worker, partial(
                    lora_runtime.apply_adapters, model.built.pipe, self.adapters, spec.adapters, model.lora,
                    self.client_id, model.plan.speed.compile, on_first_adapter=model.built.before_first_adapter))
                run = partial(generation.run, model.built.pipe, family, spec, job.control, on_step, on_phase,
                              model.plan.speed.inference_mode, model.plan.memory.vae_tiling, model.built.prompt_cache)
                try:
                    out = await loop.run_in_executor(self._worker, run)
                except Exception as e:  # noqa: BLE001 - only the compiler's own failures are retried
                    if not (model.plan.speed.compile and compile_failed(e)):
                        raise
                    # The compiler failed on a graph this generation needed: the model stops tracing new graphs
                    # (said in its record) and the generation runs again, its uncovered calls uncompiled.
                    await loop.run_in_executor(self._worker, partial(pipeline_builder.stop_tracing, model.built, e))
                    attempt = 2  # its steps count from 1 again; the stream's progress says which run they are
                    out = await loop.run_in_executor(self._worker, run)
            except ServiceError as e:
                job.events.put_nowait(e)
                return
            except Exception as e:
                log.exception("generation failed")
                job.events.put_nowait(Internal(f"generation {job.id} failed: {type(e).__name__}: {e}"))
                return
            finally:
                job.running = False
        self._measure(model, spec, out.denoise_s)
        moves = model.built.offload.take() if model.built.offload is not None else None
        aot_misses = model.built.take_aot_misses()
        graphs = model.built.graphs
        graph_use = graphs and step_graphs.record(graphs.take(), graphs.failed)
        pipeline_builder.say_if_graphs_fell_back(model.built, model.built.resolved)
        # Encoding runs off the GPU worker, so the next generation can start meanwhile.
        job.events.put_nowait(GenerationEvent("encoding_images"))
        t_enc = time.perf_counter()
        model_resolved = model.built.resolved
        futures = [loop.run_in_executor(self._encoders, encode_image, img, spec.output_format, spec.encode_quality,
                                        spec.recipe(family, seed, model_resolved))
                   for img, seed in zip(out.images, spec.seeds)]
        mime = MIME[spec.output_format]
        for future, seed in zip(futures, spec.seeds):  # in seed order, each as soon as it and those before are done
            image = GeneratedImage(await future, mime, seed, spec.width, spec.height)
            job.events.put_nowait(GenerationEvent("encoding_images", image=image))
        now = time.perf_counter()
        result = GenerationResult(len(futures), started - job.enqueued_at, out.encode_prompt_s, out.denoise_s, out.decode_s,
                                  now - t_enc, now - job.enqueued_at,
                                  [*model_resolved, *spec.resolved, *adapter_records, out.tiling,
                                   *filter(None, [out.prompt_encoding, out.step_cache, out.images_per_call,
                                                  out.batch_split, out.retrace, graph_use,
                                                  moves and pinned_offload.moves_record(moves),
                                                  *(aot.miss_record(misses) for aot, misses in aot_misses),
                                                  self._busy.record(model.lease)])],
                                  out.peak_memory_bytes)
        metrics.generation_done(model.model_id, result, spec.steps)
        metrics.prompt_encodings(model.model_id, *out.prompt_counts)
        if moves is not None:
            metrics.model_moves(model.model_id, moves)
        if out.new_graphs:
            metrics.RETRACES.labels(model.model_id).inc()
        job.events.put_nowait(GenerationEvent("done", result=result))

    # ---- observation --------------------------------------------------------------------

    def status(self, caller: Caller | None = None) -> "EngineStatus":
        """What runs now, as `caller` may see it (another caller's generation is not shown)."""
        caller = caller or current_caller()
        running = self._running_job()
        if running is not None and not caller.may_act_on(running.owner):
            running = None
        return EngineStatus(self._model, running.id if running else "", running.last_progress if running else None,
                            len(self._pending), self.max_queue_depth,
                            self._model.lease.lease_id if self._model and self._model.lease else "")

    def _estimate_s(self, model: LoadedModel, spec: generation.GenerationSpec) -> float | None:
        """Denoising time from this model's measured rate (seconds per step per megapixel); None before a first
        generation has been measured."""
        rate = self._step_rate.get(model.model_id)
        if rate is None:
            return None
        return rate * spec.steps * spec.width * spec.height * len(spec.seeds) / 1e6

    def _refuse_if_too_slow(self, model: LoadedModel, spec: generation.GenerationSpec, deadline_s: float | None) -> None:
        if deadline_s is None:
            return
        mine = self._estimate_s(model, spec)
        if mine is None:
            return
        ahead = sum(self._estimate_s(model, job.spec) or 0.0 for job in self._pending)
        if mine + ahead > deadline_s:
            raise DeadlineExceeded(
                f"this request needs about {mine:.1f} s of denoising (plus {ahead:.1f} s queued ahead of it) at this "
                f"model's measured rate, more than the {deadline_s:.1f} s left of the call's deadline; nothing was "
                "queued. Ask for fewer steps, pixels or images, or allow a longer deadline",
                reason="WOULD_MISS_DEADLINE", metadata={"estimated_s": f"{mine + ahead:.2f}"})

    def _measure(self, model: LoadedModel, spec: generation.GenerationSpec, denoise_s: float) -> None:
        """Keeps the model's step rate, a moving average over its generations."""
        megapixel_steps = spec.steps * spec.width * spec.height * len(spec.seeds) / 1e6
        if megapixel_steps <= 0 or denoise_s <= 0:
            return
        rate = denoise_s / megapixel_steps
        old = self._step_rate.get(model.model_id)
        self._step_rate[model.model_id] = rate if old is None else 0.7 * old + 0.3 * rate

    @staticmethod
    def _refuse_without_lease(model: LoadedModel) -> None:
        """The broker lent this model's memory; while that lease is not held, nothing runs on the device."""
        if model.lease is not None and not model.lease.valid.is_set():
            raise Unavailable("this model's GPU lease is not held right now (the broker is unreachable, or restarted "
                              "and has not granted it again); no work runs outside a lease. Retry shortly",
                              reason="NO_LEASE")

    def _refuse_if_draining(self) -> None:
        if self._draining:
            raise Unavailable("this inference service is stopping; retry (another instance, or this one once it is "
                              "back)", reason="DRAINING")

    async def drain(self, grace_s: float) -> None:
        """SIGTERM: new work answers UNAVAILABLE at once; the running and queued generations have `grace_s` to
        finish; then whatever is left is stopped and the model unloaded."""
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self._jobs and loop.time() < deadline:  # a job leaves _jobs once its caller has the result
            await asyncio.sleep(0.05)
        await self.close()

    async def close(self) -> None:
        for task in (self._runner, self._pin_renewer):
            if task:
                task.cancel()
        async with self._load_lock:
            await self._evict("service shutting down", "shutdown")
        await self._busy.close()
        self._worker.shutdown(wait=False)
        self._encoders.shutdown(wait=False)
