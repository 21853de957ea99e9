"""The training benchmark's own decisions, which cost device time when wrong."""
import pytest

from benchmarks.training_bench import deadline_refusal


@pytest.mark.parametrize("left, slowest, refused", [
    (400, 0, ""),  # the first mode: nothing known yet
    (400, 320, ""),  # as long as the slowest job took is left
    (87, 320, "87 s of the bench's 300 s deadline were left and a job of this run took 320 s"),
    (59, 0, "the bench's 300 s deadline was reached"),
])
def test_a_mode_the_deadline_would_cut_short_is_not_started(left, slowest, refused):
    why = deadline_refusal(300, left, slowest)
    assert (refused in why) if refused else why == "", why
    assert bool(why) == bool(refused)
