"""Fixtures shared by the training service's test modules."""
import pytest

from tests.datasets import write_cards


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("jobs")
    data = write_cards(root / "data", size=(72, 64))
    return {"out": root / "out", "adapters": root / "adapters", "data": data}
