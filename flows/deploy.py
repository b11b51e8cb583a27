"""Register the deployments of ``infra/prefect.yaml`` with a Prefect server.

A process worker starts each flow run in the deployment's ``working_dir``, where relative
``config`` parameters are read and whose ``flows`` package is imported first; so that directory
is chosen here (the given one, else where the deployments are registered) and checked before
anything is registered, rather than failing inside the worker at run time.

Every deployment's runs send Prefect's heartbeats, and the server gets the automation that marks
a run Crashed when they stop, when none came since it entered Running, or when it never left
Pending (flows/liveness.py; the file's ``liveness`` section tunes both); a deployment with
``rerun_crashed_after_s`` runs a Crashed run again exactly once (flows/rerun.py).

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
from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger
from prefect.exceptions import ObjectAlreadyExists
from prefect.schedules import Schedule
from prefect.settings import PREFECT_API_REQUEST_TIMEOUT, PREFECT_API_URL
from pydantic import ValidationError

from prefect import Flow

from flows import build, liveness
from flows.api_access import refusal
from flows.rerun import rerun_trigger
from flows.schedules import ScheduleError, read_schedule

from pipeline.config import ConfigError, load_config
from pipeline.config.model import ROOT_ENV


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
    """The API deployments go to: PREFECT_API_URL, answering and taking this process's
    credentials. Without it Prefect would register them on a temporary server that stops with
    this command, and they would be gone."""
    url = PREFECT_API_URL.value()
    if not url:
        raise DeployError(f"no Prefect server to register the deployments on: PREFECT_API_URL is not set; {_START_ONE}")
    try:
        # As long as Prefect's own client waits for an answer: a busy server (its SQLite in a long
        # write, as in the suite) once took over 10 s to answer a health check it did answer.
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=PREFECT_API_REQUEST_TIMEOUT.value()) \
                as response:
            healthy = response.status == 200
    except OSError as exc:
        raise DeployError(f"no Prefect server answers at PREFECT_API_URL={url} ({exc}); {_START_ONE}") from None
    if not healthy:
        raise DeployError(f"the Prefect server at PREFECT_API_URL={url} is not healthy; {_START_ONE}")
    refused = refusal(url)
    if refused:
        raise DeployError(refused)
    return url


def _liveness(spec: dict[str, Any], file: Path) -> liveness.Liveness:
    """The file's ``liveness`` section, checked (without one: heartbeats every 30 s, Crashed after 90 s)."""
    try:
        return liveness.Liveness.model_validate(spec.get("liveness") or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, ("liveness", *first["loc"])))
        raise DeployError(f"{file}: {where}: {first['msg']}") from None


def _triggers(item: dict[str, Any], flow_fn: Flow) -> list[DeploymentEventTrigger]:
    """The rerun of ``item``'s Crashed runs, when its ``rerun_crashed_after_s`` asks for one."""
    after = item.get("rerun_crashed_after_s")
    if after is None:
        return []
    name = item["name"]
    if isinstance(after, bool) or not isinstance(after, int) or after < 0:
        raise DeployError(f"{name}: rerun_crashed_after_s must be a number of seconds, 0 or more (got {after!r})")
    if flow_fn is not build.rebuild_corpus:
        raise DeployError(f"{name}: rerun_crashed_after_s needs the entrypoint flows.build.rebuild_corpus, "
                          f"whose runs take the root's lock")
    return [rerun_trigger(name, flow_fn, after)]


def _check(item: dict[str, Any], directory: Path) -> tuple[list[Schedule], dict[str, Any]]:
    """What registering ``item`` needs, checked: its schedules, and its parameters (a root taken
    from $VLCORPUS_ROOT is written into them, so the worker needs no such variable).
    DeployError names the deployment and what is missing."""
    name = item["name"]
    try:
        schedules = [read_schedule(entry) for entry in item.get("schedules") or []]
    except ScheduleError as exc:
        raise DeployError(f"{name}: {exc}") from None
    parameters = dict(item.get("parameters") or {})
    config = parameters.get("config")
    if config is None or "://" in str(config):
        if schedules and config is None:
            raise DeployError(f"{name}: a scheduled deployment needs a config parameter")
        return schedules, parameters
    try:
        cfg = load_config(directory / config)
    except ConfigError as exc:
        raise DeployError(f"{name}: config {config} is not valid: {'; '.join(exc.problems)}") from None
    try:
        root = cfg.corpus_root(parameters.get("root"))
    except ValueError:
        raise DeployError(f"{name}: no corpus root: config {config} has no root and neither the "
                          f"deployment's parameters nor {ROOT_ENV} give one (set {ROOT_ENV}=/data/corpora "
                          f"or s3://bucket/corpora, or add root: to its parameters)") from None
    if "root" not in parameters and cfg.root is None:  # from $VLCORPUS_ROOT: named where it runs
        parameters["root"] = root
    for source in cfg.sources:
        path = getattr(source, "path", None)
        if path is not None and "://" not in path and not Path(path).exists():
            label = f"{source.type} source {source.name!r}" if source.name else f"{source.type} source"
            raise DeployError(f"{name}: the {label} of config {config} reads {path}, which does not exist")
    return schedules, parameters


def _flow_names() -> list[str]:
    """Every flow a deployment's run may run: the entrypoints, and build_corpus as a subflow."""
    return [build.rebuild_corpus.name, build.build_corpus.name, *(f.name for f in build.STAGE_FLOWS.values())]


def deploy(file: Path, working_dir: Path, pool: str | None = None,
           names: list[str] | None = None) -> tuple[list[str], Path]:
    """Apply the deployments of ``file`` (those of ``names``, or all), run by workers in
    ``working_dir``; returns their ids and the checked working directory. Every deployment is
    checked before any is registered: one that could not run is refused, with all the others."""
    spec = yaml.safe_load(file.read_text())
    items = spec["deployments"]
    if names:
        unknown = sorted(set(names) - {item["name"] for item in items})
        if unknown:
            raise DeployError(f"no deployment {', '.join(unknown)} in {file}; it has "
                              f"{', '.join(item['name'] for item in items)}")
        items = [item for item in items if item["name"] in names]
    directory = check_working_dir(working_dir, items)
    alive = _liveness(spec, file)
    problems, checked = [], []
    for item in items:
        try:
            flow_fn = _entrypoint(item["name"], item["entrypoint"])
            checked.append((item, flow_fn, *_check(item, directory), _triggers(item, flow_fn)))
        except DeployError as exc:
            problems.append(str(exc))
    if problems:
        good = [item["name"] for item in items if not any(p.startswith(f"{item['name']}: ") for p in problems)]
        hint = "nothing registered" + (f"; {' '.join(f'--name {n}' for n in good)} registers the ones "
                                       f"that can run" if good else "")
        raise DeployError("\n".join(problems) + f"\n({hint})")
    check_server()
    liveness.install(alive, _flow_names())
    ids = []
    for item, flow_fn, schedules, parameters, triggers in checked:
        pool_name = pool or item["work_pool"]["name"]
        ensure_pool(pool_name)
        deployment = flow_fn.to_deployment(
            name=item["name"],
            description=item.get("description"),
            parameters=parameters,
            schedules=schedules,
            concurrency_limit=_concurrency(item),
            work_pool_name=pool_name,
            job_variables={"working_dir": str(directory), "env": alive.job_env()},
            tags=[liveness.TAG],  # its runs send heartbeats: the server watches them from their start
            triggers=triggers,
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        # Prefect names a module path after the flow's function, which stage flows share.
        deployment.entrypoint = item["entrypoint"]
        ids.append(str(deployment.apply()))
    return ids, directory
