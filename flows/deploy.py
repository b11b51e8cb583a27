"""Register the deployments of ``infra/prefect.yaml`` with a Prefect server.

A process worker starts each flow run in the deployment's ``working_dir``, where relative
``config`` parameters are read and whose ``flows`` package is imported first; so that directory
is chosen here (the given one, else where the deployments are registered) and checked before
anything is registered, rather than failing inside the worker at run time.

Entrypoints are module paths (``flows.build.rebuild_corpus``): Prefect loads a file entrypoint
(``flows/build.py:...``) as a module named ``build``, and the tasks it sends to a Dask cluster
then name a module the cluster's workers cannot import.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.objects import ConcurrencyLimitConfig
from prefect.deployments.runner import EntrypointType
from prefect.exceptions import ObjectAlreadyExists
from prefect.schedules import Cron
from prefect.settings import PREFECT_API_URL

from prefect import Flow

from flows import build


class DeployError(ValueError):
    """A deployments file that workers could not run; the message is one line."""


def _entrypoint(name: str, entrypoint: str) -> Flow:
    """The flow of ``flows.build.<flow>``: rebuild_corpus or a stage flow."""
    module, _, attr = entrypoint.rpartition(".")
    found = getattr(build, attr, None) if module == build.__name__ else None
    if not isinstance(found, Flow):
        raise DeployError(f"{name}: unknown entrypoint {entrypoint}; use flows.build.rebuild_corpus "
                          f"or a stage flow such as flows.build.download_flow")
    return found


def check_working_dir(working_dir: Path, deployments: list[dict[str, Any]]) -> Path:
    """``working_dir`` made absolute, once it holds every deployment's relative config."""
    hint = ("pass --working-dir (or set VLCORPUS_WORKING_DIR) to the folder that holds the "
            "repository's flows/ and configs/ where the worker runs, or run vlcorpus deploy there")
    directory = working_dir.expanduser().resolve()
    if not directory.is_dir():
        raise DeployError(f"working directory {directory} does not exist; {hint}")
    for item in deployments:
        config = (item.get("parameters") or {}).get("config")
        if config and "://" not in config and not (directory / config).is_file():
            raise DeployError(f"{item['name']}: config {config} not found in working directory "
                              f"{directory}; {hint}")
    return directory


def ensure_pool(name: str) -> bool:
    """Create the process work pool ``name`` unless it exists; True when created."""
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            return False
    return True


def _concurrency(item: dict[str, Any]) -> ConcurrencyLimitConfig | None:
    limit = item.get("concurrency_limit")
    if limit is None:
        return None
    return ConcurrencyLimitConfig.model_validate(limit if isinstance(limit, dict) else {"limit": limit})


_START_ONE = ("start one with `prefect server start` and export PREFECT_API_URL=http://127.0.0.1:4200/api "
              "(infra/README.md), or point PREFECT_API_URL at yours")


def check_server() -> str:
    """The API deployments go to: PREFECT_API_URL, answering. Without it Prefect would register
    them on a temporary server that stops with this command, and they would be gone."""
    url = PREFECT_API_URL.value()
    if not url:
        raise DeployError(f"no Prefect server to register the deployments on: PREFECT_API_URL is not set; {_START_ONE}")
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=10) as response:
            if response.status == 200:
                return url
    except OSError as exc:
        raise DeployError(f"no Prefect server answers at PREFECT_API_URL={url} ({exc}); {_START_ONE}") from None
    raise DeployError(f"the Prefect server at PREFECT_API_URL={url} is not healthy; {_START_ONE}")


def deploy(file: Path, working_dir: Path, pool: str | None = None) -> tuple[list[str], Path]:
    """Apply every deployment of ``file``, run by workers in ``working_dir``; returns their ids
    and the checked working directory."""
    spec = yaml.safe_load(file.read_text())
    directory = check_working_dir(working_dir, spec["deployments"])
    flows = [_entrypoint(item["name"], item["entrypoint"]) for item in spec["deployments"]]
    check_server()
    ids = []
    for item, flow_fn in zip(spec["deployments"], flows):
        pool_name = pool or item["work_pool"]["name"]
        ensure_pool(pool_name)
        deployment = flow_fn.to_deployment(
            name=item["name"],
            description=item.get("description"),
            parameters=item.get("parameters") or {},
            schedules=[Cron(s["cron"], timezone=s.get("timezone", "UTC"))
                       for s in item.get("schedules") or []],
            concurrency_limit=_concurrency(item),
            work_pool_name=pool_name,
            job_variables={"working_dir": str(directory)},
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        # Prefect names a module path after the flow's function, which stage flows share.
        deployment.entrypoint = item["entrypoint"]
        ids.append(str(deployment.apply()))
    return ids, directory
