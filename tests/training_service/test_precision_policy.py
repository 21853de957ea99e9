"""Table tests of the training precision policy: per probe combination, with HostCaps built by hand."""
from dataclasses import replace

import pytest

from diffusion.v1 import common_pb2 as c
from diffusion_kit.families import FAMILIES
from diffusion_kit.precision import Precision
from service_kit.errors import FailedPrecondition, InvalidArgument, ServiceError
from tests.training_service.hosts import A100, B200, CPU, H200, H200_NO_BNB, H200_STUB_AO, T4
from training_service.precision_policy import GiB, StepShape, advertised, auto_pick, check_fits, resolve, training_bytes

P = Precision
Z, FLUX, QWEN, SDXL = (FAMILIES[k] for k in ("zimage", "flux1", "qwen_image", "sdxl"))


@pytest.mark.parametrize("caps, family, modes", [
    (H200, FLUX, [P.AUTO, P.NF4, P.BF16, P.INT8, P.FP8]),
    (H200, QWEN, [P.AUTO, P.NF4, P.BF16, P.INT8]),  # no fp8 for Qwen-Image
    (A100, Z, [P.AUTO, P.NF4, P.BF16, P.INT8]),  # no fp8 below 8.9
    (B200, Z, [P.AUTO, P.NF4, P.BF16, P.INT8, P.FP8,
               P.MXFP8]),
    (H200_STUB_AO, FLUX, [P.AUTO, P.NF4, P.BF16]),  # a stub torchao: no int8/fp8
    (H200_NO_BNB, FLUX, [P.AUTO, P.BF16, P.INT8, P.FP8]),
    (T4, FLUX, []),  # emulated bf16: the DiT trainer cannot run at all
    (CPU, FLUX, [P.FP32]),
    (H200, SDXL, []),  # SDXL ignores base_precision
])
def test_advertised_modes(caps, family, modes):
    assert advertised(caps, family) == modes


@pytest.mark.parametrize("caps", [H200, A100, B200, H200_STUB_AO, H200_NO_BNB, T4, CPU])
@pytest.mark.parametrize("family", list(FAMILIES.values()), ids=list(FAMILIES))
def test_never_advertise_what_start_rejects(caps, family):
    for mode in advertised(caps, family):
        resolve(mode, caps, family, caps.free_bytes)  # must not raise
    for mode in (P.NF4, P.BF16, P.INT8, P.FP8, P.MXFP8):
        if mode not in advertised(caps, family) and not family.is_unet:
            with pytest.raises(ServiceError):
                resolve(mode, caps, family, caps.free_bytes)


@pytest.mark.parametrize("family, free_gib, expected", [
    (FLUX, 139, P.BF16),
    (FLUX, 30, P.INT8),   # bf16 needs ~37 GiB with headroom; int8 ~27 (its bf16 load)
    (FLUX, 16, P.NF4),
    (Z, 139, P.BF16),
    (Z, 32, P.INT8),   # bf16 needs ~38 GiB with headroom; int8 ~32
    (Z, 10, P.NF4),
])
def test_auto_bands(family, free_gib, expected):
    assert auto_pick(H200, family, free_gib * GiB).precision == expected


def test_auto_never_picks_fp8_and_skips_int8_without_torchao():
    assert auto_pick(B200, FLUX, 1000 * GiB).precision == P.BF16
    assert auto_pick(H200_STUB_AO, FLUX, 30 * GiB).precision == P.NF4
    assert auto_pick(H200, FLUX, 1000 * GiB, prequantized=True).precision == P.NF4


@pytest.mark.parametrize("requested, caps, family, applied, source", [
    (P.UNSPECIFIED, H200, FLUX, "PRECISION_NF4", c.SETTING_SOURCE_DEFAULT),
    (P.AUTO, H200, FLUX, "PRECISION_BF16", c.SETTING_SOURCE_AUTO),
    (P.FP8, H200, Z, "PRECISION_FP8", c.SETTING_SOURCE_EXPLICIT),
    (P.AUTO, CPU, Z, "PRECISION_FP32", c.SETTING_SOURCE_AUTO),
    # The default, NF4, needs CUDA: on a CPU the default falls back to fp32, and the record says so.
    (P.UNSPECIFIED, CPU, QWEN, "PRECISION_FP32", c.SETTING_SOURCE_DEFAULT),
    (P.FP8, H200, SDXL, "PRECISION_BF16", c.SETTING_SOURCE_AUTO),  # ignored, never fails SDXL
    (P.UNSPECIFIED, CPU, SDXL, "PRECISION_FP32", c.SETTING_SOURCE_AUTO),
])
def test_resolve(requested, caps, family, applied, source):
    _, record = resolve(requested, caps, family, caps.free_bytes)
    assert (record.applied, record.source.value) == (applied, source)
    fell_back = requested == P.UNSPECIFIED and caps is CPU and not family.is_unet
    assert (record.status.value == c.SETTING_STATUS_FELL_BACK) is fell_back, record


@pytest.mark.parametrize("requested, caps, family, error, text", [
    (P.FP8, H200, QWEN, FailedPrecondition, "not allowed for Qwen-Image"),
    (P.MXFP8, H200, FLUX, FailedPrecondition, "Blackwell"),
    (P.INT8, H200_STUB_AO, FLUX, FailedPrecondition, "functional torchao"),
    (P.NF4, CPU, FLUX, FailedPrecondition, "CUDA"),
    (P.BF16, T4, FLUX, FailedPrecondition, "native bf16"),
    (P.NF4, T4, Z, FailedPrecondition, "native bf16"),
    (P.NVFP4, H200, FLUX, InvalidArgument, "base_precision takes"),
    (P.NVFP4, H200, SDXL, InvalidArgument, "base_precision takes"),  # a mode it never takes fails SDXL too
])
def test_resolve_rejections(requested, caps, family, error, text):
    with pytest.raises(error, match=text):
        resolve(requested, caps, family, caps.free_bytes)


def test_prequantized_base_accepts_only_nf4():
    assert resolve(P.AUTO, H200, FLUX, 139 * GiB, prequantized=True)[1].applied == "PRECISION_NF4"
    with pytest.raises(InvalidArgument, match="black-forest-labs/FLUX.1-dev"):
        resolve(P.BF16, H200, FLUX, 139 * GiB, prequantized=True)


# The measured step peaks (docs/bench/training.md, H200, eager, batch 1): the estimate must cover each,
# and not by so much that AUTO gives away a band it would fit in.
@pytest.mark.parametrize("family, precision, measured_gib", [
    (Z, P.NF4, 21.4), (Z, P.BF16, 31.4), (Z, P.INT8, 25.7), (Z, P.FP8, 34.3),
    (FLUX, P.NF4, 17.7), (FLUX, P.BF16, 30.5), (FLUX, P.INT8, 21.1),
    (FLUX, P.FP8, 33.2),
])
def test_estimates_cover_the_measured_peaks(family, precision, measured_gib):
    estimate = training_bytes(family, precision) / GiB
    assert measured_gib - 0.2 <= estimate <= measured_gib * 1.2


@pytest.mark.parametrize("shape, ratio", [
    (StepShape(768, 1), 1.0),
    (StepShape(1536, 1), 4.0),   # four times the image tokens
    (StepShape(768, 3), 3.0),
    (StepShape(768, 2, checkpointing=True), 0.5),
    (StepShape(768, 1, checkpointing=True, checkpoint_interval=2), 0.625),  # half the calls keep a quarter
    (StepShape(768, 1, checkpointing=True, checkpoint_interval=4), 0.8125),
    (StepShape(768, 1, checkpoint_interval=4), 1.0),  # no checkpointing: the interval means nothing
])
def test_activations_scale_with_tokens_batch_and_checkpointing(shape, ratio):
    weights = Z.denoiser_bytes  # the bf16 base
    activations = training_bytes(Z, P.BF16, shape=StepShape(768)) - weights
    assert training_bytes(Z, P.BF16, shape=shape) - weights == pytest.approx(activations * ratio, rel=1e-6)


def test_a_tiny_model_needs_little():
    assert training_bytes(FLUX, P.BF16, denoiser_params=2_000_000) < 0.01 * GiB


def test_auto_follows_the_shape():
    assert auto_pick(H200, Z, 139 * GiB).precision == P.BF16
    assert auto_pick(H200, Z, 139 * GiB, shape=StepShape(1536, 2)).precision == P.NF4


@pytest.mark.parametrize("precision, shape, advice", [
    (P.BF16, StepShape(2048, 4), ["a resolution below 2048", "batch_size 2 with twice the gradient_accum",
                                             "gradient_checkpointing=true", "base_precision PRECISION_NF4"]),
    (P.NF4, StepShape(4096, 1, checkpointing=True), ["a resolution below 4096"]),
    (P.NF4, StepShape(4096, 1, checkpointing=True, checkpoint_interval=8),
     ["gradient_checkpointing_interval 1 (every block checkpointed)", "a resolution below 4096"]),
])
def test_a_job_larger_than_the_whole_gpu_is_refused_with_what_to_change(precision, shape, advice):
    with pytest.raises(FailedPrecondition) as e:
        check_fits(H200, Z, precision, None, shape)
    assert e.value.reason == "NEVER_FITS"
    for idea in advice:
        assert idea in str(e.value)
    if precision == P.NF4:  # nothing to suggest that the job already does
        assert "gradient_checkpointing=true" not in str(e.value) and "base_precision" not in str(e.value)
    if shape.checkpoint_interval == 1:
        assert "gradient_checkpointing_interval" not in str(e.value)


def test_what_fits_returns_its_estimate_and_a_cpu_host_is_not_judged():
    assert check_fits(H200, FLUX, P.BF16, None, StepShape(512)) == training_bytes(FLUX, P.BF16)
    assert check_fits(CPU, FLUX, P.FP32, None, StepShape(4096, 8)) > CPU.total_bytes


def test_a_trainers_lease_covers_its_context_and_the_allocators_margin():
    """On an H200 a bf16 Z-Image job used 33.5 GiB under a 31.4 GiB lease (its estimate alone)."""
    from training_service.precision_policy import lease_bytes

    need = training_bytes(Z, P.BF16, shape=StepShape(768))
    assert lease_bytes(need, H200) == int(need * 1.1) + GiB
    assert lease_bytes(need, CPU) == need  # no device, no context


def test_host_caps_travel_from_the_probe_child_as_json():
    from diffusion_kit.host_caps import caps_from_json, caps_to_json

    caps = replace(H200, quant_schemes=frozenset({"int8", "fp8"}), quant_failures={"mxfp8": "Blackwell only"})
    assert caps_from_json(caps_to_json(caps)) == caps
