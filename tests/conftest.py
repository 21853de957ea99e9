import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One intra-op thread per process: a test run is already more processes than cores (the xdist workers and the
# services they start), and torch's default of a thread per core in each of them oversubscribed the cores (on 2
# cores, pytest -n 2 took 6 min 49 s with the default and 4 min 25 s with this). Set before torch is imported
# here, and inherited by every service and trainer the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config):
    """Services start by fork from one warm interpreter per test process (service_kit.warm_starts): the imports
    of a fresh one cost seconds of CPU, and the tests start well over a hundred services. A service whose
    environment changes what a library reads at import still starts fresh, and so does every one under
    DIFFUSION_TEST_COLD_STARTS=1. The start-up tests run the interpreter's own `python -m` either way."""
    controller = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if not controller and not os.environ.get("DIFFUSION_TEST_COLD_STARTS"):
        from service_kit.service_process import use_warm_starts

        use_warm_starts()


def pytest_collection_finish(session):
    """Every test file is imported now (torch, diffusers, transformers and ours), and the pipelines' modules are,
    where no GPU is visible (on a GPU, peft's import of bitsandbytes would give each worker a CUDA context):
    frozen, they are no longer walked by the full collections that recipes and model unloads run in this
    process (85 s of the suite's CPU went to those walks)."""
    from service_kit.fork_server import pipelines_to_warm
    from service_kit.heap_freeze import freeze_imported

    freeze_imported(pipelines_to_warm())


def pytest_unconfigure(config):
    from service_kit import warm_starts

    warm_starts.disable()


def pytest_collection_modifyitems(config, items):
    """The files marked slow run first (xdist hands out files in this order: started last, they left one
    worker running alone for a minute or more), and GPU tests are skipped without a GPU."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: files stay whole and in order
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def start_broker():
    """Starts real broker processes on loopback port 0; stops them after the test."""
    from tests.gpu_broker.harness import BrokerClientSync
    from service_kit.service_process import start_service

    started = []

    def start(*args: str, fake_devices: str | None = "1x24GiB", listen: str = "127.0.0.1:0"):
        """fake_devices None: the host's real devices (NVML)."""
        inventory = ("--fake-devices", fake_devices) if fake_devices else ()
        proc = start_service("gpu_broker", *inventory, *args, listen=listen)
        client = BrokerClientSync(proc.address)
        started.append((proc, client))
        return proc, client

    yield start
    for proc, client in started:
        client.close()
        proc.stop()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Tiny random-weight pipelines of all four families, saved as diffusers directories (no network)."""
    from demos.tiny_pipelines import BUILDERS, save_tiny_pipeline

    root = tmp_path_factory.mktemp("tiny-models")
    return {family: save_tiny_pipeline(family, root / family) for family in BUILDERS}
