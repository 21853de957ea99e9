"""The few-image training sets the tests train on, written in code."""
from pathlib import Path

from PIL import Image


def write_cards(folder: Path, count: int = 2, size: tuple[int, int] = (64, 64)) -> Path:
    """`count` plain-colour PNGs (0.png, 1.png, ...) in `folder`, made if missing; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.new("RGB", size, (90 * i, 40, 160)).save(folder / f"{i}.png")
    return folder
