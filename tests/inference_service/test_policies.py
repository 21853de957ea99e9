"""Table tests of the pure inference policies, with HostCaps built by hand (no torch device needed)."""
import pytest

from diffusion.v1 import common_pb2 as c
from diffusion_kit.dtype_policy import resolve_compute_dtype
from diffusion_kit.families import FAMILIES
from diffusion_kit.host_caps import HostCaps, native_bf16
from diffusion_kit.precision import Precision
from diffusion_kit.quant_probe import is_consumer_gpu, per_sample_config, scheme_config
from diffusion_kit.resolved import Status
from inference_service.capabilities import family_capabilities
from inference_service.memory_plan import GiB, plan_memory
from inference_service.quant_policy import resolve_quant
from inference_service.speed_plan import asks_for_compile, compile_options, plan_speed, vae_decoder_compile
from service_kit.errors import FailedPrecondition, InvalidArgument, ResourceExhausted

H200 = HostCaps("cuda", "NVIDIA H200", 141 * GiB, 139 * GiB, (9, 0), native_bf16=True, torchao=True,
                quant_schemes=frozenset({"int8", "fp8"}), bitsandbytes=True,
                quant_failures={"mxfp8": "mxfp8 needs a Blackwell GPU", "nvfp4": "nvfp4 needs a Blackwell GPU"})
T4 = HostCaps("cuda", "Tesla T4", 16 * GiB, 15 * GiB, (7, 5), native_bf16=False, torchao=True,
              quant_schemes=frozenset({"int8"}), quant_failures={"fp8": "fp8 needs 8.9+"})
A100_NO_AO = HostCaps("cuda", "NVIDIA A100", 80 * GiB, 79 * GiB, (8, 0), native_bf16=True, torchao=False,
                      torchao_reason="torchao does not import")
CPU = HostCaps("cpu", "CPU", 24 * GiB, 22 * GiB, torchao=True, quant_schemes=frozenset({"int8"}),
               quant_failures={"fp8": "fp8 needs an NVIDIA GPU"}, bitsandbytes_reason="bitsandbytes needs CUDA")
MPS = HostCaps("mps", "Apple MPS", 64 * GiB, 64 * GiB, native_bf16=False)
Z, FLUX, QWEN, SDXL = (FAMILIES[k] for k in ("zimage", "flux1", "qwen_image", "sdxl"))


@pytest.mark.parametrize("requested, caps, family, dtype, status", [
    (c.PRECISION_AUTO, H200, FLUX, "bf16", Status.APPLIED),
    (c.PRECISION_UNSPECIFIED, H200, Z, "bf16", Status.APPLIED),
    (c.PRECISION_AUTO, T4, FLUX, "fp16", Status.APPLIED),
    (c.PRECISION_AUTO, T4, Z, "fp32", Status.APPLIED),  # fp16-incompatible family promoted
    (c.PRECISION_AUTO, MPS, FLUX, "fp32", Status.APPLIED),  # MPS never fp16
    (c.PRECISION_AUTO, CPU, SDXL, "fp32", Status.APPLIED),
    (c.PRECISION_FP16, H200, Z, "fp32", Status.FELL_BACK),
    (c.PRECISION_FP16, H200, FLUX, "fp16", Status.APPLIED),
    (c.PRECISION_FP16, CPU, FLUX, "fp32", Status.FELL_BACK),
    (c.PRECISION_BF16, CPU, FLUX, "bf16", Status.APPLIED),
    (c.PRECISION_FP32, T4, QWEN, "fp32", Status.APPLIED),
])
def test_compute_dtype(requested, caps, family, dtype, status):
    got, record = resolve_compute_dtype(Precision.of_proto(requested), caps, family)
    assert (got, record.status) == (dtype, status)
    assert record.reason or status is Status.APPLIED


@pytest.mark.parametrize("requested, caps, error", [
    (c.PRECISION_BF16, T4, FailedPrecondition),  # emulated bf16 is not native
    (c.PRECISION_NF4, H200, InvalidArgument),
])
def test_compute_dtype_rejections(requested, caps, error):
    with pytest.raises(error):
        resolve_compute_dtype(Precision.of_proto(requested), caps, FLUX)


@pytest.mark.parametrize("kind, cap, rocm, expected", [
    ("cuda", (7, 5), False, False), ("cuda", (8, 0), False, True), ("cuda", (9, 0), False, True),
    ("rocm", None, True, True), ("cpu", None, False, False), ("mps", None, False, True),
])
def test_native_bf16_is_by_capability(kind, cap, rocm, expected):
    assert native_bf16(kind, cap, rocm) is expected


@pytest.mark.parametrize("name, consumer", [
    ("NVIDIA H200", False), ("NVIDIA A40", False), ("NVIDIA RTX A4000", True), ("NVIDIA GeForce RTX 4090", True),
    ("NVIDIA B200", False), ("Some Future GPU", True),
])
def test_consumer_gpu_detection(name, consumer):
    assert is_consumer_gpu(name) is consumer


@pytest.mark.parametrize("requested, caps, family, compiled, scheme, status, says", [
    (c.PRECISION_UNSPECIFIED, H200, FLUX, True, None, Status.APPLIED, ""),
    (c.PRECISION_AUTO, H200, FLUX, True, "fp8", Status.APPLIED, "smoke probe"),
    (c.PRECISION_AUTO, H200, QWEN, True, "int8", Status.APPLIED, ""),  # fp8 denied for Qwen-Image
    (c.PRECISION_AUTO, T4, FLUX, True, "int8", Status.APPLIED, ""),
    (c.PRECISION_AUTO, A100_NO_AO, FLUX, True, None, Status.FELL_BACK, ""),
    (c.PRECISION_AUTO, CPU, FLUX, True, None, Status.FELL_BACK, "no CUDA"),
    # Uncompiled, quantised matmuls are slower than dense: AUTO stays dense, an explicit scheme is told so.
    (c.PRECISION_AUTO, H200, FLUX, False, None, Status.APPLIED, "SPEED_MODE_DEFAULT"),
    (c.PRECISION_AUTO, T4, FLUX, False, None, Status.APPLIED, "uncompiled"),
    (c.PRECISION_INT8, H200, FLUX, False, "int8", Status.APPLIED, "slower than dense"),
    (c.PRECISION_FP8, H200, Z, True, "fp8", Status.APPLIED, ""),
    (c.PRECISION_INT8, CPU, Z, False, "int8", Status.APPLIED, ""),
    (c.PRECISION_NF4, H200, FLUX, False, "nf4", Status.APPLIED, ""),
])
def test_transformer_quant(requested, caps, family, compiled, scheme, status, says):
    choice = resolve_quant(Precision.of_proto(requested), Precision.UNSPECIFIED, None, caps, family, compiled=compiled)
    assert (choice.transformer, choice.resolved[0].status) == (scheme, status)
    assert says in choice.resolved[0].reason
    if not says and requested != c.PRECISION_AUTO:
        assert "uncompiled" not in choice.resolved[0].reason


@pytest.mark.parametrize("requested, caps, family, error, text", [
    (c.PRECISION_FP8, H200, QWEN, InvalidArgument, "not allowed for Qwen-Image"),
    (c.PRECISION_FP8, CPU, FLUX, FailedPrecondition, "fp8"),
    (c.PRECISION_MXFP8, H200, FLUX, FailedPrecondition, "Blackwell"),
    (c.PRECISION_NVFP4, H200, FLUX, FailedPrecondition, "Blackwell"),
    (c.PRECISION_NF4, CPU, FLUX, FailedPrecondition, "bitsandbytes"),
    (c.PRECISION_INT8, A100_NO_AO, FLUX, FailedPrecondition, "PRECISION_INT8"),
    (c.PRECISION_BF16, H200, FLUX, InvalidArgument, "compute_precision"),
])
def test_transformer_quant_rejections(requested, caps, family, error, text):
    with pytest.raises(error, match=text):
        resolve_quant(Precision.of_proto(requested), Precision.UNSPECIFIED, None, caps, family, compiled=True)


@pytest.mark.parametrize("scheme, device_kind, compiled, config, per_sample", [
    ("int8", "cuda", True, "Int8DynamicActivationInt8WeightConfig", "Int8WeightOnlyConfig"),
    # Uncompiled, torchao's dynamic int8 matmul syncs the GPU per call (repr() of its input): weight-only.
    ("int8", "cuda", False, "Int8WeightOnlyConfig", None),
    ("int8", "cpu", True, "Int8WeightOnlyConfig", None),
    ("fp8", "cuda", True, "Float8DynamicActivationFloat8WeightConfig", None),
    ("fp8", "cuda", False, "Float8DynamicActivationFloat8WeightConfig", None),
])
def test_scheme_configs(scheme, device_kind, compiled, config, per_sample):
    assert type(scheme_config(scheme, device_kind=device_kind, compiled=compiled)).__name__ == config
    found = per_sample_config(scheme, device_kind=device_kind, compiled=compiled)
    assert (type(found).__name__ if found is not None else None) == per_sample


def test_fp8_fast_accumulate_by_gpu_class_and_override():
    auto = resolve_quant(Precision.FP8, Precision.UNSPECIFIED, None, H200, FLUX, compiled=True)
    assert auto.fp8_fast_accum is False and auto.resolved[-1].control == "fp8_fast_accumulate"
    forced = resolve_quant(Precision.FP8, Precision.UNSPECIFIED, True, H200, FLUX, compiled=True)
    assert forced.fp8_fast_accum is True


@pytest.mark.parametrize("requested, caps, scheme, status", [
    (c.PRECISION_FP8, H200, "fp8", Status.APPLIED),
    (c.PRECISION_NVFP4, H200, "fp8", Status.FELL_BACK),
    (c.PRECISION_FP8, CPU, None, Status.FELL_BACK),
    (c.PRECISION_NVFP4, T4, None, Status.FELL_BACK),
])
def test_text_encoder_quant_is_best_effort(requested, caps, scheme, status):
    choice = resolve_quant(Precision.UNSPECIFIED, Precision.of_proto(requested), None, caps, FLUX, compiled=False)
    assert (choice.text_encoder, choice.resolved[1].status) == (scheme, status)


@pytest.mark.parametrize("requested, kind, free, footprint, largest, mode, slicing, tiling", [
    (c.MEMORY_MODE_AUTO, "cuda", 139 * GiB, 33 * GiB, 24 * GiB, "resident", False, False),
    (c.MEMORY_MODE_AUTO, "cuda", 24 * GiB, 33 * GiB, 24 * GiB, "balanced", True, False),
    (c.MEMORY_MODE_AUTO, "cuda", 9 * GiB, 40 * GiB, 30 * GiB, "sequential", True, True),
    (c.MEMORY_MODE_AUTO, "cuda", 20 * GiB, 60 * GiB, 15 * GiB, "balanced", True, False),
    (c.MEMORY_MODE_UNSPECIFIED, "cpu", 20 * GiB, 8 * GiB, 6 * GiB, "resident", False, False),
    (c.MEMORY_MODE_BALANCED, "cpu", 20 * GiB, 8 * GiB, 6 * GiB, "balanced", True, False),
    (c.MEMORY_MODE_LOW_VRAM, "cuda", 10 * GiB, 33 * GiB, 4 * GiB, "low_vram", True, True),
])
def test_memory_plan(requested, kind, free, footprint, largest, mode, slicing, tiling):
    plan = plan_memory(requested, device_kind=kind, free_bytes=free, total_bytes=141 * GiB, footprint_bytes=footprint,
                       largest_component_bytes=largest)
    assert (plan.mode, plan.vae_slicing, plan.vae_tiling) == (mode, slicing, tiling)
    assert plan.resolved[0].control == "memory_mode" and plan.device_bytes > 0


@pytest.mark.parametrize("requested, kind, total, error", [
    (c.MEMORY_MODE_LOW_VRAM, "cpu", 24 * GiB, FailedPrecondition),
    (c.MEMORY_MODE_SEQUENTIAL, "cpu", 24 * GiB, FailedPrecondition),
    (c.MEMORY_MODE_RESIDENT, "cuda", 24 * GiB, ResourceExhausted),
])
def test_memory_plan_rejections(requested, kind, total, error):
    with pytest.raises(error):
        plan_memory(requested, device_kind=kind, free_bytes=total, total_bytes=total, footprint_bytes=33 * GiB,
                    largest_component_bytes=24 * GiB)


# Resident Z-Image at 1024px on an H200 (docs/bench/lease_usage.jsonl): the plan's weight estimate, the compute
# dtype, and the peak NVML saw. An fp32 pipeline used 49.1 GiB under a lease that had a 16-bit headroom (48.0).
@pytest.mark.parametrize("weights_gib, compute_bits, used_gib", [(19.1, 16, 25.26), (38.2, 32, 49.09)])
def test_resident_lease_covers_the_measured_peak(weights_gib, compute_bits, used_gib):
    plan = plan_memory(c.MEMORY_MODE_RESIDENT, device_kind="cuda", free_bytes=139 * GiB, total_bytes=141 * GiB,
                       footprint_bytes=int(weights_gib * GiB), largest_component_bytes=int(weights_gib * GiB * 0.6),
                       compute_bits=compute_bits)
    assert used_gib * GiB <= plan.device_bytes <= 1.15 * used_gib * GiB


# Balanced (group offload) at 1024px on an H200: the largest component's estimate and the peak NVML saw.
@pytest.mark.parametrize("family, largest_gib, used_gib", [("zimage", 11.5, 5.12), ("flux1", 22.2, 15.21)])
def test_balanced_lease_covers_the_measured_peak(family, largest_gib, used_gib):
    plan = plan_memory(c.MEMORY_MODE_BALANCED, device_kind="cuda", free_bytes=139 * GiB, total_bytes=141 * GiB,
                       footprint_bytes=int(1.5 * largest_gib * GiB), largest_component_bytes=int(largest_gib * GiB))
    assert plan.device_bytes >= used_gib * GiB, family


def test_nothing_fits_is_resource_exhausted():
    with pytest.raises(ResourceExhausted, match="sequential"):
        plan_memory(c.MEMORY_MODE_AUTO, device_kind="cuda", free_bytes=2 * GiB, total_bytes=16 * GiB,
                    footprint_bytes=33 * GiB, largest_component_bytes=24 * GiB)


@pytest.mark.parametrize("requested, kind, quant, memory, compile_, tf32, fuse", [
    (c.SPEED_MODE_UNSPECIFIED, "cuda", None, "resident", False, False, False),
    (c.SPEED_MODE_OFF, "cuda", None, "resident", False, False, False),
    (c.SPEED_MODE_DEFAULT, "cuda", None, "resident", True, False, False),
    (c.SPEED_MODE_MAX, "cuda", None, "resident", True, True, True),
    (c.SPEED_MODE_MAX, "cuda", "fp8", "resident", True, True, False),
    (c.SPEED_MODE_DEFAULT, "cuda", "nf4", "resident", False, False, False),
    (c.SPEED_MODE_DEFAULT, "cuda", None, "low_vram", False, False, False),
    (c.SPEED_MODE_MAX, "cpu", None, "resident", True, False, True),
    # offload moves the fused projection and the separate ones (qkv_fusion keeps both as modules)
    (c.SPEED_MODE_MAX, "cuda", None, "low_vram", False, True, False),
    (c.SPEED_MODE_MAX, "cuda", None, "balanced", True, True, False),
])
def test_speed_plan(requested, kind, quant, memory, compile_, tf32, fuse):
    plan = plan_speed(requested, device_kind=kind, transformer_quant=quant, memory_mode=memory,
                      compile_backend="inductor")
    assert (plan.compile, plan.tf32, plan.fuse_qkv) == (compile_, tf32, fuse)
    for record in plan.resolved:
        assert record.status is Status.APPLIED or record.reason


@pytest.mark.parametrize("requested, kind, quant, backend, options", [
    (c.SPEED_MODE_DEFAULT, "cuda", None, "inductor", {}),
    (c.SPEED_MODE_MAX, "cuda", None, "inductor", {"max_autotune": True, "coordinate_descent_tuning": True}),
    (c.SPEED_MODE_DEFAULT, "cuda", "int8", "inductor", {"force_fuse_int_mm_with_mul": True}),
    (c.SPEED_MODE_MAX, "cuda", "int8", "inductor",
     {"max_autotune": True, "coordinate_descent_tuning": True, "force_fuse_int_mm_with_mul": True}),
    (c.SPEED_MODE_DEFAULT, "cuda", "fp8", "inductor", {}),
    (c.SPEED_MODE_DEFAULT, "cpu", "int8", "inductor", {}),  # weight-only int8 on the CPU: no int8 matmul
    (c.SPEED_MODE_MAX, "cuda", "int8", "aot_eager", {}),  # options are inductor's alone
    (c.SPEED_MODE_OFF, "cuda", "int8", "inductor", {}),
])
def test_compile_options_are_per_compile(requested, kind, quant, backend, options):
    plan = plan_speed(requested, device_kind=kind, transformer_quant=quant, memory_mode="resident",
                      compile_backend=backend)
    assert plan.compile_options == options
    if plan.compile:
        assert all(name in next(r for r in plan.resolved if r.control == "compile").applied for name in options)


def test_max_options_are_torchs_max_autotune_no_cudagraphs():
    import torch

    assert compile_options("max", compile_backend="inductor", int8_dynamic=False) == \
        torch._inductor.list_mode_options("max-autotune-no-cudagraphs")


@pytest.mark.parametrize("caps", [H200, T4, A100_NO_AO, CPU, MPS])
@pytest.mark.parametrize("family", list(FAMILIES.values()), ids=list(FAMILIES))
def test_capabilities_never_advertise_what_load_rejects(caps, family):
    info = family_capabilities(caps, family)
    for value in info.compute_precisions:
        _, record = resolve_compute_dtype(Precision.of_proto(value), caps, family)
        assert not record.fell_back()
    for value in info.transformer_precisions:
        choice = resolve_quant(Precision.of_proto(value), Precision.UNSPECIFIED, None, caps, family, compiled=True)
        assert not choice.resolved[0].fell_back()
    if caps is CPU:
        assert c.MEMORY_MODE_LOW_VRAM not in info.memory_modes and c.PRECISION_FP8 not in info.transformer_precisions
    if family is QWEN:
        assert c.PRECISION_FP8 not in info.transformer_precisions


@pytest.mark.parametrize("may_tile, side, tiled", [
    (False, 2048, False), (True, 1024, False), (True, 1440, False), (True, 1536, True), (True, 2048, True),
])
def test_vae_tiling_only_for_large_images_in_offload_tiers(may_tile, side, tiled):
    from inference_service.generation import choose_tiling

    assert (choose_tiling(may_tile, side, side).applied == "on") is tiled


def test_scoped_download_size_and_disk_preflight(tmp_path):
    from diffusion_kit.hub_fetch import check_disk
    from diffusion_kit.hub_files import choose_files

    index = {"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"],
             "text_encoder": ["transformers", "CLIPTextModel"], "image_encoder": [None, None]}
    files = [("model_index.json", 1), ("transformer/diffusion_pytorch_model.safetensors", 100),
             ("transformer/config.json", 2), ("flux1-dev.safetensors", 5000), ("text_encoder/model.safetensors", 30),
             ("transformer/diffusion_pytorch_model.bin", 100), ("image_encoder/model.safetensors", 7)]
    assert choose_files(files, index).total_bytes == 133  # no single-file duplicate, no .bin, no unused component
    check_disk(tmp_path, 1)
    with pytest.raises(ResourceExhausted, match="GiB free"):
        check_disk(tmp_path, 2**60)


@pytest.mark.parametrize("speed, memory, compiled", [
    (c.SPEED_MODE_DEFAULT, c.MEMORY_MODE_AUTO, True),
    (c.SPEED_MODE_MAX, c.MEMORY_MODE_BALANCED, True),
    (c.SPEED_MODE_OFF, c.MEMORY_MODE_RESIDENT, False),
    (c.SPEED_MODE_UNSPECIFIED, c.MEMORY_MODE_AUTO, False),
    (c.SPEED_MODE_DEFAULT, c.MEMORY_MODE_LOW_VRAM, False),
    (c.SPEED_MODE_MAX, c.MEMORY_MODE_SEQUENTIAL, False),
])
def test_what_a_request_asks_of_compile(speed, memory, compiled):
    assert asks_for_compile(speed, memory) is compiled


FLUX_PARAMS = {"transformer": 11_900_000_000, "text_encoder_2": 4_760_000_000, "text_encoder": 123_000_000,
               "vae": 84_000_000}


@pytest.mark.parametrize("precision, free, quantised, memory, compiled, noted", [
    # plenty of memory: AUTO is fp8 on the H200, resident and compiled
    (c.PRECISION_AUTO, "plenty", "fp8", "MEMORY_MODE_RESIDENT", True, False),
    # fp8 does not fit balanced, so memory AUTO picks sequential, which cannot be compiled: AUTO precision is
    # decided again for an uncompiled transformer (dense), and the dense one fits sequential too
    (c.PRECISION_AUTO, "dense sequential", None, "MEMORY_MODE_SEQUENTIAL", False, True),
    (c.PRECISION_FP8, "dense sequential", "fp8", "MEMORY_MODE_SEQUENTIAL", False, True),  # explicit: kept, noted
    # only the fp8 transformer fits at all: the quantised plan stands, uncompiled
    (c.PRECISION_AUTO, "fp8 sequential", "fp8", "MEMORY_MODE_SEQUENTIAL", False, False),
])
def test_auto_precision_and_memory_agree_on_compile(precision, free, quantised, memory, compiled, noted):
    from dataclasses import replace
    from pathlib import Path

    from inference_service.load_plan import EngineSettings, plan_load
    from inference_service.requests import LoadRequest
    from inference_service.memory_plan import need_for
    from inference_service.model_source import SourceFiles

    source = SourceFiles("local_dir", Path("/nowhere"), FLUX, params=FLUX_PARAMS)
    fp8 = source.footprint_bytes("bf16", Precision.FP8.facts.inference_bits)
    dense = source.footprint_bytes("bf16")
    free_bytes = {"plenty": 139 * GiB, "dense sequential": need_for("sequential", *dense),
                  "fp8 sequential": need_for("sequential", *fp8)}[free]
    assert free == "plenty" or free_bytes < need_for("balanced", *fp8)
    req = LoadRequest(model_id="m", source=None, transformer_precision=Precision.of_proto(precision),
                      speed_mode=c.SPEED_MODE_DEFAULT)
    plan = plan_load(req, source, replace(H200, free_bytes=free_bytes), EngineSettings())
    applied = {r.control: r for r in plan.resolved}
    assert (plan.quant.transformer, applied["memory_mode"].applied, plan.speed.compile) == (quantised, memory, compiled)
    assert ("uncompiled" in applied["transformer_precision"].reason) is noted


def test_jpeg_recipe_of_the_longest_prompts_fits_its_comment():
    """A JPEG comment holds 65,533 bytes: the longest prompt and negative prompt the edge accepts, in four-byte
    characters, plus a full settings record must still encode (it answered INTERNAL 'Comment is too long')."""
    from PIL import Image

    from inference_service.image_encoding import encode_image
    from inference_service.request_rules import MAX_PROMPT_CHARS

    longest = "🦙" * MAX_PROMPT_CHARS
    recipe = {"model_id": "m" * 128, "prompt": longest, "negative_prompt": longest, "seed": 2**63 - 1,
              "settings": {f"control_{i}": "x" * 200 for i in range(40)}}
    data = encode_image(Image.new("RGB", (16, 16)), "jpeg", None, recipe)
    assert Image.open(__import__("io").BytesIO(data)).info["comment"].decode().count("🦙") == 2 * MAX_PROMPT_CHARS


@pytest.mark.parametrize("free, on_device", [("plenty", True), ("only fp8 fits", False)])
def test_a_quantised_load_leases_its_dense_peak_or_quantises_on_the_cpu(free, on_device):
    """torchao quantises a resident model after its dense weights reach the device: on an H200 an fp8 Z-Image
    used 24.8 GiB under a 19.8 GiB lease sized from the fp8 footprint."""
    from dataclasses import replace
    from pathlib import Path

    from inference_service.load_plan import EngineSettings, plan_load
    from inference_service.memory_plan import need_for
    from inference_service.model_source import SourceFiles
    from inference_service.requests import LoadRequest

    source = SourceFiles("local_dir", Path("/nowhere"), FLUX, params=FLUX_PARAMS)
    dense = need_for("resident", *source.footprint_bytes("bf16"))
    fp8 = need_for("resident", *source.footprint_bytes("bf16", Precision.FP8.facts.inference_bits))
    free_bytes = 139 * GiB if free == "plenty" else (dense + fp8) // 2
    req = LoadRequest(model_id="m", source=None, transformer_precision=Precision.FP8,
                      memory_mode=c.MEMORY_MODE_RESIDENT, speed_mode=c.SPEED_MODE_DEFAULT)
    plan = plan_load(req, source, replace(H200, free_bytes=free_bytes), EngineSettings())
    record = next(r for r in plan.resolved if r.control == "quantize_on")
    assert plan.quantize_on_device is on_device and record.applied == ("device" if on_device else "cpu")
    assert plan.lease_bytes == (dense if on_device else fp8) and plan.memory.device_bytes == fp8


@pytest.mark.parametrize("family, compiled, mode, ahead, applied, status", [
    ("zimage", True, "max", False, "on", Status.APPLIED),
    ("flux1", True, "max", False, "on", Status.APPLIED),
    ("zimage", True, "default", False, "off", Status.APPLIED),  # a minute more at every load for ~50 ms an image
    # ahead of time, only the first process pays that minute: later ones load the decoder's graph
    ("zimage", True, "default", True, "on", Status.APPLIED),
    ("flux1", True, "max", True, "on", Status.APPLIED),
    ("qwen_image", True, "default", True, "off", Status.UNSUPPORTED),  # a video VAE decoding frame by frame
    ("qwen_image", True, "max", False, "off", Status.UNSUPPORTED),
    ("sdxl", True, "max", False, "off", Status.UNSUPPORTED),
    ("zimage", False, "max", True, "off", Status.APPLIED),  # nf4 or an offload tier: nothing is compiled
])
def test_vae_decoder_compile(family, compiled, mode, ahead, applied, status):
    record = vae_decoder_compile(family, compiled, mode, ahead_of_time=ahead)
    assert (record.control, record.applied, record.status) == ("vae_decoder_compile", applied, status)
    assert record.reason
    assert ("ahead of time" in record.reason) == (applied == "on" and ahead)
