"""The synchronous lease book, driven directly with explicit times."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_broker.inventory import DeviceInfo
from gpu_broker.lease_book import (
    AcquireSpec,
    BrokerPolicy,
    Ended,
    Granted,
    Holder,
    LeaseBook,
    LeaseState,
    PreemptRequested,
    PreemptWithdrawn,
    Queued,
    TransitionKind,
    YieldRequested,
    YieldWithdrawn,
)
from service_kit.errors import Aborted, InvalidArgument, NotFound, ResourceExhausted

G = 2**30


def book(n=1, size=24, **policy):
    return LeaseBook([DeviceInfo(i, "fake", f"fake-{i}", size * G) for i in range(n)], BrokerPolicy(**policy))


def spec(client, prio=0, mem=0, **kw):
    return AcquireSpec(Holder(client, priority=prio), memory_bytes=mem, **kw)


def events_for(b, request_id):
    return [n.event for n in b.outbox if n.request_id == request_id]


def test_first_event_is_queued_then_granted():
    b = book()
    r = b.submit(spec("a"), now=0)
    kinds = [type(e) for e in events_for(b, r)]
    assert kinds == [Queued, Granted]
    assert events_for(b, r)[0].position == 0


def test_missed_deadline_fails_waiter_names_holder_and_never_double_grants():
    b = book(default_release_grace_s=2)
    a = b.submit(spec("trainer", prio=1), 0)
    w = b.submit(spec("inference", prio=5), 1)
    assert any(isinstance(e, PreemptRequested) for e in events_for(b, a))
    b.outbox.clear()
    b.tick(2.9)
    assert not any(isinstance(e, Ended) for e in events_for(b, w))
    b.tick(3.0)
    ended = [e for e in events_for(b, w) if isinstance(e, Ended)]
    assert len(ended) == 1 and isinstance(ended[0].error, Aborted)
    assert "'trainer'" in ended[0].error.message
    assert any(isinstance(e, PreemptWithdrawn) for e in events_for(b, a))
    snap = b.snapshot(3.0)
    assert [lease.holder.client_id for lease in snap.leases] == ["trainer"]
    assert snap.leases[0].missed_preempt_deadlines == 1 and snap.leases[0].state is LeaseState.ACTIVE
    assert snap.queue == ()
    assert TransitionKind.PREEMPT_DEADLINE_MISSED in [t.kind for t in b.transitions]


def test_fail_fast_rejection_changes_nothing():
    b = book()
    b.submit(spec("high", prio=9, mem=12 * G), 0)
    b.submit(spec("low", prio=1, mem=12 * G), 0)
    b.outbox.clear()
    before = b.snapshot(1)
    with pytest.raises(ResourceExhausted) as e:
        b.submit(spec("mid", prio=5, fail_fast=True), 1)
    assert "FAIL_FAST" in e.value.message
    assert b.outbox == []
    after = b.snapshot(1)
    assert after.leases == before.leases and after.queue == ()


@pytest.mark.parametrize("bad, error, text", [
    (spec("", 0), InvalidArgument, "client_id is required"),
    (spec("a", mem=-1), InvalidArgument, "memory_bytes must be >= 0"),
    (spec("a", device_index=3), InvalidArgument, "devices 0..0"),
    (spec("a", release_grace_s=10_000), InvalidArgument, "release_grace"),
    (spec("a", mem=25 * G), ResourceExhausted, "can never fit"),
])
def test_validation(bad, error, text):
    b = book()
    with pytest.raises(error, match=text):
        b.submit(bad, 0)
    assert b.snapshot(0).leases == () and b.snapshot(0).queue == ()


def test_release_unknown_is_not_found():
    with pytest.raises(NotFound):
        book().release("lease-nope", 0)


def test_stream_closed_frees_lease_and_grants_next():
    b = book()
    a = b.submit(spec("a"), 0)
    w = b.submit(spec("b"), 0)
    b.stream_closed(a, 1)
    assert any(isinstance(e, Granted) for e in events_for(b, w))
    assert TransitionKind.HOLDER_LOST in [t.kind for t in b.transitions]


def test_next_deadline_covers_preempt_and_aging():
    b = book(default_release_grace_s=3, aging_interval_s=10)
    b.submit(spec("a", prio=1), 0)
    b.submit(spec("b", prio=5), 1)
    assert b.next_deadline(1) == 4
    b2 = book(aging_interval_s=10)
    b2.submit(spec("a", prio=1), 0)
    b2.submit(spec("b", prio=1), 2)
    assert b2.next_deadline(5) == 12


@pytest.mark.parametrize("arrived, aging, steps", [
    (65.16, 0.3, 7), (11.79187, 0.1, 31), (48.785666, 1.0, 28), (92.2, 5.0, 12), (0.0, 2.0, 3),
])
def test_a_tick_on_an_aging_step_in_floating_point_returns(arrived, aging, steps):
    """A tick at a waiter's arrival plus whole aging steps, where floating point puts the next step computed from
    the division at or before the tick: the aging loop re-pushed the same due time forever (found by the invariants
    test below) and the broker's event loop would have spun."""
    import threading

    b = book(aging_interval_s=aging)
    b.submit(spec("holder", prio=9), 0)
    waiter = b.submit(spec("waiter", prio=0), arrived)
    now = arrived + aging * steps
    done = threading.Event()
    threading.Thread(target=lambda: (b.tick(now), done.set()), daemon=True).start()
    assert done.wait(5), "tick() did not return"
    assert b._waiters[waiter].effective_priority >= steps - 1
    assert b.next_deadline(now) > now


# ---- invariants under random operation sequences ---------------------------------------------

op = st.one_of(
    st.tuples(st.just("submit"), st.integers(0, 3), st.sampled_from([0, 4, 8, 12, 20]), st.booleans()),
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("close"), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("tick"), st.floats(0, 3)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=40))
def test_invariants_hold_for_any_sequence(ops):
    b = book(n=2, default_release_grace_s=1, aging_interval_s=2)
    now = 0.0
    requests: list[str] = []
    for o in ops:
        now += 0.1
        try:
            if o[0] == "submit":
                requests.append(b.submit(spec(f"c{len(requests)}", prio=o[1], mem=o[2] * G, fail_fast=o[3]), now))
            elif o[0] == "release":
                leases = b.snapshot(now).leases
                if leases:
                    b.release(leases[o[1] % len(leases)].lease_id, now)
            elif o[0] == "close" and requests:
                b.stream_closed(requests[o[1] % len(requests)], now)
            elif o[0] == "cancel" and requests:
                b.cancel(now, request_id=requests[o[1] % len(requests)])
            elif o[0] == "tick":
                now += o[1]
                b.tick(now)
        except (ResourceExhausted, NotFound):
            pass
        snap = b.snapshot(now)
        for dev in snap.devices:
            on_dev = [lease for lease in snap.leases if lease.device_index == dev.index]
            # never double-granted
            assert sum(lease.memory_bytes for lease in on_dev) <= dev.total_bytes
            if any(lease.exclusive for lease in on_dev):
                assert len(on_dev) == 1
        by_id = {lease.lease_id: lease for lease in snap.leases}
        for item in snap.queue:
            for victim in item.waiter.victims:
                if victim in by_id and by_id[victim].preempt_for == item.waiter.request_id:
                    # only strictly lower priority holders are ever preempted
                    assert by_id[victim].granted_priority < item.waiter.spec.holder.priority
        # every preempting lease belongs to a live waiter
        waiting = {item.waiter.request_id for item in snap.queue}
        for lease in snap.leases:
            if lease.state is LeaseState.PREEMPTING:
                assert lease.preempt_for in waiting


def test_the_queue_is_bounded_and_a_refusal_changes_nothing():
    b = book(max_waiters=3)
    b.submit(spec("holder", mem=24 * G), now=0)
    waiting = [b.submit(spec(f"w{i}", mem=G), now=1) for i in range(3)]
    with pytest.raises(ResourceExhausted) as e:
        b.submit(spec("one-too-many", mem=G), now=2)
    assert e.value.reason == "QUEUE_FULL"
    assert [w.waiter.request_id for w in b.snapshot(3).queue] == waiting


def test_only_the_owner_or_an_admin_ends_a_lease():
    from service_kit.auth import Caller
    from service_kit.errors import PermissionDenied

    b = book()
    r = b.submit(AcquireSpec(Holder("alice"), owner="alice"), now=0)
    lease_id = b.lease_for_request(r).lease_id
    for call in (lambda c: b.release(lease_id, 1, c), lambda c: b.cancel(1, lease_id=lease_id, caller=c)):
        with pytest.raises(PermissionDenied):
            call(Caller("mallory"))
    assert b.cancel(1, lease_id=lease_id, caller=Caller("alice")) is not None
    assert b.release(lease_id, 2, Caller("ops", "admin")).lease.owner == "alice"


def test_the_broker_serves_a_bounded_number_of_watchers():
    import asyncio

    from gpu_broker.lease_hub import MAX_WATCHERS, LeaseHub

    async def main():
        hub = LeaseHub(book())
        watchers = [hub.watch() for _ in range(MAX_WATCHERS)]
        for w in watchers:
            assert (await w.__anext__()).transition is None  # the opening snapshot
        with pytest.raises(ResourceExhausted) as e:
            await hub.watch().__anext__()
        assert e.value.reason == "TOO_MANY_WATCHERS"
        await watchers[0].aclose()
        assert (await hub.watch().__anext__()).transition is None
        for w in watchers[1:]:
            await w.aclose()

    asyncio.run(main())


def restored_book(window=60.0, **journal_overrides):
    """A book that ran one lease of 16 GiB, then a fresh book restored from its journal at t=100."""
    first = book(reclaim_window_s=window)
    r = first.submit(spec("inference-0", prio=5, mem=16 * G), now=0)
    lease_id = first.lease_for_request(r).lease_id
    entries = [{**e, **journal_overrides} for e in first.journal()]
    second = book(reclaim_window_s=window, aging_interval_s=0)
    second.restore(LeaseBook.leases_from_journal(entries), now=100)
    return second, lease_id


@pytest.mark.parametrize("ask, reclaimed", [
    (dict(mem=16 * G), True),
    (dict(mem=16 * G, owner="mallory"), False),  # another identity cannot take it over
    (dict(mem=8 * G), False),  # a different budget is a new request
    (dict(mem=16 * G, device_index=0), True),
])
def test_a_journaled_lease_is_reclaimed_only_by_its_holder(ask, reclaimed):
    b, lease_id = restored_book()
    owner = ask.pop("owner", "anonymous")
    r = b.submit(AcquireSpec(Holder("inference-0"), memory_bytes=ask.pop("mem"), owner=owner,
                             reclaim_lease_id=lease_id, **ask), now=101)
    got = b.lease_for_request(r)
    assert (got is not None and got.lease_id == lease_id) is reclaimed
    state = b.snapshot(101)
    assert state.leased_bytes[0] >= 16 * G  # the journaled memory is never lent twice
    if not reclaimed:
        assert b._leases[lease_id].state is LeaseState.AWAITING_RECLAIM


def test_memory_awaiting_reclaim_is_neither_lent_nor_preempted_until_the_window_ends():
    b, lease_id = restored_book(window=60)
    r = b.submit(spec("urgent", prio=2**31 - 2, mem=16 * G), now=101)  # would preempt any live holder
    assert b.lease_for_request(r) is None and not any(isinstance(e, PreemptRequested) for e in events_for(b, r))
    assert b.next_deadline(101) == 160
    b.tick(now=160)
    assert lease_id not in b._leases and b.lease_for_request(r) is not None
    kinds = [t.kind for t in b.transitions]
    assert kinds.index(TransitionKind.RECLAIM_EXPIRED) < len(kinds) - 1


def test_moved_positions_are_told_once_after_a_burst_of_changes():
    """A mass disconnect used to cost a pass over the queue per departure; now one pass per notice interval."""
    b = book(position_notice_s=0.25, aging_interval_s=0)
    b.submit(spec("holder", prio=9), now=0)
    waiting = [b.submit(spec(f"w{i}", mem=8 * G), now=0.001 * i) for i in range(1, 6)]
    b.outbox.clear()
    for r in waiting[:3]:
        b.stream_closed(r, now=1)
    assert not [n for n in b.outbox if isinstance(n.event, Queued)]  # nothing yet: positions are batched
    assert b.next_deadline(1) == pytest.approx(1.25)
    b.tick(now=1.25)
    moved = {n.request_id: n.event.position for n in b.outbox if isinstance(n.event, Queued)}
    assert moved == {waiting[3]: 0, waiting[4]: 1}
    assert [w.waiter.request_id for w in b.snapshot(1.3).queue] == waiting[3:]


# ---- compute sharing: batch leases yield to busy interactive ones ------------------------------------------------

def yield_events(b, request_id):
    return [e for e in events_for(b, request_id) if isinstance(e, (YieldRequested, YieldWithdrawn))]


def lease_of(b, request_id):
    return b.lease_for_request(request_id).lease_id


def test_a_busy_interactive_lease_makes_batch_work_on_its_device_yield_and_resume():
    b = book(n=2)
    inf = b.submit(spec("inference", mem=8 * G, device_index=0), 0)
    train = b.submit(spec("training", mem=8 * G, device_index=0, batch=True), 0)
    other = b.submit(spec("training-2", mem=8 * G, device_index=1, batch=True), 0)
    b.outbox.clear()
    assert b.set_busy(lease_of(b, inf), True, 1) == (lease_of(b, train),)
    [asked] = yield_events(b, train)
    assert isinstance(asked, YieldRequested) and asked.for_lease_id == lease_of(b, inf)
    assert asked.for_holder.client_id == "inference"
    assert yield_events(b, other) == [] and yield_events(b, inf) == []
    assert b.snapshot(1).leases[1].yielding_to == lease_of(b, inf)
    b.outbox.clear()
    assert b.set_busy(lease_of(b, inf), True, 2) == (lease_of(b, train),)
    assert yield_events(b, train) == []  # saying it again changes nothing
    assert b.set_busy(lease_of(b, inf), False, 3) == ()
    [resumed] = yield_events(b, train)
    assert isinstance(resumed, YieldWithdrawn) and "no longer busy" in resumed.reason
    kinds = [t.kind for t in b.transitions]
    assert TransitionKind.YIELD_REQUESTED in kinds and TransitionKind.YIELD_WITHDRAWN in kinds


def test_batch_work_granted_beside_busy_work_yields_from_its_grant_and_resumes_when_that_lease_goes():
    b = book()
    inf = b.submit(spec("inference", mem=8 * G), 0)
    b.set_busy(lease_of(b, inf), True, 1)
    train = b.submit(spec("training", mem=8 * G, batch=True), 2)
    assert [type(e) for e in events_for(b, train)] == [Queued, Granted, YieldRequested]
    b.outbox.clear()
    b.release(lease_of(b, inf), 3)
    [resumed] = yield_events(b, train)
    assert isinstance(resumed, YieldWithdrawn) and "was released" in resumed.reason


def test_a_batch_holder_ranked_above_the_busy_one_keeps_its_rate():
    b = book()
    inf = b.submit(spec("inference", prio=1, mem=8 * G), 0)
    train = b.submit(spec("urgent-training", prio=2, mem=8 * G, batch=True), 0)
    assert b.set_busy(lease_of(b, inf), True, 1) == ()
    assert yield_events(b, train) == []


def test_set_busy_refuses_unknown_batch_and_other_identities_leases():
    from service_kit.auth import Caller
    from service_kit.errors import FailedPrecondition, PermissionDenied

    b = book()
    train = b.submit(spec("training", mem=8 * G, batch=True), 0)
    with pytest.raises(NotFound):
        b.set_busy("lease-nope", True, 1)
    with pytest.raises(InvalidArgument):
        b.set_busy("", True, 1)
    with pytest.raises(FailedPrecondition, match="batch work"):
        b.set_busy(lease_of(b, train), True, 1)
    inf = b.submit(AcquireSpec(Holder("inference"), memory_bytes=8 * G, owner="svc-a"), 0)
    with pytest.raises(PermissionDenied):
        b.set_busy(lease_of(b, inf), True, 1, Caller("svc-b", "user"))


def test_a_restored_lease_is_neither_busy_nor_yielding_until_re_claimed():
    from service_kit.errors import FailedPrecondition

    b = book()
    inf = b.submit(spec("inference", mem=8 * G), 0)
    train = b.submit(spec("training", mem=8 * G, batch=True), 0)
    b.set_busy(lease_of(b, inf), True, 1)
    restarted = book()
    restarted.restore(LeaseBook.leases_from_journal(b.journal()), 2)
    leases = {x.holder.client_id: x for x in restarted.snapshot(2).leases}
    assert leases["training"].batch and not leases["inference"].busy and not leases["training"].yielding_to
    with pytest.raises(FailedPrecondition, match="re-claim"):
        restarted.set_busy(leases["inference"].lease_id, True, 3)
    assert lease_of(b, train)  # the original book is untouched
