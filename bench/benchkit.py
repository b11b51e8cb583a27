"""What several benchmarks share: a generated test video, a timer, and mirrored demo pages."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def make_test_video(path: str, seconds: int, audio: bool = False) -> None:
    """An 854x480 25 fps H.264 test pattern (keyframe every 10 s), with a sine tone if ``audio``."""
    tone = ["-f", "lavfi", "-i", f"sine=frequency=440:duration={seconds}"] if audio else []
    subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-y", "-f", "lavfi",
                    "-i", f"testsrc2=s=854x480:r=25:d={seconds}", *tone, "-c:v", "libx264",
                    "-preset", "ultrafast", "-g", "250", "-pix_fmt", "yuv420p",
                    *(["-c:a", "aac"] if audio else []), path], check=True)


def timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """(seconds ``fn(*args)`` took, its result)."""
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def mirror_pages(site: Path, pages: int) -> list[str]:
    """Copies of the demo site's good pages under new names, so there are ``pages`` distinct
    videos; returns their paths relative to the site."""
    good = sorted(p for p in (site / "pages").glob("tour-*.html"))
    names = []
    for i in range(pages):
        name = f"bench-{i:04d}.html"
        shutil.copy(good[i % len(good)], site / "pages" / name)
        names.append(f"pages/{name}")
    return names
