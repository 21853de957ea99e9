"""Table tests of the pure placement policy."""
import pytest

from gpu_broker.placement import DeviceView, LeaseView, Plan, Preemption, WaiterView, plan_schedule

G = 2**30
ONE = [DeviceView(0, 24 * G)]
TWO = [DeviceView(0, 24 * G), DeviceView(1, 24 * G)]


def W(rid, prio=0, mem=0, *, dev=None, arrival=None, eff=None, pre_dev=None, victims=()):
    return WaiterView(rid, prio, prio if eff is None else eff, arrival if arrival is not None else int(rid[-1]),
                      mem, dev, pre_dev, tuple(victims))


def L(lid, dev, mem, prio=0, preempting=False):
    return LeaseView(lid, dev, mem, prio, preempting)


CASES = {
    "empty device grants exclusive": (
        ONE, [], [W("r1")],
        Plan(grants=(("r1", 0),), waiting_order=())),
    "best fit picks the tighter device": (
        TWO, [L("a", 0, 20 * G)], [W("r1", mem=2 * G)],
        Plan(grants=(("r1", 0),))),
    "two budgets share a device": (
        ONE, [], [W("r1", mem=10 * G), W("r2", mem=12 * G)],
        Plan(grants=(("r1", 0), ("r2", 0)))),
    "higher priority preempts a lower holder": (
        ONE, [L("a", 0, 24 * G, prio=1)], [W("r1", prio=5)],
        Plan(preemptions=(Preemption("r1", 0, ("a",)),), waiting_order=("r1",))),
    "equal priority waits, no preemption": (
        ONE, [L("a", 0, 24 * G, prio=5)], [W("r1", prio=5)],
        Plan(waiting_order=("r1",))),
    "preempt only when evicting makes it fit": (
        ONE, [L("low", 0, 12 * G, prio=1), L("high", 0, 12 * G, prio=9)], [W("r1", prio=5)],
        Plan(waiting_order=("r1",))),
    "fewest victims: one big rather than two small": (
        ONE, [L("s1", 0, 4 * G, prio=1), L("s2", 0, 4 * G, prio=1), L("big", 0, 16 * G, prio=2)],
        [W("r1", prio=5, mem=10 * G)],
        Plan(preemptions=(Preemption("r1", 0, ("big",)),), waiting_order=("r1",))),
    "lowest priority victim among equals in count": (
        ONE, [L("p3", 0, 12 * G, prio=3), L("p1", 0, 12 * G, prio=1)], [W("r1", prio=5, mem=12 * G)],
        Plan(preemptions=(Preemption("r1", 0, ("p1",)),), waiting_order=("r1",))),
    "needless victim is spared": (
        ONE, [L("a", 0, 8 * G, prio=1), L("b", 0, 12 * G, prio=2)], [W("r1", prio=5, mem=14 * G)],
        Plan(preemptions=(Preemption("r1", 0, ("b",)),), waiting_order=("r1",))),
    "free device beats preemption": (
        TWO, [L("a", 0, 24 * G, prio=0)], [W("r1", prio=9)],
        Plan(grants=(("r1", 1),))),
    "pinned device is honoured": (
        TWO, [L("a", 0, 24 * G, prio=0)], [W("r1", prio=9, dev=0)],
        Plan(preemptions=(Preemption("r1", 0, ("a",)),), waiting_order=("r1",))),
    "priority orders the queue": (
        ONE, [], [W("r1", prio=0, mem=20 * G), W("r2", prio=5, mem=20 * G)],
        Plan(grants=(("r2", 0),), waiting_order=("r1",))),
    "aging outranks a higher base priority": (
        ONE, [], [W("r1", prio=0, eff=6, mem=20 * G), W("r2", prio=5, mem=20 * G)],
        Plan(grants=(("r1", 0),), waiting_order=("r2",))),
    "blocked head reserves memory: no backfill past it": (
        ONE, [L("a", 0, 20 * G, prio=9)], [W("r1", prio=0, mem=10 * G), W("r2", prio=0, mem=2 * G)],
        Plan(waiting_order=("r1", "r2"))),
    "no futile eviction on a device a blocked waiter claims": (
        ONE, [L("h", 0, 12 * G, prio=10), L("low", 0, 12 * G, prio=1)], [W("r1", prio=10), W("r2", prio=5, mem=12 * G)],
        Plan(waiting_order=("r1", "r2"))),
    "preempting waiter granted once memory frees": (
        ONE, [], [W("r1", prio=5, pre_dev=0, victims=("gone",))],
        Plan(grants=(("r1", 0),))),
    "preempting waiter keeps its reservation while victims hold": (
        ONE, [L("a", 0, 20 * G, prio=1, preempting=True)],
        [W("r1", prio=5, mem=10 * G, pre_dev=0, victims=("a",)), W("r2", prio=0, mem=4 * G)],
        Plan(waiting_order=("r1", "r2"))),
    "victims of one waiter are not reused by another": (
        ONE, [L("a", 0, 24 * G, prio=1, preempting=True)],
        [W("r1", prio=5, pre_dev=0, victims=("a",)), W("r2", prio=5)],
        Plan(waiting_order=("r1", "r2"))),
    "preemption over but still no room: requeued and re-planned": (
        ONE, [L("b", 0, 24 * G, prio=1)], [W("r1", prio=5, pre_dev=0, victims=("gone",))],
        Plan(preemptions=(Preemption("r1", 0, ("b",)),), requeued=("r1",), waiting_order=("r1",))),
    "larger than the device waits forever (validation rejects it first)": (
        ONE, [], [W("r1", mem=30 * G)],
        Plan(waiting_order=("r1",))),
}


@pytest.mark.parametrize("name", CASES)
def test_plan_schedule(name):
    devices, leases, waiters, expected = CASES[name]
    assert plan_schedule(devices, leases, waiters) == expected
