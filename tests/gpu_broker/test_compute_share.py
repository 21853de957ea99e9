"""The compute-sharing rule as a table: which batch leases yield, and to which busy interactive lease."""
import pytest

from gpu_broker.compute_share import ShareView, yields


def lease(lease_id, device=0, priority=0, batch=False, busy=False):
    return ShareView(lease_id, device, priority, batch, busy)


@pytest.mark.parametrize("leases, expected", [
    ([], {}),
    # nobody busy: nobody yields
    ([lease("inf"), lease("train", batch=True)], {}),
    # a busy interactive lease on the device: the batch one yields to it
    ([lease("inf", busy=True), lease("train", batch=True)], {"train": "inf"}),
    # equal priority yields; a lower one too
    ([lease("inf", priority=5, busy=True), lease("a", priority=5, batch=True), lease("b", priority=1, batch=True)],
     {"a": "inf", "b": "inf"}),
    # a batch holder ranked above the busy one keeps its rate
    ([lease("inf", priority=0, busy=True), lease("urgent", priority=3, batch=True)], {}),
    # another device's busy lease does not count
    ([lease("inf", device=1, busy=True), lease("train", device=0, batch=True)], {}),
    # two busy ones: the higher priority is named, and decides who yields
    ([lease("low", priority=1, busy=True), lease("high", priority=4, busy=True), lease("t", priority=3, batch=True)],
     {"t": "high"}),
    # on a tie the first busy one given is named
    ([lease("first", busy=True), lease("second", busy=True), lease("t", batch=True)], {"t": "first"}),
    # a batch lease's own busy flag makes nobody yield (batch work never ranks over batch work)
    ([lease("t1", batch=True, busy=True), lease("t2", batch=True)], {}),
    # interactive leases never yield, busy or not
    ([lease("inf1", busy=True), lease("inf2")], {}),
])
def test_who_yields_to_whom(leases, expected):
    assert yields(leases) == expected
