"""step_graphs' rules, by table: when a denoiser replays CUDA graphs, what a graph is keyed on, and what a
generation's record says. The capture itself runs on CUDA only (test_gpu_modes)."""
import pytest
import torch

from diffusion_kit.resolved import Source, Status
from inference_service import step_graphs
from inference_service.step_graphs import Counts


@pytest.mark.parametrize("enabled, device, compiled, memory, applied, status", [
    (True, "cuda", True, "resident", "on", Status.APPLIED),
    (True, "cuda", False, "resident", "off", Status.APPLIED),  # speed OFF: nothing to replay, nothing refused
    (False, "cuda", True, "resident", "off", Status.APPLIED),  # the operator's --no-cuda-graphs
    (True, "cpu", True, "resident", "off", Status.UNSUPPORTED),
    (True, "cuda", True, "balanced", "off", Status.UNSUPPORTED),  # group offload moves weights every call
    (True, "cuda", True, "low_vram", "off", Status.UNSUPPORTED),
])
def test_when_the_denoiser_replays_graphs(enabled, device, compiled, memory, applied, status):
    r = step_graphs.plan(enabled=enabled, device_kind=device, compiled=compiled, memory_mode=memory)
    assert (r.control, r.applied, r.status) == ("cuda_graphs", applied, status), r.reason
    assert r.source == (Source.EXPLICIT if not enabled and compiled else Source.AUTO)
    assert r.reason


def key(*leaves):
    return step_graphs.signature(list(leaves), device_type="cpu")


def test_a_graph_is_keyed_on_each_tensors_layout_and_every_other_value():
    x = torch.zeros(2, 3)
    assert key(x, 5, None, "a") == key(torch.ones(2, 3), 5, None, "a")  # values of tensors are copied in
    different = [key(torch.zeros(3, 2), 5, None, "a"), key(torch.zeros(2, 3, dtype=torch.bfloat16), 5, None, "a"),
                 key(x.t().contiguous().t(), 5, None, "a"), key(x, 6, None, "a"), key(x, 5, True, "a"),
                 key(x, 5, None, "b"), key(x, 5.0, None, "a")]
    assert len({key(x, 5, None, "a"), *different}) == 1 + len(different)


@pytest.mark.parametrize("leaf", [
    torch.zeros(2, requires_grad=True),   # a backward would need what the graph does not keep
    torch.nn.Parameter(torch.zeros(2)),  # a subclass (quantised weights are such)
    object(),                            # an argument whose value a graph cannot fix
    [1],                                 # not flattened: the caller flattens containers first
])
def test_what_no_graph_is_captured_for(leaf):
    assert key(torch.zeros(2), leaf) is None


def test_a_tensor_on_another_device_type_gets_no_graph():
    assert step_graphs.signature([torch.zeros(2)]) is None  # CPU tensors, a CUDA graph


@pytest.mark.parametrize("counts, failed, applied, status", [
    (Counts(replayed=8, captured=1, regular=0), None, "9 of 9 denoiser calls from a graph", Status.APPLIED),
    (Counts(replayed=7, captured=1, regular=1), None, "8 of 9 denoiser calls from a graph", Status.APPLIED),
    (Counts(), None, None, None),
    (Counts(regular=9), "RuntimeError: operation not permitted when stream is capturing", "off", Status.FELL_BACK),
])
def test_what_a_generation_says_of_its_graphs(counts, failed, applied, status):
    r = step_graphs.record(counts, failed)
    if applied is None:
        assert r is None
        return
    assert (r.applied, r.status) == (applied, status)
    if failed:
        assert failed in r.reason
