"""CUDA graphs over a compiled denoiser's calls (inference_service.step_graphs), on CUDA only: in one process a
replayed call gives the very tensors the call it replays gives, and through the service a compiled model replays
every call of a repeated generation, adapters hotswapped into it included, with the pixels of a service that
runs without graphs."""
import numpy as np
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from tests.inference_service.harness import InferenceClient, decode, result_of
from tests.service_flags import MODEL_ROOTS

pytestmark = pytest.mark.gpu

COMPILED = dict(compute_precision=c.PRECISION_BF16, speed_mode=c.SPEED_MODE_DEFAULT)


def _built(family: str, pipeline_dir):
    from diffusion.v1 import inference_pb2 as ipb
    from diffusion_kit.host_caps import probe_host
    from diffusion_kit.path_roots import Roots
    from inference_service import convert, pipeline_builder
    from inference_service.load_plan import EngineSettings, plan_load
    from inference_service.model_source import resolve_source

    req = convert.load_request(ipb.LoadRequest(model_id="g", source=c.ModelSource(local_dir=str(pipeline_dir)),
                                               **COMPILED))
    source = resolve_source(req.source, None, Roots.of([str(pipeline_dir.parent)], "--model-root"))
    plan = plan_load(req, source, probe_host(), EngineSettings(warmup_resolution=64, quant_min_features=16))
    assert plan.cuda_graphs
    return pipeline_builder.build(plan, lambda *_: None)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", ["zimage", "flux1"])
def test_a_replayed_call_gives_the_tensors_of_the_call_it_replays(tiny_models, family):
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    from benchmarks.denoise_profile import capture_first_step
    from inference_service import pipeline_builder

    built = _built(family, tiny_models[family])
    try:
        graphs = built.graphs
        denoiser = getattr(built.pipe, built.plan.family.denoiser)
        (args, kwargs), *_ = capture_first_step(built.pipe, built.plan.family, 64)
        other_args, other_kwargs = tree_map(lambda t: t * 1.5 if torch.is_tensor(t) and t.is_floating_point() else t,
                                            (args, kwargs))
        leaves = lambda out: [t for t in tree_flatten(out)[0] if torch.is_tensor(t)]  # noqa: E731
        with torch.inference_mode():
            expected, other_expected = (leaves(graphs.forward(*a, **k))
                                        for a, k in ((args, kwargs), (other_args, other_kwargs)))
            graphs.take()
            runs = [leaves(denoiser(*args, **kwargs)) for _ in range(3)]
            counts = graphs.take()
            other = leaves(denoiser(*other_args, **other_kwargs))
            assert graphs.take().replayed == 1
        assert graphs.failed is None
        assert counts.replayed >= 1 and counts.replayed + counts.captured + counts.regular == 3, counts
        for run in runs:
            assert all(torch.equal(a, b) for a, b in zip(run, expected, strict=True))
        # The next replay wrote new results into the graph's outputs; the earlier calls kept their own.
        assert all(torch.equal(a, b) for a, b in zip(other, other_expected, strict=True))
        assert not all(torch.equal(a, b) for a, b in zip(other, runs[-1]))
        assert all(torch.equal(a, b) for a, b in zip(runs[-1], expected))
    finally:
        pipeline_builder.unload(built)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", ["zimage", "flux1"])
def test_a_compiled_model_replays_its_calls_adapters_included(tiny_models, tmp_path, family):
    from diffusion_kit.adapter_store import AdapterStore
    from service_kit.service_process import start_service
    from tests.inference_service.lora_helper import publish_random_adapter

    store = AdapterStore(tmp_path / "adapters")
    for i, name in enumerate(("one", "two")):
        publish_random_adapter(store, family, tiny_models[family], name, seed=i + 1)
    runs = [(), (), [("one", 1.0)], [("one", 1.0)], [("two", 1.0)], [("two", 0.5)], [("two", 0.0)]]
    images, said = {}, {}
    for graphs in (True, False):
        proc = start_service("inference_service", "--quant-min-features", "16", "--warmup-resolution", "64",
                             "--compile-cache-dir", str(tmp_path / "cache"), "--adapter-store", str(store.root),
                             "--cuda-graphs" if graphs else "--no-cuda-graphs", *MODEL_ROOTS, timeout=300)
        client = InferenceClient(proc.address)
        try:
            loaded = {r.control: r for r in client.load("m", tiny_models[family], **COMPILED)[-1].result.resolved}
            assert loaded["cuda_graphs"].applied == ("on" if graphs else "off"), loaded["cuda_graphs"].reason
            out = []
            for adapters in runs:
                refs = [pb.AdapterRef(adapter_id=a, weight=w) for a, w in adapters]
                generation = result_of(client.generate("m", seeds=[5], steps=4, adapters=refs))
                out.append(np.asarray(decode(generation.images[0]), dtype=np.int16))
                said.setdefault(graphs, []).append({r.control: r.applied for r in generation.resolved}
                                                   .get("cuda_graphs"))
            images[graphs] = out
        finally:
            client.close()
            proc.stop()
    # a repeated generation, a second one with the first adapter, and those after a hotswap or a new weight
    # (written in place, where the graphs read them) replay every call
    for i in (1, 3, 4, 5, 6):
        assert said[True][i] == "4 of 4 denoiser calls from a graph", (i, said[True])
    assert set(said[False]) == {"off"}  # the model's record: no generation adds one
    assert not np.array_equal(images[True][0], images[True][2])  # the adapter changed the image
    assert not np.array_equal(images[True][4], images[True][5])  # and so did its weight
    # Two CUDA processes differ by a few levels (each picks its own cuDNN and cuBLAS algorithms, and a capture
    # runs on its own stream and workspace), so the pixels alone cannot tell a stale adapter from that noise on
    # a tiny model. What can: each image from the graphs is nearest to the image without graphs of the same
    # adapters and weight, never to one of another state (which a stale adapter or weight would give).
    state = [tuple((a, w) for a, w in adapters if w) for adapters in runs]
    for i, with_graphs in enumerate(images[True]):
        distance = [np.abs(with_graphs - without).mean() for without in images[False]]
        nearest = min(range(len(runs)), key=distance.__getitem__)
        assert state[nearest] == state[i], (i, nearest, [round(float(d), 3) for d in distance])
        assert np.abs(with_graphs - images[False][i]).max() <= 4 and distance[i] < 0.5, (i, distance[i])


def test_a_capture_that_fails_turns_graphs_off_and_leaves_the_device_usable():
    """A denoiser that syncs with the host cannot be captured: its call runs as usual, the graphs say why they
    are off, and the device's random generator still works (before step_graphs released it, a compile after a
    failed capture failed with "Offset increment outside graph capture" in the int8-default GPU case)."""
    import torch

    from inference_service.step_graphs import StepGraphs

    class Syncs(torch.nn.Module):
        def forward(self, x):
            return x * float(x.sum().item())  # a host sync: not allowed while capturing

    module = Syncs()
    graphs = StepGraphs(module)
    graphs.install()
    x = torch.ones(4, device="cuda")
    with torch.inference_mode():
        outs = [module(x) for _ in range(3)]
    assert graphs.failed is not None and "captur" in graphs.failed.lower(), graphs.failed
    assert all(torch.equal(o, torch.full((4,), 4.0, device="cuda")) for o in outs)
    assert graphs.take().regular == 3
    torch.randn(8, device="cuda")  # the generator a failed capture left capturing
    torch.cuda.synchronize()
