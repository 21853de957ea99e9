"""Proto messages to and from the lease book's values. No policy here."""
from __future__ import annotations

from diffusion.v1 import broker_pb2
from gpu_broker import lease_book as lb
from gpu_broker.lease_hub import WatchEvent
from service_kit.errors import InvalidArgument
from service_kit.proto_time import duration, timestamp

_LEASE_STATE = {lb.LeaseState.ACTIVE: broker_pb2.LEASE_STATE_ACTIVE,
                lb.LeaseState.PREEMPTING: broker_pb2.LEASE_STATE_PREEMPTING,
                lb.LeaseState.AWAITING_RECLAIM: broker_pb2.LEASE_STATE_AWAITING_RECLAIM}
_WAIT_STATE = {lb.WaitState.QUEUED: broker_pb2.WAIT_STATE_QUEUED,
               lb.WaitState.PREEMPTING: broker_pb2.WAIT_STATE_PREEMPTING}
_CANCEL = {lb.CancelOutcome.REMOVED_FROM_QUEUE: broker_pb2.CANCEL_OUTCOME_REMOVED_FROM_QUEUE,
           lb.CancelOutcome.ABORT_REQUESTED: broker_pb2.CANCEL_OUTCOME_ABORT_REQUESTED}
_TRANSITION = {kind: broker_pb2.TransitionKind.Value(f"TRANSITION_KIND_{kind.name}") for kind in lb.TransitionKind}


def acquire_spec(req: broker_pb2.AcquireRequest) -> lb.AcquireSpec:
    if req.wait_policy not in (broker_pb2.WAIT_POLICY_UNSPECIFIED, broker_pb2.WAIT_POLICY_QUEUE,
                               broker_pb2.WAIT_POLICY_FAIL_FAST):
        raise InvalidArgument(f"unknown wait_policy {req.wait_policy}", reason="UNKNOWN_ENUM_VALUE")
    if req.compute_class not in broker_pb2.ComputeClass.values():
        raise InvalidArgument(f"unknown compute_class {req.compute_class}", reason="UNKNOWN_ENUM_VALUE",
                              field="compute_class")
    grace = None
    if req.HasField("release_grace"):
        grace = req.release_grace.ToNanoseconds() / 1e9
    return lb.AcquireSpec(
        holder=holder(req.holder),
        memory_bytes=req.memory_bytes,
        device_index=req.device_index if req.HasField("device_index") else None,
        fail_fast=req.wait_policy == broker_pb2.WAIT_POLICY_FAIL_FAST,
        release_grace_s=grace,
        reclaim_lease_id=req.reclaim_lease_id,
        batch=req.compute_class == broker_pb2.COMPUTE_CLASS_BATCH,
    )


def holder(msg: broker_pb2.Holder) -> lb.Holder:
    return lb.Holder(client_id=msg.client_id, purpose=msg.purpose, priority=msg.priority, pid=msg.pid)


def holder_msg(h: lb.Holder) -> broker_pb2.Holder:
    return broker_pb2.Holder(client_id=h.client_id, purpose=h.purpose, priority=h.priority, pid=h.pid)


def lease_msg(lease: lb.LeaseRecord) -> broker_pb2.Lease:
    msg = broker_pb2.Lease(
        lease_id=lease.lease_id,
        request_id=lease.request_id,
        holder=holder_msg(lease.holder),
        device_index=lease.device_index,
        memory_bytes=lease.memory_bytes,
        exclusive=lease.exclusive,
        granted_time=timestamp(lease.granted_at),
        state=_LEASE_STATE[lease.state],
        missed_preempt_deadlines=lease.missed_preempt_deadlines,
        granted_priority=lease.granted_priority,
        owner=lease.owner,
        compute_class=broker_pb2.COMPUTE_CLASS_BATCH if lease.batch else broker_pb2.COMPUTE_CLASS_INTERACTIVE,
        busy=lease.busy,
        yielding_to_lease_id=lease.yielding_to,
    )
    if lease.preempt_deadline is not None:
        msg.preempt_deadline.CopyFrom(timestamp(lease.preempt_deadline))
    if lease.reclaim_deadline is not None:
        msg.reclaim_deadline.CopyFrom(timestamp(lease.reclaim_deadline))
    return msg


def acquire_response(notice: lb.Notice, sequence: int) -> broker_pb2.AcquireResponse:
    msg = broker_pb2.AcquireResponse(sequence=sequence, time=timestamp(notice.time), request_id=notice.request_id)
    ev = notice.event
    if isinstance(ev, lb.Queued):
        msg.queued.CopyFrom(broker_pb2.LeaseQueued(position=ev.position, reason=ev.reason))
    elif isinstance(ev, lb.Preempting):
        msg.preempting.CopyFrom(broker_pb2.LeasePreempting(
            device_index=ev.device_index, victim_lease_ids=ev.victims, deadline=timestamp(ev.deadline)))
    elif isinstance(ev, lb.Granted):
        msg.granted.CopyFrom(lease_msg(ev.lease))
    elif isinstance(ev, lb.PreemptRequested):
        msg.preempt_requested.CopyFrom(broker_pb2.PreemptRequested(
            lease_id=ev.lease_id, deadline=timestamp(ev.deadline), for_request_id=ev.for_request_id,
            for_holder=holder_msg(ev.for_holder)))
    elif isinstance(ev, lb.PreemptWithdrawn):
        msg.preempt_withdrawn.CopyFrom(broker_pb2.PreemptWithdrawn(lease_id=ev.lease_id, reason=ev.reason))
    elif isinstance(ev, lb.AbortRequested):
        msg.abort_requested.CopyFrom(broker_pb2.AbortRequested(lease_id=ev.lease_id, reason=ev.reason))
    elif isinstance(ev, lb.YieldRequested):
        msg.yield_requested.CopyFrom(broker_pb2.YieldRequested(lease_id=ev.lease_id, for_lease_id=ev.for_lease_id,
                                                               for_holder=holder_msg(ev.for_holder)))
    elif isinstance(ev, lb.YieldWithdrawn):
        msg.yield_withdrawn.CopyFrom(broker_pb2.YieldWithdrawn(lease_id=ev.lease_id, reason=ev.reason))
    elif isinstance(ev, lb.Released):
        msg.released.CopyFrom(broker_pb2.LeaseReleased(lease=lease_msg(ev.lease), held=duration(ev.held_s)))
    else:  # pragma: no cover - Ended never reaches the wire as an event
        raise TypeError(f"not a wire event: {ev!r}")
    return msg


def release_response(released: lb.Released) -> broker_pb2.ReleaseResponse:
    return broker_pb2.ReleaseResponse(lease=lease_msg(released.lease), held=duration(released.held_s))


def cancel_response(outcome: lb.CancelOutcome) -> broker_pb2.CancelResponse:
    return broker_pb2.CancelResponse(outcome=_CANCEL[outcome])


def broker_state(snap: lb.Snapshot) -> broker_pb2.BrokerState:
    state = broker_pb2.BrokerState(sequence=snap.sequence)
    for d in snap.devices:
        state.devices.add(index=d.index, name=d.name, uuid=d.uuid, total_bytes=d.total_bytes,
                          leased_bytes=snap.leased_bytes[d.index])
    state.leases.extend(lease_msg(lease) for lease in snap.leases)
    for item in snap.queue:
        w = item.waiter
        entry = state.queue.add(
            request_id=w.request_id, holder=holder_msg(w.spec.holder), memory_bytes=w.spec.memory_bytes,
            state=_WAIT_STATE[w.state], position=item.position, arrival_time=timestamp(w.arrived_at),
            effective_priority=item.effective_priority, victim_lease_ids=w.victims)
        if w.spec.device_index is not None:
            entry.device_index = w.spec.device_index
    return state


def watch_response(event: WatchEvent) -> broker_pb2.WatchResponse:
    t = event.transition
    if t is None:
        transition = broker_pb2.Transition(kind=broker_pb2.TRANSITION_KIND_SNAPSHOT, device_index=-1)
        sequence = event.snapshot.sequence
    else:
        transition = broker_pb2.Transition(kind=_TRANSITION[t.kind], request_id=t.request_id, lease_id=t.lease_id,
                                           device_index=t.device_index, detail=t.detail)
        if t.holder is not None:
            transition.holder.CopyFrom(holder_msg(t.holder))
        sequence = t.sequence
    return broker_pb2.WatchResponse(sequence=sequence, time=timestamp(event.time), transition=transition,
                                    state=broker_state(event.snapshot))
