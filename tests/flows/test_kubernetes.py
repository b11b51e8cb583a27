"""infra/k8s/ without a cluster (infra/README.md, On Kubernetes): the Dask cluster is what the
dask-kubernetes operator's CRDs of the release the README installs accept, unknown keys refused;
the Prefect worker's values, over the chart's defaults, are what its values.schema.json accepts
at the release the README installs; every pod spec and plain manifest passes kubernetes-validate
in strict mode; the pods speak TLS with their role's files, reach the scheduler over TLS, get
the root's credentials, and the GPU group asks for a GPU and offers GPU=1; compose runs the
same Dask commands; the README's steps name what the files name. Then the operator's pods'
commands and environments, as written, start a scheduler and two workers here, which the
README's GPU check reads, and whose HTTP API retires a worker by the name the operator deletes
(tests/data/k8s/README.md: the schemas)."""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from copy import deepcopy
from decimal import Decimal
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import ROOT
from docskit import code_blocks, commands
from infrakit import DASK_CLUSTER, INFRA, PREFECT_VALUES, by_kind, dask_pods, documents

sys.path.insert(0, str(ROOT / "infra"))
from make_secrets import make_env_file, make_tls  # noqa: E402 - infra/ is a folder of scripts

SCHEMAS = ROOT / "tests" / "data" / "k8s"
OPERATOR = "2026.3.0"  # the dask-kubernetes release whose CRDs infra/README.md installs
PREFECT_CHART = ("2026.8.18172642", "75b0c27")  # the prefect-worker chart's release, and its commit
KUBERNETES = "1.33.0"  # the oldest Kubernetes the files are checked against
BIN = Path(sys.executable).parent
DASK_TLS = "DASK_DISTRIBUTED__COMM__TLS__"
REQUIRE_ENCRYPTION = "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"


# ------------------------------------------------------------------ the upstream schemas


def _strict(schema: dict) -> dict:
    """A CRD's structural schema as the API server applies it under strict field validation
    (`kubectl apply --validate=strict`): an unknown field is refused, not pruned; an
    int-or-string field is one of the two."""
    schema = dict(schema)
    if "properties" in schema:
        schema["properties"] = {name: _strict(sub) for name, sub in schema["properties"].items()}
        schema.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            schema[key] = _strict(schema[key])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            schema[key] = [_strict(sub) for sub in schema[key]]
    if schema.pop("x-kubernetes-int-or-string", False):
        schema["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return schema


@functools.cache
def _crd(name: str) -> dict:
    """A vendored CRD of the operator's release (read by libyaml's loader: 400 KB of YAML)."""
    return yaml.load((SCHEMAS / f"dask-kubernetes-{OPERATOR}" / f"{name}.yaml").read_text(), Loader=yaml.CSafeLoader)


@functools.cache
def _crd_validator(name: str) -> tuple[str, str, jsonschema.Validator]:
    """The kind, apiVersion and validator of a vendored CRD of the operator's release."""
    crd = _crd(name)
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    schema = _strict(version["schema"]["openAPIV3Schema"])
    # What every object has besides its schema's fields.
    schema["properties"].update(apiVersion={"type": "string"}, kind={"type": "string"},
                                metadata={"type": "object", "required": ["name"]})
    return crd["spec"]["names"]["kind"], f"{crd['spec']['group']}/{version['name']}", jsonschema.Draft7Validator(schema)


def _errors(validator: jsonschema.Validator, document: dict) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(document)]


def _helm_values(defaults: dict, values: dict) -> dict:
    """``values`` over a chart's ``defaults`` as Helm coalesces them: maps merged key by key,
    anything else replaced, a null deleting the default."""
    merged = deepcopy(defaults)
    for key, value in values.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _helm_values(merged[key], value)
        else:
            merged[key] = deepcopy(value)
    return merged


def _chart() -> tuple[dict, dict]:
    """The Prefect worker's values over the chart's defaults, and the chart's schema."""
    folder = SCHEMAS / f"prefect-helm-{PREFECT_CHART[1]}"
    (defaults,) = documents(folder / "values.yaml")
    (values,) = documents(PREFECT_VALUES)
    return _helm_values(defaults, values), json.loads((folder / "values.schema.json").read_text())


def _validate(manifest: dict) -> None:
    """kubernetes-validate in strict mode (unknown fields refused) for KUBERNETES."""
    try:
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as error:
        raise AssertionError(f"{manifest['kind']} {manifest['metadata']['name']}: "
                             f"{'.'.join(map(str, error.path))}: {error.message}") from None


def _as_pod(name: str, spec: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _chart_pod(worker: dict) -> dict:
    """The parts of the Prefect chart's worker pod that its values give and its schema leaves
    free (its env, Secrets, volumes, init containers), as the chart's template places them."""
    container = {"name": "prefect-worker", "image": f"{worker['image']['repository']}:{worker['image']['prefectTag']}",
                 "command": worker["command"], "args": worker["args"], "env": worker["extraEnvVars"],
                 "envFrom": [{"secretRef": {"name": name}} for name in worker["extraEnvVarsSecrets"]],
                 "volumeMounts": worker["extraVolumeMounts"], "resources": worker["resources"]}
    return {"containers": [container], "initContainers": worker["initContainer"]["extraContainers"],
            "volumes": [{"name": "scratch", "emptyDir": {}}, *worker["extraVolumes"]]}


# ------------------------------------------------------------------ against the schemas


def test_the_dask_cluster_is_what_the_operators_crds_accept():
    kinds = by_kind(DASK_CLUSTER)
    assert set(kinds) == {"DaskCluster", "DaskWorkerGroup", "NetworkPolicy"}
    for name in ("daskcluster", "daskworkergroup"):
        kind, api_version, validator = _crd_validator(name)
        assert kinds[kind]["apiVersion"] == api_version
        assert _errors(validator, kinds[kind]) == [], kind
    # The check refuses what the API server's strict validation refuses, and only that.
    _, _, validator = _crd_validator("daskworkergroup")
    planted = deepcopy(kinds["DaskWorkerGroup"])
    planted["spec"]["worker"]["custom_worker_command"] = ["dask", "worker"]
    assert _errors(validator, planted) == ["spec.worker: Additional properties are not allowed "
                                           "('custom_worker_command' was unexpected)"]
    assert kinds["DaskWorkerGroup"]["spec"]["cluster"] == kinds["DaskCluster"]["metadata"]["name"]


def test_the_prefect_worker_values_are_what_the_chart_accepts():
    merged, schema = _chart()
    # Its $schema names no draft; its keywords (dependencies) are draft 7's, as Helm reads them.
    validator = jsonschema.Draft7Validator(schema)
    assert _errors(validator, merged) == []
    # The schema lets unknown keys through at its top level, where a misspelt section would be
    # ignored as the Dask chart ignored custom_worker_command: none is.
    (values,) = documents(PREFECT_VALUES)
    assert set(values) <= set(schema["properties"]), set(values) - set(schema["properties"])
    assert _errors(validator, _helm_values(merged, {"worker": {"image": {"pullpolicy": "Never"}}})) == [
        "worker.image: Additional properties are not allowed ('pullpolicy' was unexpected)"]


def test_every_pod_spec_and_plain_manifest_passes_strict_kubernetes_validation():
    kinds = by_kind(DASK_CLUSTER)
    _validate(kinds["NetworkPolicy"])
    merged, _ = _chart()
    pods = {**dask_pods(), "prefect-worker": _chart_pod(merged["worker"])}
    for role, spec in pods.items():
        _validate(_as_pod(role, spec))
        volumes = {volume["name"] for volume in spec["volumes"]}
        for container in [*spec["containers"], *spec.get("initContainers", [])]:
            assert {m["name"] for m in container.get("volumeMounts", [])} <= volumes, (role, container["name"])
    planted = _as_pod("planted", deepcopy(pods["gpu"]))
    planted["spec"]["containers"][0]["resource"] = planted["spec"]["containers"][0].pop("resources")
    with pytest.raises(AssertionError, match="resource"):
        _validate(planted)


# ------------------------------------------------------------------ what the pods are given


def _env(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env", [])}


def _secret_files(spec: dict, container: dict) -> dict[str, tuple[str, str]]:
    """Each file path the container sees of a mounted Secret -> (Secret, key)."""
    secrets = {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}
    files = {}
    for mount in container.get("volumeMounts", []):
        if mount["name"] in secrets:
            secret = secrets[mount["name"]]
            for item in secret.get("items", []):
                files[f"{mount['mountPath']}/{item['path']}"] = (secret["secretName"], item["key"])
    return files


def _quantity(value: str | int) -> Decimal:
    """A Kubernetes quantity (2, 100m, 4Gi, 512Mi) as a number."""
    suffixes = {"m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
                "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    number, suffix = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value)).groups()
    return Decimal(number) * Decimal(suffixes[suffix] if suffix else 1)


def _scheduler_address() -> str:
    cluster = by_kind(DASK_CLUSTER)["DaskCluster"]
    (port,) = [p["port"] for p in cluster["spec"]["scheduler"]["service"]["ports"] if p["name"] == "tcp-comm"]
    return f"tls://{cluster['metadata']['name']}-scheduler:{port}"


def test_the_dask_pods_speak_tls_get_credentials_and_the_gpu_group_offers_its_gpu():
    pods = dask_pods()
    roles = {"scheduler": "scheduler", "cpu": "worker", "gpu": "worker"}
    for role, spec in pods.items():
        (container,) = spec["containers"]
        env = _env(container)
        assert spec["automountServiceAccountToken"] is False, role
        assert container["command"] == ["dask", roles[role]], role
        # TLS only, with the CA and the role's own certificate and key, mounted from the Secret.
        assert env[REQUIRE_ENCRYPTION]["value"] == "True", role
        files = _secret_files(spec, container)
        tls = {name: item["value"] for name, item in env.items() if name.startswith(DASK_TLS)}
        own = {("vlcorpus-dask-tls", key) for key in ("ca.pem", f"{roles[role]}.pem", f"{roles[role]}-key.pem")}
        assert {files[path] for path in tls.values()} == own == set(files.values()), role
        # Requests that the node keeps: memory limited at what is asked for, which a worker's
        # memory limit follows (no --memory-limit).
        resources = container["resources"]
        assert resources["limits"]["memory"] == resources["requests"]["memory"], role
        assert "--memory-limit" not in container["args"]
    scheduler, cpu, gpu = (pods[r]["containers"][0] for r in ("scheduler", "cpu", "gpu"))
    # The scheduler: TLS on 8786, its HTTP pages (and the API the operator retires workers
    # through) on the pod's address, behind the Service's ports of the names the operator uses.
    args = scheduler["args"]
    assert args[args.index("--protocol") + 1] == "tls" and args[args.index("--dashboard-address") + 1] == ":8787"
    routes = ast.literal_eval(_env(scheduler)["DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES"]["value"])
    assert "distributed.http.scheduler.api" in routes and "distributed.http.health" in routes
    service = by_kind(DASK_CLUSTER)["DaskCluster"]["spec"]["scheduler"]["service"]
    assert service["type"] == "ClusterIP"
    assert {p["name"]: p["port"] for p in service["ports"]} == {"tcp-comm": 8786, "http-dashboard": 8787}
    assert {p["name"]: p["containerPort"] for p in scheduler["ports"]} == {"tcp-comm": 8786, "http-dashboard": 8787}
    # Workers: the tls:// address, named as the operator names their Deployments, the Prefect
    # server's auth string and the root's credentials; both groups alike but for their shape.
    for worker in (cpu, gpu):
        env = _env(worker)
        assert env["DASK_SCHEDULER_ADDRESS"]["value"] == _scheduler_address()
        assert worker["args"][worker["args"].index("--name") + 1] == "$(DASK_WORKER_NAME)"
        assert worker["args"][worker["args"].index("--dashboard-address") + 1].startswith("127.0.0.1:")
        assert env["PREFECT_API_AUTH_STRING"]["valueFrom"] == {"secretKeyRef": {"name": "vlcorpus-prefect",
                                                                                 "key": "auth-string"}}
        assert worker["envFrom"] == [{"secretRef": {"name": "vlcorpus-credentials"}}]
    assert {k: v for k, v in _env(gpu).items() if k != "VLCORPUS_DECODE_WORKERS"} == _env(cpu)
    for key in ("envFrom", "volumeMounts", "imagePullPolicy", "image", "command"):
        assert gpu[key] == cpu[key], key
    assert pods["gpu"]["volumes"] == pods["cpu"]["volumes"]
    # The GPU group: a GPU a worker, one thread, GPU=1, on GPU nodes (the user's label and
    # taint), decoding with the cores it asked for.
    gpu_args = gpu["args"]
    assert gpu_args[gpu_args.index("--resources") + 1] == "GPU=1" and gpu_args[gpu_args.index("--nthreads") + 1] == "1"
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == "1"  # the CRD takes quantities as strings only
    assert pods["gpu"]["nodeSelector"] and pods["gpu"]["tolerations"]
    assert _quantity(_env(gpu)["VLCORPUS_DECODE_WORKERS"]["value"]) == _quantity(gpu["resources"]["requests"]["cpu"])
    assert "--resources" not in cpu["args"] and "nvidia.com/gpu" not in json.dumps(cpu["resources"])
    assert _quantity(cpu["args"][cpu["args"].index("--nthreads") + 1]) == _quantity(cpu["resources"]["requests"]["cpu"])


def test_the_scheduler_is_closed_but_to_the_namespace_over_tls_and_to_the_operator():
    policy = by_kind(DASK_CLUSTER)["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"dask.org/cluster-name": "vlcorpus",
                                                    "dask.org/component": "scheduler"}
    assert policy["policyTypes"] == ["Ingress"]
    by_port = {rule["ports"][0]["port"]: rule["from"] for rule in policy["ingress"]}
    assert by_port == {8786: [{"podSelector": {}}], 8787: [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": _operator_namespace()}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "dask-kubernetes-operator"}}}]}
    for path in (DASK_CLUSTER, PREFECT_VALUES):
        assert not re.search(r"LoadBalancer|NodePort|hostPort|hostNetwork", path.read_text()), path


def test_the_prefect_worker_pulls_its_image_reaches_its_server_and_its_root():
    merged, _ = _chart()
    worker = merged["worker"]
    assert worker["image"]["pullPolicy"] == "IfNotPresent"
    assert worker["config"]["type"] == "process" and worker["config"]["workPool"] == "vlcorpus"
    # Its own command, with the chart's args (which go with the chart's command) written out.
    assert worker["command"] == ["prefect", "worker", "start"]
    args = worker["args"]
    assert args[args.index("--type") + 1] == worker["config"]["type"]
    assert args[args.index("--pool") + 1] == worker["config"]["workPool"]
    assert worker["apiConfig"] == "selfHostedServer"
    server = worker["selfHostedServerApiConfig"]
    assert server["apiUrl"] == "http://prefect-server:4200/api"
    assert server["basicAuth"]["enabled"] is True and server["basicAuth"]["existingSecret"] == "vlcorpus-prefect"
    for kind in ("cpu", "memory"):
        assert _quantity(worker["resources"]["limits"][kind]) >= _quantity(worker["resources"]["requests"][kind]), kind
    # Its builds run on the Dask cluster, as a client of it, with the root's credentials.
    pod = _chart_pod(worker)
    (container,) = pod["containers"]
    env = _env(container)
    assert env["VLCORPUS_DASK_ADDRESS"]["value"] == _scheduler_address()
    assert env[REQUIRE_ENCRYPTION]["value"] == "True"
    files = _secret_files(pod, container)
    assert {files[item["value"]] for name, item in env.items() if name.startswith(DASK_TLS)} == {
        ("vlcorpus-dask-tls", key) for key in ("ca.pem", "client.pem", "client-key.pem")}
    assert container["envFrom"] == dask_pods()["cpu"]["containers"][0]["envFrom"]
    # The deploy: the same server and auth string, HOME on the chart's scratch volume.
    (deploy,) = pod["initContainers"]
    deploy_env = _env(deploy)
    assert deploy_env["PREFECT_API_URL"]["value"] == server["apiUrl"]
    assert deploy_env["PREFECT_API_AUTH_STRING"]["valueFrom"]["secretKeyRef"] == {"name": "vlcorpus-prefect",
                                                                                   "key": "auth-string"}
    assert deploy_env["HOME"]["value"] in {m["mountPath"] for m in deploy["volumeMounts"] if m["name"] == "scratch"}
    assert merged["role"]["create"] is False and merged["rolebinding"]["create"] is False


def _flags(argv: list[str], names: tuple[str, ...]) -> dict[str, str]:
    return {name: argv[argv.index(name) + 1] for name in names if name in argv}


def test_compose_runs_the_pods_dask_commands_with_the_same_gpu_resource():
    (compose,) = documents(INFRA / "docker-compose.yaml")
    services = compose["services"]
    pods = {role: spec["containers"][0] for role, spec in dask_pods().items()}
    for service, role, names in (("dask-scheduler", "scheduler", ("--protocol", "--port")),
                                 ("dask-worker-cpu", "cpu", ("--nthreads", "--resources")),
                                 ("dask-worker-gpu", "gpu", ("--nthreads", "--resources"))):
        command, pod = services[service]["command"], pods[role]
        assert command[:2] == pod["command"], service
        assert _flags(command, names) == _flags(pod["args"], names), service
    (device,) = services["dask-worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["count"] == int(pods["gpu"]["resources"]["limits"]["nvidia.com/gpu"]) == 1


# ------------------------------------------------------------------ infra/README.md's steps


def _kubernetes_block() -> list[str]:
    (block,) = [b for b in code_blocks(INFRA / "README.md") if "kubectl apply" in b.text]
    return commands(block)


def _operator_namespace() -> str:
    (install,) = [line for line in _kubernetes_block() if "dask-kubernetes-operator" in line]
    words = install.split()
    return words[words.index("-n") + 1]


def _option(line: str, name: str) -> str:
    words = line.split()
    return words[words.index(name) + 1]


def test_the_readme_steps_install_create_apply_point_and_check_in_order(tmp_path):
    lines = _kubernetes_block()
    steps = ["docker build", "helm install --repo https://helm.dask.org", "helm install prefect-worker", "make secrets",
             "kubectl create secret generic vlcorpus-dask-tls", "kubectl create secret generic vlcorpus-prefect",
             "kubectl create secret generic vlcorpus-credentials", "kubectl create secret generic vlcorpus-google",
             "kubectl apply -f", "kubectl exec deploy/prefect-worker -c prefect-worker -- prefect deployment run",
             "kubectl exec deploy/prefect-worker -c prefect-worker -- python"]
    found = [next(i for i, line in enumerate(lines) if line.startswith(step)) for step in steps]
    assert found == sorted(found), lines
    build, operator, chart, _, tls, prefect, credentials, google, apply, run, _check = (lines[i] for i in found)
    # The image every pod runs, built and pushed where the nodes pull it.
    (image,) = {c["image"] for spec in _pods() for c in spec["containers"]}
    assert build == f"docker build -f infra/docker/Dockerfile -t {image} . && docker push {image}"
    # The releases whose schemas the tests above read.
    assert _option(operator, "--version") == OPERATOR and "dask-kubernetes-operator" in operator.split()
    assert _option(chart, "--version") == PREFECT_CHART[0]
    assert _option(chart, "-f") == "infra/k8s/prefect-worker-values.yaml"
    assert _option(chart, "--repo") == "https://prefecthq.github.io/prefect-helm"
    assert apply == "kubectl apply -f infra/k8s/dask-cluster.yaml"
    # The Secrets the files read, with the keys they read, from what `make secrets` makes.
    refs = _secret_refs()
    made = tmp_path / "tls"
    make_tls(made)
    assert tls == "kubectl create secret generic vlcorpus-dask-tls --from-file=infra/tls/"
    assert refs.pop("vlcorpus-dask-tls") <= {p.name for p in made.iterdir()}
    assert refs.pop("vlcorpus-prefect") == {"auth-string"}
    env_file = tmp_path / ".env"
    make_env_file(env_file)
    (substituted,) = re.findall(r"--from-env-file=<\((.+)\)$", prefect)
    made_env = subprocess.run(["bash", "-c", substituted.replace("infra/.env", str(env_file))],
                              capture_output=True, text=True, check=True).stdout
    auth = re.search(r"^PREFECT_API_AUTH_STRING=(.+)$", env_file.read_text(), re.M).group(1)
    assert made_env == f"auth-string={auth}\n"
    # The root's: as environment for every pod that touches the root, and Google's key file
    # where that environment's GOOGLE_APPLICATION_CREDENTIALS says.
    assert credentials.startswith("kubectl create secret generic vlcorpus-credentials --from-env-file=")
    assert refs.pop("vlcorpus-google") == {"*"}
    key = re.fullmatch(r"kubectl create secret generic vlcorpus-google --from-file=([\w.-]+)=\S+", google).group(1)
    mounts = {m["mountPath"] for spec in _pods() for c in spec["containers"] for m in c.get("volumeMounts", [])
              if m["name"] == "google"}
    readme = (INFRA / "README.md").read_text()
    (google_path,) = re.findall(r"^GOOGLE_APPLICATION_CREDENTIALS=(\S+)", readme, re.M)
    assert {f"{mount}/{key}" for mount in mounts} == {google_path}
    assert refs == {}
    # The deployment's builds on the cluster's scheduler.
    assert f"dask_address={_scheduler_address()}" in run.split()
    # What the prose shows: scaling a group (through the CRD's scale subresource), the dashboard.
    kinds = by_kind(DASK_CLUSTER)
    cluster, group = kinds["DaskCluster"]["metadata"]["name"], kinds["DaskWorkerGroup"]["metadata"]["name"]
    prose = " ".join(readme.split())
    assert f"`kubectl scale daskworkergroup {group} --replicas=N` (the CPU group is `{cluster}-default`)" in prose
    (version,) = _crd("daskworkergroup")["spec"]["versions"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.worker.replicas"
    assert f"`kubectl port-forward svc/{cluster}-scheduler 8787`" in prose


def _pods() -> list[dict]:
    """Every pod spec: the Dask cluster's and the Prefect worker's."""
    merged, _ = _chart()
    return [*dask_pods().values(), _chart_pod(merged["worker"])]


def _secret_refs() -> dict[str, set[str]]:
    """Secret -> the keys the Kubernetes files read of it (env, volumes): "*" for a volume
    without items, which shows every key; the Secret taken whole as envFrom, vlcorpus-credentials,
    is left out."""
    refs: dict[str, set[str]] = {}
    for spec in _pods():
        for volume in spec["volumes"]:
            if "secret" in volume:
                keys = {item["key"] for item in volume["secret"].get("items", [])}
                refs.setdefault(volume["secret"]["secretName"], set()).update(keys or {"*"})
        for container in [*spec["containers"], *spec.get("initContainers", [])]:
            for item in container.get("env", []):
                if "secretKeyRef" in item.get("valueFrom", {}):
                    ref = item["valueFrom"]["secretKeyRef"]
                    refs.setdefault(ref["name"], set()).add(ref["key"])
            for source in container.get("envFrom", []):
                refs.setdefault(source["secretRef"]["name"], set())
    assert refs.pop("vlcorpus-credentials") == set()
    return refs


# ------------------------------------------------------------------ the pods' commands, run here


def _kubelet(spec: dict, container: dict, secrets: dict[str, dict[str, str]], folder: Path,
             injected: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """A container's argv and environment as its pod would give them: each mounted Secret's
    items as files (in ``folder``, for its mount path), env and envFrom from ``secrets``, then
    the operator's ``injected`` variables where the container sets none, and $(VAR) expanded."""
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    mounted = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None or (secret["secretName"] not in secrets and secret.get("optional")):
            continue
        data = secrets[secret["secretName"]]
        local = folder / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        for item in secret.get("items") or [{"key": key, "path": key} for key in data]:
            (local / item["path"]).write_text(data[item["key"]])
        mounted[mount["mountPath"]] = str(local)
    env = {name: value for source in container.get("envFrom", []) for name, value in
           secrets[source["secretRef"]["name"]].items()}
    for item in container.get("env", []):
        if "value" in item:
            value = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            value = secrets[ref["name"]][ref["key"]]
        for path, local in mounted.items():
            if value.startswith(path + "/"):
                value = local + value[len(path):]
        env[item["name"]] = value
    env = {**injected, **env}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], word)
            for word in container["command"] + container.get("args", [])]
    return argv, env


def _started(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DASK_", "PREFECT_", "VLCORPUS_"))}
    return subprocess.Popen([str(BIN / argv[0]), *argv[1:]], env={**base, **env}, cwd=ROOT, start_new_session=True)


def _api(dashboard: int, path: str, body: dict | None = None) -> dict:
    """The scheduler's HTTP API, as the operator calls it (plain HTTP on the dashboard port)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{dashboard}{path}", data)
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


@pytest.mark.slow
def test_the_operators_pods_start_as_written_and_scale_down_through_the_schedulers_api(tmp_path):
    """The scheduler's and both groups' containers, run as their pods would run them (their
    commands, env, the Secrets' files at their mount paths, the operator's injections), here on
    127.0.0.1 (a host and ports of their own, appended: the last wins): the workers find the
    TLS scheduler by DASK_SCHEDULER_ADDRESS, named after their Deployments; the README's GPU
    check, run with the Prefect worker's environment, lists the GPU worker with GPU=1; and
    the scheduler's HTTP API, where the operator scales down, retires a worker by that name."""
    make_tls(tmp_path / "tls")
    make_env_file(tmp_path / ".env")
    auth = re.search(r"^PREFECT_API_AUTH_STRING=(.+)$", (tmp_path / ".env").read_text(), re.M).group(1)
    secrets = {"vlcorpus-dask-tls": {p.name: p.read_text() for p in (tmp_path / "tls").iterdir()},
               "vlcorpus-prefect": {"auth-string": auth}, "vlcorpus-credentials": {}}
    pods = dask_pods()
    scheduler_file = tmp_path / "scheduler.json"
    argv, env = _kubelet(pods["scheduler"], pods["scheduler"]["containers"][0], secrets, tmp_path / "scheduler", {})
    procs = [_started([*argv, "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
                       "--scheduler-file", str(scheduler_file)], env)]
    try:
        while not scheduler_file.exists():
            assert procs[0].poll() is None, "the scheduler exited"
            time.sleep(0.1)
        identity = json.loads(scheduler_file.read_text())
        address, dashboard = identity["address"], identity["services"]["dashboard"]
        assert address.startswith("tls://127.0.0.1:")

        def dns(value: str) -> str:  # the Service's name (as given, or the operator's FQDN) -> here
            return re.sub(r"://vlcorpus-scheduler(\.[\w.]+)?:8786", f"://{address.split('://')[1]}", value)

        names = {}
        for group, prefix in (("cpu", "vlcorpus-default"), ("gpu", "vlcorpus-gpu")):
            names[group] = f"{prefix}-worker-0123456789"
            # What the operator adds to each worker container (build_worker_deployment_spec):
            # its Deployment's name, and a tcp:// scheduler address where the container sets none.
            injected = {"DASK_WORKER_NAME": names[group],
                        "DASK_SCHEDULER_ADDRESS": "tcp://vlcorpus-scheduler.default.svc.cluster.local:8786"}
            argv, env = _kubelet(pods[group], pods[group]["containers"][0], secrets, tmp_path / group, injected)
            procs.append(_started([*argv, "--host", "127.0.0.1"], {k: dns(v) for k, v in env.items()}))
        while _api(dashboard, "/api/v1/get_workers")["num_workers"] < 2:
            assert all(proc.poll() is None for proc in procs), "a pod's process exited"
            time.sleep(0.2)
        # infra/README.md's check, in the Prefect worker's container.
        (check,) = [line for line in _kubernetes_block() if line.startswith(
            "kubectl exec deploy/prefect-worker -c prefect-worker -- python")]
        merged, _ = _chart()
        pod = _chart_pod(merged["worker"])
        argv, env = _kubelet(pod, pod["containers"][0], secrets, tmp_path / "prefect-worker", {})
        words = shlex.split(check)
        shown = subprocess.run([sys.executable, *words[words.index("--") + 2:]], capture_output=True, text=True,
                               timeout=120, env={**os.environ, **{k: dns(v) for k, v in env.items()}})
        assert shown.returncode == 0, shown.stderr[-2000:]
        assert ast.literal_eval(shown.stdout.strip()) == {names["cpu"]: {}, names["gpu"]: {"GPU": 1}}
        # Scale-down as the operator does it: the scheduler picks, retires, and names the worker
        # whose Deployment the operator then deletes.
        retired = _api(dashboard, "/api/v1/retire_workers", {"n": 1})
        assert [info["name"] for info in retired.values()] in ([names["cpu"]], [names["gpu"]])
        assert _api(dashboard, "/api/v1/get_workers")["num_workers"] == 1
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):  # one that failed took its group along
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
