"""Register the deployments of ``infra/prefect.yaml`` through Prefect's Python API.

(``prefect deploy`` in Prefect 3.8.8 stops after the first deployment: its check for online
workers sends a request the server rejects with 422.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectAlreadyExists
from prefect.schedules import Cron

from prefect import Flow

from flows import build


def _working_dir(spec: dict[str, Any]) -> str | None:
    for step in spec.get("pull") or []:
        for name, args in step.items():
            if name.endswith("set_working_directory"):
                return args["directory"]
    return None


def _entrypoint(name: str, entrypoint: str) -> Flow:
    """The flow of ``flows/build.py:<flow>``: rebuild_corpus or a stage flow."""
    path, _, attr = entrypoint.partition(":")
    found = getattr(build, attr, None) if path == "flows/build.py" else None
    if not isinstance(found, Flow):
        raise ValueError(f"{name}: unknown entrypoint {entrypoint}; use flows/build.py:rebuild_corpus "
                         f"or a stage flow such as flows/build.py:download_flow")
    return found


def ensure_pool(name: str) -> bool:
    """Create the process work pool ``name`` unless it exists; True when created."""
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            return False
    return True


def deploy(file: Path, pool: str | None = None) -> list[str]:
    """Apply every deployment of ``file``; returns their ids."""
    spec = yaml.safe_load(file.read_text())
    working_dir = _working_dir(spec)
    ids = []
    for item in spec["deployments"]:
        flow_fn = _entrypoint(item["name"], item["entrypoint"])
        pool_name = pool or item["work_pool"]["name"]
        ensure_pool(pool_name)
        deployment = flow_fn.to_deployment(
            name=item["name"],
            description=item.get("description"),
            parameters=item.get("parameters") or {},
            schedules=[Cron(s["cron"], timezone=s.get("timezone", "UTC"))
                       for s in item.get("schedules") or []],
            work_pool_name=pool_name,
            job_variables={"working_dir": working_dir} if working_dir else None,
        )
        ids.append(str(deployment.apply()))
    return ids
