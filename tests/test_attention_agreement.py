"""The attention agreement bench's pure parts: which steps' times are warm, and how a variant names its pin and
whether it runs under CUDA graphs. (The bench itself trains two full jobs: run by hand, `--tiny` on a CPU.)"""
import pytest

from benchmarks.attention_agreement import pin_and_graphs, step_kinds


@pytest.mark.parametrize("steps, kinds", [
    ([], []),
    ([(0, "64x64")], ["first_in_bucket"]),
    # a second example in a known bucket is a new sequence; an example seen before is warm, in any bucket order
    ([(0, "64x64"), (3, "64x64"), (0, "64x64"), (1, "80x48"), (3, "64x64"), (4, "80x48"), (1, "80x48")],
     ["first_in_bucket", "new_sequence", "warm", "first_in_bucket", "warm", "new_sequence", "warm"]),
    # the same example twice in a row: the second is warm
    ([(2, "48x80"), (2, "48x80")], ["first_in_bucket", "warm"]),
])
def test_step_kinds(steps, kinds):
    assert step_kinds(steps) == kinds


@pytest.mark.parametrize("variant, expected", [
    ("cudnn,flash,efficient", (["cudnn", "flash", "efficient"], False)),
    ("flash,efficient+graphs", (["flash", "efficient"], True)),
    ("+graphs", ([], True)),
    ("", ([], False)),
    ("graphs", (["graphs"], False)),  # only the suffix turns graphs on; an unknown kernel is the policy's error
])
def test_pin_and_graphs(variant, expected):
    assert pin_and_graphs(variant) == expected
