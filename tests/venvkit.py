"""Venvs of exactly one install's packages: the lock's export for some extras, as pip installs
them from constraints.txt, linked from this suite's venv (the same lock) rather than installed.
The container image's (tests/flows/test_image.py) and the core install's, `pip install vlcorpus`
with no extra (tests/cli/test_extras.py). Each is made once a test session, in a folder that the
session's pytest-xdist workers share, and its python runs the commands."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, locked_pins


def locked_packages(extras: list[str]) -> dict[str, str]:
    """What installing the project with ``extras`` brings on this machine's platform and Python
    (name -> version): the lock's export for them, the set pip resolves from its constraints."""
    export = subprocess.run([str(ROOT / ".venv" / "bin" / "uv"), "export", "--quiet", "--frozen",
                             "--no-emit-project", "--no-hashes", "--no-annotate", "--format", "requirements.txt",
                             *[f"--extra={e}" for e in extras]],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    return locked_pins(export)


def linked_venv(tmp_path_factory: pytest.TempPathFactory, packages: dict[str, str]) -> tuple[str, set[str]]:
    """A venv holding only ``packages`` and the project, made once a session; its python and the
    packages of ``packages`` that this suite's venv lacks (so the venv lacks them too)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    key = hashlib.sha256(json.dumps([sys.executable, sorted(packages.items())]).encode()).hexdigest()[:16]
    folder = shared / f"linked-venv-{key}"
    done = folder / "missing.json"
    with open(shared / f"linked-venv-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            missing = _link(folder, packages)
            done.write_text(json.dumps(sorted(missing)))
    return str(folder / "bin" / "python"), set(json.loads(done.read_text()))


def _link(folder: Path, packages: dict[str, str]) -> set[str]:
    """Make the venv at ``folder``: each distribution of ``packages`` and the project linked
    from this suite's venv, at the version the lock pins, with their commands in its bin/ as pip
    writes them."""
    from importlib.metadata import distributions

    from packaging.utils import canonicalize_name

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    (target,) = folder.glob("lib/python*/site-packages")
    wanted = {**packages, "vlcorpus": None}
    found: dict[str, str] = {}
    for dist in distributions(path=[p for p in sys.path if p.endswith("site-packages")]):
        name = canonicalize_name(dist.metadata["Name"])
        if name not in wanted or name in found:
            continue
        found[name] = dist.version
        for top in {f.parts[0] for f in dist.files or () if f.parts[0] != ".."}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (target / top).exists():
                (target / top).symlink_to(source)
        for entry in dist.entry_points.select(group="console_scripts"):
            _write_script(folder / "bin", entry.name, entry.module, entry.attr)
    assert all(found[n] == v for n, v in packages.items() if n in found), "the suite's venv is not the lock's"
    return set(packages) - set(found)


def _write_script(bin_dir: Path, name: str, module: str, attr: str) -> None:
    """The command ``name`` that calls ``module:attr``, run by the venv's python."""
    script = bin_dir / name
    if not script.exists():
        script.write_text(f"#!{bin_dir / 'python'}\nimport importlib, sys\n"
                          f"target = importlib.import_module({module!r})\n"
                          f"for part in {attr!r}.split('.'):\n    target = getattr(target, part)\n"
                          "sys.exit(target())\n")
        script.chmod(0o755)


def installed(python: str) -> dict[str, str]:
    """The distributions that ``python`` sees (name -> version), names canonical."""
    probe = ("import json, re; from importlib.metadata import distributions; "
             "print(json.dumps({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(): d.version "
             "for d in distributions()}))")
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)
