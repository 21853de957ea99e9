"""Blocks compiled ahead of time (--aot-blocks), with inductor on the CPU: a first service compiles and saves the
tiny Z-Image's block graphs, a second process loads them without tracing and makes the same bytes; a call no
graph covers runs eagerly and is counted; a backend that cannot save graphs falls back, and remembers why; and a
compiled model's first adapter gives the blocks back to the regular compile."""
import os

import numpy as np
import pytest
import torch

from diffusion.v1 import common_pb2 as c
from diffusion.v1 import inference_pb2 as pb
from diffusion_kit.adapter_store import AdapterStore
from diffusion_kit import aot_blocks
from service_kit.service_process import start_service
from tests.inference_service.harness import InferenceClient, decode, result_of
from tests.inference_service.lora_helper import publish_random_adapter

pytestmark = pytest.mark.slow  # run first (tests/conftest.py): the workers then finish together

FLAGS = [f for f in InferenceClient.TEST_FLAGS if f not in ("--compile-backend", "aot_eager", "--compile-cache-dir",
                                                            "/tmp/diffusion-services-test-inductor")]


def record(events, control: str):
    return {r.control: r for r in events[-1].result.resolved}[control]


def pixels(generation) -> np.ndarray:
    return np.asarray(decode(generation.images[0])).astype(int)


@pytest.fixture(scope="module")
def store(tiny_models, tmp_path_factory):
    store = AdapterStore(tmp_path_factory.mktemp("adapters"))
    publish_random_adapter(store, "zimage", tiny_models["zimage"], "z-style", seed=1)
    return store


def service(cache, store, backend="inductor"):
    return start_service("inference_service", *FLAGS, "--compile-backend", backend, "--compile-cache-dir",
                         str(cache), "--aot-blocks", "--adapter-store", str(store.root), timeout=180)


def test_a_second_process_loads_the_graphs_and_makes_the_same_image(tiny_models, store, tmp_path):
    cache = tmp_path / "cache"
    first = service(cache, store)
    client = InferenceClient(first.address)
    try:
        events = client.load("z", tiny_models["zimage"], speed_mode=c.SPEED_MODE_DEFAULT)
        made = record(events, "compile_ahead_of_time")
        assert "compiled and saved" in made.applied and made.status == c.SETTING_STATUS_APPLIED
        assert "compiled and saved" in record(events, "vae_decoder_compile").reason  # inductor's decoder graph too
        compiled = result_of(client.generate("z", seeds=[3]))
        assert not [r for r in compiled.result.resolved  # no block call ran eagerly
                    if r.control == "compile_ahead_of_time" and r.status == c.SETTING_STATUS_FELL_BACK]
        client.load("z-off", tiny_models["zimage"], speed_mode=c.SPEED_MODE_OFF)
        eager = result_of(client.generate("z-off", seeds=[3]))
    finally:
        client.close()
        first.stop()
    assert any((cache / "aot-blocks").iterdir())
    metas = list((cache / "aot-blocks").glob(f"*/{aot_blocks.META}"))
    for meta in metas:  # as if last used long ago: a load marks them used (aot_blocks.prune keeps them)
        os.utime(meta, (1, 1))
    second = service(cache, store)
    client = InferenceClient(second.address)
    try:
        events = client.load("z", tiny_models["zimage"], speed_mode=c.SPEED_MODE_DEFAULT)
        loaded = record(events, "compile_ahead_of_time")
        assert "loaded from disk" in loaded.applied
        assert "1 graph(s) loaded from disk" in record(events, "vae_decoder_compile").reason
        assert metas and all(meta.stat().st_mtime > 1e9 for meta in metas)
        assert "(0 and 0 other graphs traced; 0 block calls" in record(events, "compile_warmup").reason
        again = result_of(client.generate("z", seeds=[3]))
        assert np.array_equal(pixels(again), pixels(compiled))  # the same graphs, the same pixels
        assert np.abs(pixels(again) - pixels(eager)).max() <= 2  # and within rounding of eager

        base = again
        adapted = result_of(client.generate("z", seeds=[3], adapters=[pb.AdapterRef(adapter_id="z-style", weight=1.0)]))
        hotswap = {r.control: r for r in adapted.result.resolved}["adapter_hotswap"]
        assert "hold no adapter" in hotswap.reason
        assert "compile_trace" in {r.control for r in adapted.result.resolved}  # the regular compile traced
        assert not np.array_equal(pixels(adapted), pixels(base))  # the adapter reaches the image
    finally:
        client.close()
        second.stop()



@pytest.mark.parametrize("family", ["zimage", "flux1"])
def test_quantised_blocks_are_compiled_ahead_of_time_and_loaded_too(tiny_models, store, tmp_path, family):
    """torchao's quantised weights (Int8Tensor here, Float8Tensor on CUDA) are tensor subclasses, which dynamo
    could not write to disk (it asked them for empty_like, and choked on the repr torchao binds on each layer):
    every quantised load fell back to the regular compile. Their guards are left to the folder's key now. (What
    dynamo writes is the same whatever the backend, so these use the cheaper aot_eager; inductor's quantised
    graphs kept across processes are tested on the GPU, fp8, in test_gpu_modes.py.)"""
    cache, images, said = tmp_path / "cache", [], []
    int8 = dict(speed_mode=c.SPEED_MODE_DEFAULT, transformer_precision=c.PRECISION_INT8)
    for run in range(2):
        proc = service(cache, store, "aot_eager")
        client = InferenceClient(proc.address)
        try:
            said.append(record(client.load("q", tiny_models[family], **int8), "compile_ahead_of_time"))
            made = result_of(client.generate("q", seeds=[3]))
            assert not [r for r in made.result.resolved  # no block call ran eagerly
                        if r.control == "compile_ahead_of_time" and r.status == c.SETTING_STATUS_FELL_BACK]
            images.append(pixels(made))
            if run == 0:
                client.load("q-off", tiny_models[family], transformer_precision=c.PRECISION_INT8,
                            speed_mode=c.SPEED_MODE_OFF)
                eager = pixels(result_of(client.generate("q-off", seeds=[3])))
        finally:
            client.close()
            proc.stop()
    assert "compiled and saved" in said[0].applied and said[0].status == c.SETTING_STATUS_APPLIED, said[0]
    assert "loaded from disk" in said[1].applied, said[1]
    assert np.array_equal(images[0], images[1])
    assert np.abs(images[1] - eager).max() <= 3, np.abs(images[1] - eager).max()

def _build(tiny_models, directory, backend, family="zimage"):
    from diffusion_kit.host_caps import probe_host
    from diffusion_kit.path_roots import Roots
    from inference_service import convert, pipeline_builder
    from inference_service.load_plan import EngineSettings, plan_load
    from inference_service.model_source import resolve_source

    path = tiny_models[family]
    req = convert.load_request(pb.LoadRequest(model_id="m", source=c.ModelSource(local_dir=str(path)),
                                              speed_mode=c.SPEED_MODE_DEFAULT))
    source = resolve_source(req.source, None, Roots.of([str(path.parent)], "--model-root"))
    plan = plan_load(req, source, probe_host(), EngineSettings(compile_backend=backend, warmup_resolution=64,
                                                               quant_min_features=16, aot_blocks_dir=str(directory)))
    return pipeline_builder.build(plan, lambda *_: None)


def test_a_backend_that_cannot_save_graphs_falls_back_and_remembers_why(tiny_models, tmp_path):
    from torch._dynamo import list_backends, register_backend

    from inference_service import pipeline_builder

    if "unsaveable" not in list_backends(exclude_tags=()):
        register_backend(name="unsaveable")(lambda gm, example_inputs: gm.forward)  # runs, but is no SerializableCallable
    for said in ("SerializableCallable", "an earlier load could not compile these blocks ahead of time"):
        built = _build(tiny_models, tmp_path, "unsaveable")
        try:
            fell = {r.control: r for r in built.resolved}["compile_ahead_of_time"]
            assert fell.status.name == "FELL_BACK" and fell.applied == "off" and said in fell.reason
            assert "regular regional compile" in fell.reason and built.aot is None
            assert built.plan.speed.inference_mode  # the regular compile keeps inference_mode
        finally:
            pipeline_builder.unload(built)


def test_a_call_no_graph_covers_runs_eagerly_and_is_counted(tiny_models, tmp_path):
    from inference_service import pipeline_builder

    built = _build(tiny_models, tmp_path, "aot_eager")  # guards are dynamo's, whatever the backend
    try:
        aot = built.aot
        assert aot is not None and not built.plan.speed.inference_mode and aot.take_misses() == 0
        block = aot.blocks[-1]
        captured = {}
        handle = block.register_forward_pre_hook(lambda m, a, k: captured.setdefault("in", (a, k)), with_kwargs=True)
        pipe = built.pipe
        with torch.no_grad():
            pipe(prompt="a kite", height=64, width=64, num_inference_steps=1, guidance_scale=0.0, output_type="latent")
        handle.remove()
        assert aot.take_misses() == 0  # the block's hooks run around its graph
        args, kwargs = captured["in"]
        with torch.no_grad():
            covered = block(*args, **kwargs)
        assert aot.take_misses() == 0
        with torch.inference_mode():  # inference tensors: the graphs' dispatch-key guards fail
            inference_args = [a.clone() if torch.is_tensor(a) else a for a in args]
            uncovered = block(*inference_args, **kwargs)
        assert aot.take_misses() == 1
        first = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731
        assert torch.allclose(first(covered), first(uncovered), atol=1e-4)  # eager agrees with the graph
        record = aot.miss_record(1)
        assert record.status.name == "FELL_BACK" and "ran eagerly" in record.applied
    finally:
        pipeline_builder.unload(built)


def test_true_cfg_calls_are_covered_by_the_graphs_a_fresh_compile_checks(tiny_models, tmp_path):
    """Qwen-Image's unconditional pass: the graphs compiled from the first warm-up's inputs missed some of its
    block calls (their guards failed) until the warm-up ran again on the new graphs and compiled graphs for the
    calls they missed. A generation with true CFG then runs no block eagerly."""
    from diffusion_kit.families import FAMILIES
    from inference_service import generation, pipeline_builder

    built = _build(tiny_models, tmp_path, "aot_eager", "qwen_image")  # guards are dynamo's, whatever the backend
    try:
        assert "compiled and saved" in {r.control: r for r in built.resolved}["compile_ahead_of_time"].applied
        assert "0 block calls no graph covered" in {r.control: r for r in built.resolved}["compile_warmup"].reason
        spec = generation.GenerationSpec("m", "a red kite", " ", 64, 64, 2, 4.0, (5, 6), (), "png", None, ())
        generation.run(built.pipe, FAMILIES["qwen_image"], spec, generation.RunControl(), lambda r: None,
                       lambda p: None, built.plan.speed.inference_mode)
        assert built.aot.take_misses() == 0
    finally:
        pipeline_builder.unload(built)


def test_graphs_that_cannot_be_saved_still_run_and_the_record_says_so(tiny_models, tmp_path):
    from inference_service import pipeline_builder

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    built = _build(tiny_models, blocked / "aot", "aot_eager")  # no folder can be made under a file
    try:
        record = {r.control: r for r in built.resolved}["compile_ahead_of_time"]
        assert "not saved (see the log)" in record.applied and built.aot is not None and built.aot.installed
        assert "0 block calls no graph covered" in {r.control: r for r in built.resolved}["compile_warmup"].reason
    finally:
        pipeline_builder.unload(built)


def test_the_vae_decoder_is_compiled_ahead_of_time_and_loaded_too(tiny_models, tmp_path):
    """A compiled decoder cut a 1024x1024 decode from 89 to 37 ms on the H200 but cost a minute of every load, so
    speed mode DEFAULT left it eager. With graphs kept across processes the first load compiles and saves the
    decoder's graph and later ones load it: DEFAULT decodes compiled. The loaded graph makes the same pixels.
    (aot_eager here, as what dynamo saves is the same whatever the backend; inductor's decoder graph is saved and
    loaded across processes in the first test of this file.)"""
    from diffusion_kit.host_caps import probe_host
    from diffusion_kit.path_roots import Roots
    from diffusion_kit.resolved import Status
    from inference_service import convert, generation, pipeline_builder
    from inference_service.load_plan import EngineSettings, plan_load
    from inference_service.model_source import resolve_source
    from inference_service.requests import GenerateRequest

    path, directory = tiny_models["zimage"], tmp_path / "aot"
    req = convert.load_request(pb.LoadRequest(model_id="m", source=c.ModelSource(local_dir=str(path)),
                                              speed_mode=c.SPEED_MODE_DEFAULT))
    source = resolve_source(req.source, None, Roots.of([str(path.parent)], "--model-root"))
    said, images = [], []
    for _ in range(2):  # the second build finds the first one's graphs on disk
        plan = plan_load(req, source, probe_host(), EngineSettings(
            compile_backend="aot_eager", warmup_resolution=64, quant_min_features=16, aot_blocks_dir=str(directory)))
        built = pipeline_builder.build(plan, lambda *_: None)
        try:
            records = {r.control: r for r in built.resolved}
            said.append(records["vae_decoder_compile"])
            assert records["vae_slicing"].applied == "on"  # one image per decoder call: the graph's batch
            assert built.aot_decoder is not None and built.aot_decoder.kind == "VAE decoder"
            spec = generation.parse_generate(GenerateRequest(model_id="m", prompt="a red card", width=64, height=64,
                                                             steps=2, seeds=(3,)), built.plan.family, built.limits)
            out = generation.run(built.pipe, built.plan.family, spec, generation.RunControl(), lambda _r: None,
                                 lambda _p: None, built.plan.speed.inference_mode)
            assert built.take_aot_misses() == []  # every decoder call ran a graph
            images.append(np.asarray(out.images[0]).astype(int))
        finally:
            pipeline_builder.unload(built)
    assert (said[0].applied, said[0].status) == ("on", Status.APPLIED) and "compiled and saved" in said[0].reason
    assert said[1].applied == "on" and "1 graph(s) loaded from disk" in said[1].reason, said[1]
    assert np.array_equal(images[0], images[1])
