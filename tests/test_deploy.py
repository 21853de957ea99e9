"""The container image and the Kubernetes manifests, checked without a container runtime or a cluster:
schemas of a pinned Kubernetes version, hadolint, the services' own flag parsers, grace periods against the
drain flags, and an image that installs what pyproject declares."""
import copy
import importlib
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
KUBERNETES = "1.33.0"
DRAIN_FLAGS = ("--shutdown-grace", "--drain-timeout")


def documents():
    return [(path.name, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def workloads():
    return [(name, doc) for name, doc in documents() if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]


@pytest.mark.parametrize("name, doc", documents(), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_every_manifest_validates_against_the_pinned_kubernetes(name, doc):
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_the_validator_refuses_a_misspelt_field():
    _, doc = workloads()[0]
    broken = copy.deepcopy(doc)
    broken["spec"]["template"]["spec"]["terminationGracePeriodSecond"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


@pytest.mark.parametrize("name, doc", workloads(), ids=lambda x: x if isinstance(x, str) else x["kind"])
def test_container_args_parse_and_the_grace_outlasts_the_drain(name, doc):
    pod = doc["spec"]["template"]["spec"]
    for container in pod["containers"]:
        module, *flags = container["args"]
        args = importlib.import_module(f"{module}.__main__").build_parser().parse_args(flags)  # exits on a bad flag
        drain = max([getattr(args, f.lstrip("-").replace("-", "_"), 0) or 0 for f in DRAIN_FLAGS])
        assert pod["terminationGracePeriodSeconds"] > drain, (name, drain)
        assert args.metrics_listen and container["livenessProbe"]["grpc"] and container["readinessProbe"]["grpc"]
        port = int(args.listen.rsplit(":", 1)[1])
        assert {p["containerPort"] for p in container["ports"]} >= {port, int(args.metrics_listen.rsplit(":", 1)[1])}
        assert doc["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"


def test_gpu_pods_share_the_nodes_broker():
    services = {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == "Service"}
    assert services["gpu-broker"]["spec"]["internalTrafficPolicy"] == "Local"
    for name, doc in workloads():
        container = doc["spec"]["template"]["spec"]["containers"][0]
        args = container["args"]
        if args[0] != "gpu_broker" and "nvidia.com/gpu" in container["resources"].get("limits", {}):
            assert args[args.index("--broker") + 1].startswith("gpu-broker."), name


def test_the_router_lists_every_worker_the_statefulset_makes():
    docs = {(doc["kind"], doc["metadata"]["name"]): doc for _, doc in documents()}
    workers = docs[("StatefulSet", "inference")]
    headless = docs[("Service", workers["spec"]["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None"
    args = docs[("Deployment", "inference-router")]["spec"]["template"]["spec"]["containers"][0]["args"]
    listed = [args[i + 1] for i, a in enumerate(args) if a == "--worker"]
    namespace = workers["metadata"]["namespace"]
    assert listed == [f"inference-{i}.{headless['metadata']['name']}.{namespace}.svc:50052"
                      for i in range(workers["spec"]["replicas"])]
    assert docs[("Service", "inference")]["spec"]["selector"] == {"app": "inference-router"}


def test_the_image_installs_what_pyproject_declares():
    dockerfile = (ROOT / "Dockerfile").read_text()
    installs = re.findall(r"pip install ([^\n]+)", dockerfile)
    assert installs == ['"torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"', "."], installs
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()
                and any(re.fullmatch(pat.replace("*", ".*"), p.name) for pat in patterns)}
    copied = set(re.findall(r"^COPY (\S+) \./\1$", dockerfile, re.M))
    assert packages and packages == copied, (packages, copied)


def test_hadolint_passes_on_the_dockerfile():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    done = subprocess.run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), str(ROOT / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
