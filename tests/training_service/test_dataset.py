"""Dataset discovery and the decode preflight, on real files."""
import json

import pytest
from PIL import Image

from service_kit.errors import InvalidArgument, NotFound
from training_service.dataset import discover, fingerprint


def image(path, size=(32, 24)):
    Image.new("RGB", size, (200, 10, 10)).save(path)
    return path


def test_sidecars_metadata_and_instance_prompt(tmp_path):
    image(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("a red square\n")
    image(tmp_path / "b.jpg")
    (tmp_path / "b.caption").write_text("caption file")
    image(tmp_path / "c.png")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "c.png", "text": "from metadata"}) + "\n")
    image(tmp_path / "d.png")
    examples = discover(str(tmp_path), instance_prompt="photo of sks")
    assert [(e.image.name, e.caption) for e in examples] == [
        ("a.png", "a red square"), ("b.jpg", "caption file"), ("c.png", "from metadata"), ("d.png", "photo of sks")]
    assert (examples[0].width, examples[0].height) == (32, 24)
    assert len(fingerprint(examples)) == 16


def test_every_image_must_decode(tmp_path):
    image(tmp_path / "good.png")
    (tmp_path / "empty.png").write_bytes(b"")
    data = (tmp_path / "good.png").read_bytes()
    (tmp_path / "truncated.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidArgument, match="2 image") as e:
        discover(str(tmp_path), instance_prompt="x")
    assert "empty.png" in e.value.message and "truncated.png" in e.value.message


@pytest.mark.parametrize("setup, error, reason", [
    (lambda d: None, InvalidArgument, "EMPTY_DATASET"),
    (lambda d: image(d / "a.png"), InvalidArgument, "MISSING_CAPTION"),
    (lambda d: (image(d / "a.png"), (d / "metadata.jsonl").write_text("{not json")), InvalidArgument, "BAD_METADATA"),
])
def test_bad_datasets(tmp_path, setup, error, reason):
    setup(tmp_path)
    with pytest.raises(error) as e:
        discover(str(tmp_path))
    assert e.value.reason == reason


def test_missing_folder(tmp_path):
    with pytest.raises(NotFound):
        discover(str(tmp_path / "nope"))
