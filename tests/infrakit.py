"""The shipped infrastructure files (infra/) as parsed YAML: for tests/flows/test_infra.py and
tests/flows/test_closed_doors.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import yaml
from conftest import ROOT

INFRA = ROOT / "infra"


def documents(path: Path) -> list:
    """Every non-empty YAML document of the file at ``path``."""
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def lists_under(node: object, keys: tuple[str, ...]) -> Iterator[list]:
    """Every list held under one of ``keys`` anywhere in a parsed document (not looked into)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in keys and isinstance(value, list):
                yield value
            else:
                yield from lists_under(value, keys)
    elif isinstance(node, list):
        for value in node:
            yield from lists_under(value, keys)


K8S = INFRA / "k8s"
# The Dask operator's cluster (kubectl apply) and the Prefect worker chart's values (helm -f).
DASK_CLUSTER = K8S / "dask-cluster.yaml"
PREFECT_VALUES = K8S / "prefect-worker-values.yaml"


def by_kind(path: Path) -> dict[str, dict]:
    """The documents of a file of several kinds, by kind (one each)."""
    docs = documents(path)
    kinds = {doc["kind"]: doc for doc in docs}
    assert len(kinds) == len(docs), path
    return kinds


def dask_pods() -> dict[str, dict]:
    """The pod specs of the Dask cluster, by role: scheduler, cpu (the cluster's default worker
    group) and gpu (its DaskWorkerGroup)."""
    kinds = by_kind(DASK_CLUSTER)
    cluster = kinds["DaskCluster"]["spec"]
    return {"scheduler": cluster["scheduler"]["spec"], "cpu": cluster["worker"]["spec"],
            "gpu": kinds["DaskWorkerGroup"]["spec"]["worker"]["spec"]}


def container_commands() -> list[tuple[str, list[str]]]:
    """Every command that a container of the project's image runs, as (where, argv): compose's
    services, the Dask operator's pods, the Prefect worker chart's worker and init containers,
    and the image's default. Each names its command: none falls back on a default of the image
    or of a chart."""
    (compose,) = documents(INFRA / "docker-compose.yaml")
    found = []
    for name, service in compose["services"].items():
        if service["image"].startswith("vlcorpus"):
            found.append((f"compose {name}", service["command"]))
    for role, spec in dask_pods().items():
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            found.append((f"dask {role} {container['name']}", container["command"] + container.get("args", [])))
    (values,) = documents(PREFECT_VALUES)
    worker = values["worker"]
    found.append(("prefect-worker", worker["command"] + worker["args"]))
    for container in worker["initContainer"]["extraContainers"]:
        found.append((f"prefect-worker {container['name']}", container["command"] + container.get("args", [])))
    (cmd,) = [line for line in (INFRA / "docker" / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    found.append(("Dockerfile CMD", yaml.safe_load(cmd[4:])))
    return [(where, [str(word) for word in argv]) for where, argv in found]
