"""Fixtures shared by the training service's test modules."""
import pytest
from PIL import Image


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("jobs")
    data = root / "data"
    data.mkdir()
    for i in range(2):
        Image.new("RGB", (72, 64), (90 * i, 40, 160)).save(data / f"{i}.png")
    return {"out": root / "out", "adapters": root / "adapters", "data": data}
