"""heap_freeze.freeze_imported: what a process imported, the pipeline it names included (diffusers imports a
pipeline's modules only when it is first named), leaves the cyclic collector's reach, so the full collections
that free a model no longer walk it; what is made afterwards, a model, stays collectable. In a fresh interpreter:
the test process's own heap is frozen already (tests/conftest.py)."""
import subprocess
import sys

from service_kit.service_process import ROOT, service_env

SCRIPT = """
import gc
import diffusers, torch
from service_kit.heap_freeze import freeze_imported

freeze_imported(("ZImagePipeline",))
from diffusers.pipelines.z_image import pipeline_z_image  # made now, had the freeze not imported it
model = torch.nn.Sequential(torch.nn.Linear(2, 2))
tracked = {id(o) for o in gc.get_objects()}
print(id(pipeline_z_image.ZImagePipeline) in tracked, id(torch.nn.Linear) in tracked, id(model) in tracked,
      gc.get_freeze_count() > 100000)
"""


def test_the_imports_and_the_named_pipeline_are_frozen_and_a_later_model_is_not():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=service_env({"OMP_NUM_THREADS": "1"}),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    pipeline_tracked, linear_tracked, model_tracked, many_frozen = done.stdout.split()[-4:]
    assert (pipeline_tracked, linear_tracked) == ("False", "False")  # out of the collector's reach
    assert model_tracked == "True" and many_frozen == "True"
