"""The broker over real loopback gRPC: a broker process per test, blocking clients."""
import contextlib
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from diffusion.v1 import broker_pb2
from service_kit.error_interceptor import error_info
from tests.gpu_broker.harness import GiB
from service_kit.service_process import ROOT


def test_grant_status_release(start_broker):
    _, c = start_broker(fake_devices="2x24GiB")
    a = c.acquire("inference-0", priority=3, memory=10 * GiB, purpose="load FLUX.1-dev")
    first = a.next()
    assert first.WhichOneof("event") == "queued" and first.queued.position == 0 and first.request_id
    granted = a.next().granted
    assert granted.memory_bytes == 10 * GiB and not granted.exclusive and granted.holder.purpose == "load FLUX.1-dev"
    state = c.status()
    assert [l.lease_id for l in state.leases] == [granted.lease_id]
    assert state.devices[granted.device_index].leased_bytes == 10 * GiB
    resp = c.release(a)
    assert resp.lease.lease_id == granted.lease_id and resp.held.ToNanoseconds() > 0
    assert a.next().WhichOneof("event") == "released"
    with pytest.raises(EOFError):
        a.next()
    assert list(c.status().leases) == []


def test_contention_preempts_then_grants_waiter(start_broker):
    _, c = start_broker()
    timeline = c.timeline()
    trainer = c.granted("trainer", priority=1)
    inference = c.acquire("inference", priority=5)
    assert inference.next().WhichOneof("event") == "queued"
    preempting = inference.next().preempting
    assert list(preempting.victim_lease_ids) == [trainer.lease.lease_id]
    ask = trainer.wait_for("preempt_requested").preempt_requested
    assert ask.for_holder.client_id == "inference" and ask.lease_id == trainer.lease.lease_id
    assert ask.deadline.ToNanoseconds() > time.time_ns()
    assert inference.kinds_so_far(0.2) == []  # nothing granted on top of the holder
    c.release(trainer)
    assert inference.wait_for("granted").granted.holder.client_id == "inference"
    timeline.wait_for("GRANTED", lease_id=inference.lease.lease_id)
    assert timeline.kinds() == ["SNAPSHOT", "GRANTED", "PREEMPT_REQUESTED", "RELEASED", "GRANTED"]


def test_request_that_can_never_fit_is_rejected_and_holder_untouched(start_broker):
    _, c = start_broker()
    timeline = c.timeline()
    holder = c.granted("trainer", priority=0, memory=20 * GiB)
    big = c.acquire("inference", priority=99, memory=30 * GiB)
    err = big.final_error()
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "can never fit" in err.details() and "24.0 GiB" in err.details()
    assert error_info(err).reason == "NEVER_FITS"
    assert holder.kinds_so_far(0.3) == []
    assert "PREEMPT_REQUESTED" not in timeline.kinds()
    assert [l.holder.client_id for l in c.status().leases] == ["trainer"]


def test_preemption_that_would_not_help_disturbs_nobody(start_broker):
    _, c = start_broker()
    low = c.granted("low", priority=1, memory=12 * GiB)
    high = c.granted("high", priority=30, memory=12 * GiB)
    fast = c.acquire("mid", priority=20, fail_fast=True)  # whole device: only evicting 'high' too would do
    err = fast.final_error()
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "no holder was disturbed" in err.details()
    queued = c.acquire("mid-queued", priority=20)
    assert queued.next().WhichOneof("event") == "queued"
    assert low.kinds_so_far(0.3) == [] and high.kinds_so_far(0.0) == []
    assert [w.state for w in c.status().queue] == [broker_pb2.WAIT_STATE_QUEUED]


def test_missed_preempt_deadline_is_reported_and_waiter_fails(start_broker):
    _, c = start_broker()
    timeline = c.timeline()
    stubborn = c.granted("stubborn-trainer", priority=1, grace=0.3, purpose="epoch 3")
    waiter = c.acquire("inference", priority=5)
    stubborn.wait_for("preempt_requested")
    err = waiter.final_error(timeout=5)
    assert err.code() == grpc.StatusCode.ABORTED
    assert "'stubborn-trainer'" in err.details() and stubborn.lease.lease_id in err.details()
    info = error_info(err)
    assert info.reason == "PREEMPT_DEADLINE_MISSED" and info.metadata["holders"] == "stubborn-trainer"
    assert stubborn.wait_for("preempt_withdrawn").preempt_withdrawn.lease_id == stubborn.lease.lease_id
    missed = timeline.wait_for("PREEMPT_DEADLINE_MISSED")
    assert missed.transition.holder.client_id == "stubborn-trainer"
    state = c.status()
    assert [l.holder.client_id for l in state.leases] == ["stubborn-trainer"]
    assert state.leases[0].missed_preempt_deadlines == 1 and state.leases[0].state == broker_pb2.LEASE_STATE_ACTIVE
    assert state.devices[0].leased_bytes == state.devices[0].total_bytes and list(state.queue) == []


def test_cancel_queued_request(start_broker):
    _, c = start_broker()
    c.granted("a", priority=5)
    b = c.acquire("b", priority=5)
    request_id = b.next().request_id
    resp = c.stub.Cancel(broker_pb2.CancelRequest(request_id=request_id, reason="user gave up"))
    assert resp.outcome == broker_pb2.CANCEL_OUTCOME_REMOVED_FROM_QUEUE
    err = b.final_error()
    assert err.code() == grpc.StatusCode.CANCELLED and "user gave up" in err.details()
    assert list(c.status().queue) == []


def test_cancel_in_flight_operation_reaches_holder(start_broker):
    _, c = start_broker()
    loader = c.granted("inference", priority=5, purpose="download FLUX.1-dev")
    resp = c.stub.Cancel(broker_pb2.CancelRequest(lease_id=loader.lease.lease_id, reason="wrong model"))
    assert resp.outcome == broker_pb2.CANCEL_OUTCOME_ABORT_REQUESTED
    abort = loader.wait_for("abort_requested").abort_requested
    assert abort.reason == "wrong model" and abort.lease_id == loader.lease.lease_id
    # cancelling by the granted request id means the same thing
    resp = c.stub.Cancel(broker_pb2.CancelRequest(request_id=loader.request_id))
    assert resp.outcome == broker_pb2.CANCEL_OUTCOME_ABORT_REQUESTED
    assert [l.lease_id for l in c.status().leases] == [loader.lease.lease_id]


def test_waiter_whose_call_deadline_expires_leaves_the_queue(start_broker):
    _, c = start_broker()
    c.granted("a", priority=5)
    timeline = c.timeline()
    call = c.stub.Acquire(broker_pb2.AcquireRequest(holder=broker_pb2.Holder(client_id="b")), timeout=0.5)
    with pytest.raises(grpc.RpcError) as e:
        list(call)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    timeline.wait_for("CANCELLED")
    assert list(c.status().queue) == []


@contextlib.contextmanager
def holder_process(address: str, client_id: str):
    """A holder in its own process (tests/gpu_broker/holder_process.py); yields it and its lease id."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holder = subprocess.Popen([sys.executable, "-m", "tests.gpu_broker.holder_process", address, client_id],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        lease_id = holder.stdout.readline().strip()
        assert lease_id.startswith("lease-")
        yield holder, lease_id
    finally:
        holder.kill()
        holder.wait()


def test_sigkilled_holder_frees_its_lease_within_two_seconds(start_broker):
    proc, c = start_broker()
    timeline = c.timeline()
    with holder_process(proc.address, "doomed") as (holder, lease_id):
        assert [l.lease_id for l in c.status().leases] == [lease_id]
        killed_at = time.monotonic()
        holder.send_signal(signal.SIGKILL)
        lost = timeline.wait_for("HOLDER_LOST", timeout=2.0, lease_id=lease_id)
        assert time.monotonic() - killed_at < 2.0
        assert lost.transition.holder.client_id == "doomed" and list(lost.state.leases) == []
        assert list(c.status().leases) == []


def test_frozen_holder_is_noticed_by_keepalive_within_seconds(start_broker):
    """A half-open peer (SIGSTOP: the socket stays open, nothing answers pings) loses its lease by keepalive."""
    proc, c = start_broker()
    timeline = c.timeline()
    with holder_process(proc.address, "frozen") as (holder, lease_id):
        stopped_at = time.monotonic()
        holder.send_signal(signal.SIGSTOP)
        timeline.wait_for("HOLDER_LOST", timeout=8.0, lease_id=lease_id)
        assert time.monotonic() - stopped_at < 6.0  # 2 s ping interval + 2 s ping timeout, plus slack


def test_priority_then_arrival_order(start_broker):
    _, c = start_broker("--aging-interval", "0")
    holder = c.granted("holder", priority=9)
    low = c.acquire("low", priority=0)
    first = c.acquire("first-mid", priority=5)
    second = c.acquire("second-mid", priority=5)
    for s in (low, first, second):
        s.next()
    assert [w.holder.client_id for w in c.status().queue] == ["first-mid", "second-mid", "low"]
    order = []
    current = holder
    for _ in range(3):
        c.release(current)
        deadline = time.monotonic() + 5
        while True:
            granted = [s for s in (low, first, second) if s.lease is None and "granted" in _drain(s)]
            if granted:
                current = granted[0]
                break
            assert time.monotonic() < deadline
        order.append(current.lease.holder.client_id)
    assert order == ["first-mid", "second-mid", "low"]


def _drain(stream):
    kinds = []
    while True:
        try:
            ev = stream.next(timeout=0.05)
        except Exception:
            return kinds
        kinds.append(ev.WhichOneof("event"))


def test_aging_prevents_starvation(start_broker):
    _, c = start_broker("--aging-interval", "0.4")
    holder = c.granted("holder", priority=100)
    starving = c.acquire("starving", priority=0)
    starving.next()
    time.sleep(1.0)  # two aging intervals: effective priority 2
    newcomer = c.acquire("newcomer", priority=1)
    newcomer.next()
    queue = c.status().queue
    assert [w.holder.client_id for w in queue] == ["starving", "newcomer"]
    assert queue[0].effective_priority >= 2
    c.release(holder)
    assert starving.wait_for("granted").granted.granted_priority >= 2
    assert newcomer.kinds_so_far(0.2) in ([], ["queued"])


def test_two_budgeted_leases_share_one_device(start_broker):
    _, c = start_broker()
    a = c.granted("inference", memory=10 * GiB)
    b = c.granted("trainer", memory=12 * GiB)
    assert a.lease.device_index == b.lease.device_index == 0
    assert c.status().devices[0].leased_bytes == 22 * GiB
    third = c.acquire("third", memory=4 * GiB)
    assert third.next().queued.position == 0
    assert third.kinds_so_far(0.2) == []
    c.release(a)
    assert third.wait_for("granted").granted.memory_bytes == 4 * GiB


@pytest.mark.parametrize("kwargs, code, text, reason", [
    (dict(client_id="x", device=5), grpc.StatusCode.INVALID_ARGUMENT, "devices 0..1", "UNKNOWN_DEVICE"),
    (dict(client_id="x", memory=-1), grpc.StatusCode.INVALID_ARGUMENT, "memory_bytes must be >= 0", "NEGATIVE_MEMORY"),
    (dict(client_id=""), grpc.StatusCode.INVALID_ARGUMENT, "client_id is required", "MISSING_CLIENT_ID"),
    (dict(client_id="x", grace=-1), grpc.StatusCode.INVALID_ARGUMENT, "release_grace", "BAD_RELEASE_GRACE"),
])
def test_malformed_acquire(start_broker, kwargs, code, text, reason):
    _, c = start_broker(fake_devices="2x24GiB")
    client_id = kwargs.pop("client_id")
    err = c.acquire(client_id, **kwargs).final_error()
    assert err.code() == code and text in err.details()
    assert error_info(err).reason == reason


def test_unknown_ids_are_not_found(start_broker):
    _, c = start_broker()
    for call, req in [(c.stub.Release, broker_pb2.ReleaseRequest(lease_id="lease-nope")),
                      (c.stub.Cancel, broker_pb2.CancelRequest(lease_id="lease-nope")),
                      (c.stub.Cancel, broker_pb2.CancelRequest(request_id="req-nope"))]:
        with pytest.raises(grpc.RpcError) as e:
            call(req)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        c.stub.Release(broker_pb2.ReleaseRequest())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        c.stub.Cancel(broker_pb2.CancelRequest())
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_and_reflection(start_broker):
    _, c = start_broker()
    health = health_pb2_grpc.HealthStub(c.channel)
    for service in ("", "diffusion.v1.GpuBrokerService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(c.channel)
    responses = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {"diffusion.v1.GpuBrokerService", "grpc.health.v1.Health"} <= names


def test_graceful_shutdown_ends_streams_unavailable(start_broker):
    proc, c = start_broker()
    holder = c.granted("a")
    waiter = c.acquire("b")
    waiter.next()
    assert proc.stop(signal.SIGTERM) == 0
    for stream in (holder, waiter):
        err = stream.final_error()
        assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert any(e.get("msg") == "shutting down" for e in proc.log_events())


def test_one_structured_log_line_per_transition(start_broker):
    proc, c = start_broker()
    a = c.granted("a", priority=1)
    b = c.acquire("b", priority=2)
    a.wait_for("preempt_requested")
    c.release(a)
    b.wait_for("granted")
    time.sleep(0.1)
    lease_events = [e["event"] for e in proc.log_events() if e.get("logger") == "gpu_broker.lease"]
    assert lease_events == ["lease.granted", "lease.preempt_requested", "lease.released", "lease.granted"]
