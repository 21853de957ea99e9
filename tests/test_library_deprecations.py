"""Our calls into diffusers use its current arguments: loading a pipeline or a denoiser warns of no deprecation
(diffusers 0.42 deprecates `torch_dtype`, which every load used to pass)."""
import warnings

from diffusion_kit.families import FAMILIES
from diffusion_kit.host_caps import HostCaps
from diffusion_kit.model_sources import LocalDir
from diffusion_kit.path_roots import Roots
from diffusion_kit.precision import Precision
from inference_service import pipeline_builder
from inference_service.load_plan import EngineSettings, plan_load
from inference_service.model_source import resolve_source
from inference_service.requests import LoadRequest
from training_service.denoiser_setup import load_denoiser

CPU = HostCaps("cpu", "CPU", 24 * 2**30, 22 * 2**30)


def deprecations(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))
            and "dtype" in str(w.message)]


def test_inference_build_passes_no_deprecated_argument(tiny_models):
    path = tiny_models["zimage"]
    source = resolve_source(LocalDir(str(path)), None, Roots.of([path.parent], "--model-root"))
    plan = plan_load(LoadRequest(model_id="m", source=None), source, CPU, EngineSettings(compile_backend="aot_eager"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = pipeline_builder.build(plan, lambda phase, message: None)
    assert deprecations(caught) == []
    pipeline_builder.unload(built)


def test_training_denoiser_load_passes_no_deprecated_argument(tiny_models):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_denoiser(FAMILIES["zimage"], str(tiny_models["zimage"]), Precision.FP32, "cpu", rank=4, alpha=4,
                      seed=0, gradient_checkpointing=False, compile_backend=None)
    assert deprecations(caught) == []
