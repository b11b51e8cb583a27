"""The pictures of the demo videos: WIDTH x HEIGHT frames at FPS, each scene one still of a wall,
a floor and its object as a big coloured shape, written as a binary PPM for ffmpeg."""

from __future__ import annotations

import math

WIDTH, HEIGHT, FPS = 320, 240, 25

WALL_RGB = (206, 203, 196)
FLOOR_RGB = (150, 146, 140)
FLOOR_Y = 200

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "blue": (40, 80, 220),
    "green": (40, 170, 60),
    "yellow": (240, 210, 40),
    "purple": (140, 60, 180),
    "orange": (245, 140, 30),
    "pink": (245, 120, 180),
}
# Every object has its own shape, so an object can be told from the picture alone.
OBJECT_SHAPES: dict[str, str] = {
    "sofa": "rectangle",
    "lamp": "circle",
    "plant": "triangle",
    "rug": "diamond",
    "clock": "ring",
    "table": "tee",
    "chair": "square",
    "bed": "cross",
}


def _shape_spans(shape: str, y: int) -> list[tuple[int, int]]:
    """Horizontal runs [x0, x1) of the shape on row y, centred in the frame."""
    cx, cy = WIDTH // 2, 125
    dy = y - cy

    def disc(r: int) -> tuple[int, int] | None:
        if abs(dy) >= r:
            return None
        half = int(math.sqrt(r * r - dy * dy))
        return (cx - half, cx + half)

    def box(x0: int, x1: int, y0: int, y1: int) -> list[tuple[int, int]]:
        return [(x0, x1)] if y0 <= y < y1 else []

    if shape == "rectangle":
        return box(60, 260, 80, 170)
    if shape == "square":
        return box(90, 230, 55, 195)
    if shape == "circle":
        return [s] if (s := disc(72)) else []
    if shape == "ring":
        outer, inner = disc(75), disc(40)
        if outer is None:
            return []
        return [outer] if inner is None else [(outer[0], inner[0]), (inner[1], outer[1])]
    if shape == "triangle":
        if not 50 <= y < 195:
            return []
        half = (y - 50) * 85 // 145
        return [(cx - half, cx + half + 1)]
    if shape == "diamond":
        half = 78 - abs(dy)
        return [(cx - half, cx + half)] if half > 0 else []
    if shape == "cross":
        return box(85, 235, 100, 150) or box(135, 185, 50, 200)
    if shape == "tee":
        return box(60, 260, 60, 100) or box(140, 180, 100, 200)
    raise ValueError(f"unknown shape {shape!r}")


def frame_ppm(shape: str, rgb: tuple[int, int, int]) -> bytes:
    """One binary PPM frame: wall, floor and the shape; built row by row from runs."""
    fg = bytes(rgb)
    rows = []
    for y in range(HEIGHT):
        bg = bytes(FLOOR_RGB if y >= FLOOR_Y else WALL_RGB)
        row = bytearray(bg * WIDTH)
        for x0, x1 in _shape_spans(shape, y):
            row[3 * x0 : 3 * x1] = fg * (x1 - x0)
        rows.append(bytes(row))
    return f"P6\n{WIDTH} {HEIGHT}\n255\n".encode() + b"".join(rows)

