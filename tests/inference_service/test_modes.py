"""Speed, memory and precision modes that run on a CPU host, through the real service."""
import numpy as np
import pytest

from diffusion.v1 import common_pb2 as c
from tests.inference_service.harness import decode, result_of


def settings(events):
    return {r.control: r for r in events[-1].result.resolved}


def pixels(result):
    return np.asarray(decode(result.images[0]), dtype=np.int16)


@pytest.mark.parametrize("mode", [c.SPEED_MODE_DEFAULT, c.SPEED_MODE_MAX])
def test_compiled_speed_modes_run_and_stay_close(inference_service, tiny_models, mode):
    """Also: no generation traces again after the load (the record would say `compile_trace`)."""
    _, client = inference_service
    client.load("eager", tiny_models["zimage"], speed_mode=c.SPEED_MODE_OFF)
    reference = pixels(result_of(client.generate("eager", seeds=[2])))
    events = client.load("fast", tiny_models["zimage"], speed_mode=mode)
    phases = [e.phase for e in events]
    from diffusion.v1 import inference_pb2 as pb
    assert pb.LOAD_PHASE_COMPILING in phases and pb.LOAD_PHASE_WARMING in phases
    s = settings(events)
    assert s["compile"].applied.startswith("regional (aot_eager") and s["compile"].status == c.SETTING_STATUS_APPLIED
    assert s["cudnn_benchmark"].status == c.SETTING_STATUS_UNSUPPORTED  # honest on a CPU host
    assert "compile_warmup" in s
    # the service keeps compiled graphs across processes by default, so DEFAULT compiles the decoder too (once)
    assert s["vae_decoder_compile"].applied == "on", s["vae_decoder_compile"].reason
    ahead = s["compile_ahead_of_time"]
    assert ahead.status == c.SETTING_STATUS_APPLIED and "graph(s)" in ahead.applied, (ahead.applied, ahead.reason)
    first = result_of(client.generate("fast", seeds=[2]))
    out = pixels(first)
    assert np.abs(out - reference).max() <= 3
    other_size = result_of(client.generate("fast", seeds=[2], width=96, height=64))  # one decoder graph
    assert pixels(other_size).shape == (64, 96, 3)
    # several images in one request reuse the load's graphs (the first multi-image request used to trace
    # again, holding the GPU worker); so does a non-square size after the square warm-up
    several = result_of(client.generate("fast", seeds=[2, 3, 4]))
    assert np.abs(pixels(several) - reference).max() <= 3
    for generation in (first, other_size, several):
        traced = {r.control: r for r in generation.result.resolved}.get("compile_trace")
        assert traced is None, traced.reason


def test_without_graphs_kept_across_processes_default_leaves_the_decoder_eager(tiny_models):
    """--no-aot-blocks: every process compiles the regular way, so DEFAULT does not pay a decoder compile at each
    load, and the record says the rule."""
    from service_kit.service_process import start_service
    from tests.inference_service.harness import InferenceClient

    proc = start_service("inference_service", *InferenceClient.TEST_FLAGS, "--no-aot-blocks", timeout=180)
    client = InferenceClient(proc.address)
    try:
        s = settings(client.load("m", tiny_models["zimage"], speed_mode=c.SPEED_MODE_DEFAULT))
        assert s["compile"].status == c.SETTING_STATUS_APPLIED
        assert s["vae_decoder_compile"].applied == "off" and "--no-aot-blocks" in s["vae_decoder_compile"].reason
        assert "compile_ahead_of_time" not in s
        result_of(client.generate("m", seeds=[2]))
    finally:
        client.close()
        proc.stop()


def test_flux_traces_for_several_images_at_load_not_at_the_first_such_request(inference_service, tiny_models):
    _, client = inference_service
    s = settings(client.load("flux", tiny_models["flux1"], speed_mode=c.SPEED_MODE_DEFAULT))
    assert "calls of one image and of two" in s["compile_warmup"].reason
    for seeds, width in (([2], 64), ([2, 3], 64), ([4, 5, 6], 96)):
        generation = result_of(client.generate("flux", seeds=seeds, width=width, height=64))
        traced = {r.control: r for r in generation.result.resolved}.get("compile_trace")
        assert traced is None, traced.reason


def test_backend_flags_restored_so_off_is_bit_identical_after_max(inference_service, tiny_models):
    _, client = inference_service
    client.load("m", tiny_models["zimage"], speed_mode=c.SPEED_MODE_OFF)
    before = result_of(client.generate("m", seeds=[8])).images[0].data
    client.load("m", tiny_models["zimage"], speed_mode=c.SPEED_MODE_MAX)
    client.load("m", tiny_models["zimage"], speed_mode=c.SPEED_MODE_OFF)
    assert result_of(client.generate("m", seeds=[8])).images[0].data == before


def test_int8_transformer_on_cpu(inference_service, tiny_models):
    _, client = inference_service
    client.load("dense", tiny_models["zimage"])
    reference = pixels(result_of(client.generate("dense", seeds=[2])))
    events = client.load("q", tiny_models["zimage"], transformer_precision=c.PRECISION_INT8)
    s = settings(events)
    assert s["transformer_precision"].applied == "PRECISION_INT8"
    done, total = map(int, s["transformer_quantized_layers"].applied.split(" of "))
    assert 0 < done <= total
    out = pixels(result_of(client.generate("q", seeds=[2])))
    assert not np.array_equal(out, reference) and np.abs(out - reference).mean() < 10


def test_auto_precision_on_cpu_falls_back_with_a_reason(inference_service, tiny_models):
    _, client = inference_service
    s = settings(client.load("a", tiny_models["zimage"], transformer_precision=c.PRECISION_AUTO,
                             text_encoder_precision=c.PRECISION_FP8))
    assert s["transformer_precision"].status == c.SETTING_STATUS_FELL_BACK and "CUDA" in s["transformer_precision"].reason
    assert s["text_encoder_precision"].status == c.SETTING_STATUS_FELL_BACK and s["text_encoder_precision"].reason


def test_balanced_group_offload_on_cpu_is_exact(inference_service, tiny_models):
    _, client = inference_service
    client.load("r", tiny_models["sdxl"])
    reference = result_of(client.generate("r", seeds=[4]))
    s = settings(client.load("b", tiny_models["sdxl"], memory_mode=c.MEMORY_MODE_BALANCED))
    assert s["memory_mode"].applied == "MEMORY_MODE_BALANCED" and s["vae_slicing"].applied == "on"
    assert s["vae_tiling"].applied == "off"
    assert np.array_equal(pixels(result_of(client.generate("b", seeds=[4]))), pixels(reference))
