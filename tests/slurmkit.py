"""A real one-node SLURM cluster for the tests, started once per machine and shared by every test
process that uses it: Debian's slurm-wlm and munge, without systemd or cgroups
(``proctrack/linuxproc``, ``task/none``), two fake GPUs as gres (``File=/dev/null`` and
``File=/dev/zero``: a gres without a File drains the node), and two partitions on the node,
``cpu`` (the default) and ``gpu``, as docs/scale.md's config names them.

The first process that needs it starts it (under a lock); each process registers its pid while
it uses it, and the last one to leave stops the daemons by the pids they wrote, after checking
each pid is still a SLURM daemon's. Clients find it through ``SLURM_CONF``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HOME = Path(f"/tmp/vlcorpus-slurm-{os.getuid()}")
CONF = HOME / "slurm.conf"
DAEMONS = {"slurmctld": HOME / "slurmctld.pid", "slurmd": HOME / "slurmd.pid"}
# The node offers more CPUs than the machine has: the tests' jobs mostly wait.
CPUS, MEMORY_MB, GPUS = 8, 16000, 2


def _conf(ctld_port: int, slurmd_port: int) -> str:
    return f"""ClusterName=vlcorpus-tests
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={HOME}/state
SlurmdSpoolDir={HOME}/spool
SlurmctldPidFile={DAEMONS['slurmctld']}
SlurmdPidFile={DAEMONS['slurmd']}
SlurmctldLogFile={HOME}/slurmctld.log
SlurmdLogFile={HOME}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
GresTypes=gpu
ReturnToService=2
MpiDefault=none
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
MinJobAge=60
KillWait=5
NodeName=localhost CPUs={CPUS} RealMemory={MEMORY_MB} Gres=gpu:{GPUS} State=UNKNOWN
PartitionName=cpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=localhost MaxTime=INFINITE State=UP
"""


GRES = "NodeName=localhost Name=gpu File=/dev/null\nNodeName=localhost Name=gpu File=/dev/zero\n"
BINARIES = ("slurmctld", "slurmd", "sbatch", "munged")


def unavailable() -> str | None:
    """Why this machine cannot run the tests' SLURM, or None."""
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        return f"needs {', '.join(missing)} (apt-get install -y slurm-wlm munge)"
    if os.getuid() != 0:
        return "the tests' SLURM runs its daemons as root"
    return None


def env() -> dict[str, str]:
    """What a SLURM client needs to find the tests' cluster."""
    return {"SLURM_CONF": str(CONF)}


def _pid_of(name: str) -> int | None:
    """The pid a daemon wrote, if that process is still that daemon."""
    try:
        pid = int(DAEMONS[name].read_text().strip())
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except (OSError, ValueError):
        return None
    return pid if comm == name else None


def _running() -> bool:
    if not all(_pid_of(name) for name in DAEMONS):
        return False
    done = subprocess.run(["sinfo", "-h", "-o", "%T"], env={**os.environ, **env()}, capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() in ("idle", "mixed", "allocated")


def _munge() -> None:
    """munged, unless one answers already (Debian's package made its key)."""
    if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
        return
    run = Path("/run/munge")
    run.mkdir(parents=True, exist_ok=True)
    shutil.chown(run, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
    _until(lambda: subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0,
           "munged answers")


def _until(ready, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"the tests' SLURM: {what} did not happen; see {HOME}/*.log")
        time.sleep(0.2)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start() -> None:
    for pid in job_processes():  # a cluster that died before its jobs did: they are its own
        os.kill(pid, 9)
    _stop()
    for sub in ("state", "spool"):
        shutil.rmtree(HOME / sub, ignore_errors=True)
        (HOME / sub).mkdir(parents=True)
    CONF.write_text(_conf(_free_port(), _free_port()))
    (HOME / "gres.conf").write_text(GRES)
    _munge()
    subprocess.run(["slurmctld", "-f", str(CONF), "-i"], check=True, env={**os.environ, **env()})
    subprocess.run(["slurmd", "-f", str(CONF), "-N", "localhost"], check=True, env={**os.environ, **env()})
    _until(_running, "the node is idle")


def job_processes() -> list[int]:
    """The processes of this cluster's jobs still alive: what a job that ended left running."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SLURM_CONF={CONF}".encode() in environ and any(v.startswith(b"SLURM_JOB_ID=") for v in environ):
                found.append(int(entry.name))
    return found


def _stop() -> None:
    # Jobs first: slurmd kills what an ended job left once KillWait has passed; stopped before
    # that, it would leave them running.
    wait_gone()
    for name in ("slurmd", "slurmctld"):
        pid = _pid_of(name)
        if pid is not None:
            os.kill(pid, 15)
            _until(lambda name=name: _pid_of(name) is None, f"{name} stopped")


def _users() -> Path:
    folder = HOME / "users"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextmanager
def _locked() -> Iterator[None]:
    HOME.mkdir(parents=True, exist_ok=True)
    with open(HOME / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@contextmanager
def slurm_cluster() -> Iterator[dict[str, str]]:
    """The tests' SLURM, up while this process uses it (see ``unavailable``); yields its
    clients' environment."""
    me = _users() / str(os.getpid())
    with _locked():
        if not _running():
            _start()
        me.touch()
    try:
        yield env()
    finally:
        with _locked():
            me.unlink(missing_ok=True)
            for user in _users().iterdir():
                if not (user.name.isdigit() and _alive(int(user.name))):
                    user.unlink(missing_ok=True)
            if not any(_users().iterdir()):
                _stop()


def queue(names: list[str]) -> list[str]:
    """The jobs of ``names`` that are pending, running or completing: ``squeue``'s lines."""
    done = subprocess.run(["squeue", "-h", "--me", f"--name={','.join(names)}", "-t", "PD,CF,R,CG",
                           "-o", "%i %j %T"], env={**os.environ, **env()}, capture_output=True, text=True, check=True)
    return done.stdout.split("\n")[:-1]


def wait_gone() -> None:
    """Until no process of a job is left (a cancelled job's worker closes, and exits if its
    close hangs: flows/clusters/worker_exit.py); fails after a minute."""
    _until(lambda: not job_processes(), "the jobs' processes ended")
