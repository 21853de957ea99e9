"""Fixtures shared by the training service's test modules."""
import sys

import pytest

from tests.datasets import write_cards


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("jobs")
    data = write_cards(root / "data", size=(72, 64))
    return {"out": root / "out", "adapters": root / "adapters", "data": data}


@pytest.fixture(autouse=True)
def dynamo_as_in_a_fresh_process():
    """Each test's recipe compiles as a trainer child does, in a process of its own. Dynamo keeps a block's graphs on
    its code object for the life of the process, counted against the recompile limit, and a code object past the
    limit only runs the graphs it has (for good): the Z-Image blocks' compiles of earlier tests in an xdist worker
    left a later test's CUDA graph job running its blocks eagerly, with no graph launched and nothing said."""
    yield
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
