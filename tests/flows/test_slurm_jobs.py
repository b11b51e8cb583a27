"""What the SLURM cluster submits and how its pools scale, without a SLURM: each pool's job
script as sbatch would get it, the GPU a GPU worker keeps, the config's cluster section and the
order in which a build picks its cluster, the tasks each pool counts on a real scheduler, and
when a job may go. tests/flows/test_slurm.py runs all of it on a real one."""

from __future__ import annotations

import time

import pytest

from flows import clusters
from flows.gpu_worker_start import own_gpu
from flows.clusters.scaling import Job, Pool, Scaler, job_of, pool_demand, sbatch_error
from flows.clusters.slurm import _seconds, job_scripts
from pipeline.config import ConfigError, parse_config
from pipeline.config.cluster import slurm_memory

SLURM = {"kind": "slurm", "partition": "batch", "account": "mylab", "qos": "normal", "walltime": "02:00:00",
         "prologue": ["module load cuda/12.4", "source ~/venv/bin/activate"], "python": "/opt/venv/bin/python",
         "cpu": {"cores": 4, "memory": "16GB", "processes": 2, "max_jobs": 8},
         "gpu": {"partition": "gpu", "cores": 8, "memory": "64GB", "processes": 2, "max_jobs": 2,
                 "qos": "gpu", "walltime": "1-00:00:00", "extra_directives": ["--constraint=a100"]}}


def _cfg(cluster: dict | None = None, **execution):
    return parse_config({"name": "tours", "root": "/data/tours", "sources": [{"type": "urls", "urls": ["x"]}],
                         "execution": {**({"cluster": cluster} if cluster else {}), **execution}})


def _directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_each_pools_job_script_asks_slurm_for_what_the_config_says(tmp_path):
    cfg = _cfg({**SLURM, "log_dir": str(tmp_path / "logs")}, threads_per_worker=2)
    scripts = job_scripts(cfg.execution.cluster, cfg, cfg.corpus_root())
    cpu, gpu = _directives(scripts["cpu"]), _directives(scripts["gpu"])
    assert cpu == ["-J vlcorpus-tours-cpu", f"-e {tmp_path}/logs/vlcorpus-tours-cpu-%J.err",
                   f"-o {tmp_path}/logs/vlcorpus-tours-cpu-%J.out", "-p batch", "-A mylab", "-n 1",
                   "--cpus-per-task=4", "--mem=16G", "-t 02:00:00", "--qos=normal"]
    assert gpu[:4] == ["-J vlcorpus-tours-gpu", f"-e {tmp_path}/logs/vlcorpus-tours-gpu-%J.err",
                       f"-o {tmp_path}/logs/vlcorpus-tours-gpu-%J.out", "-p gpu"]
    assert gpu[4:] == ["-A mylab", "-n 1", "--cpus-per-task=8", "--mem=64G", "-t 1-00:00:00", "--gres=gpu:2",
                       "--qos=gpu", "--constraint=a100"]
    for script in scripts.values():
        body = [line for line in script.splitlines() if line and not line.startswith("#")]
        assert body[:2] == ["module load cuda/12.4", "source ~/venv/bin/activate"]
        assert body[-1].startswith("/opt/venv/bin/python -m distributed.cli.dask_worker tcp://scheduler:8786 ")
        assert "--nworkers 2 --nanny --death-timeout 60" in body[-1]
    # Workers retire 5 minutes before the walltime, so their tasks go on in another job.
    assert "--lifetime 6900s --lifetime-stagger 60s" in scripts["cpu"]
    assert "--lifetime 86100s" in scripts["gpu"]
    # Two threads a CPU worker, each a CPU slot; a GPU worker one thread and one GPU, its own,
    # and half the cores; only the CPU workers ready yt-dlp.
    assert "--nthreads 2 --memory-limit 7.45GiB" in scripts["cpu"] and "--resources CPU=2" in scripts["cpu"]
    assert "--preload flows.worker_start" in scripts["cpu"] and "gpu_worker_start" not in scripts["cpu"]
    assert "--nthreads 1 --memory-limit 29.80GiB" in scripts["gpu"]
    assert "--resources GPU=1 --preload flows.gpu_worker_start" in scripts["gpu"]
    assert "flows.worker_start" not in scripts["gpu"]
    assert "export VLCORPUS_DECODE_WORKERS=4" in scripts["gpu"] and "DECODE" not in scripts["cpu"]
    assert "GPU=1" not in scripts["cpu"]


def test_a_job_of_one_worker_runs_it_without_a_nanny():
    cfg = _cfg({**SLURM, "cpu": {**SLURM["cpu"], "processes": 1}})
    script = job_scripts(cfg.execution.cluster, cfg, "/tmp/r")["cpu"]
    assert "--no-nanny" in script and "--nworkers" not in script


def test_a_gpu_job_can_ask_with_gpus_and_a_type():
    cfg = _cfg({**SLURM, "gpu": {**SLURM["gpu"], "gpu_option": "gpus", "gpu_type": "a100"}})
    assert "--gpus=a100:2" in _directives(job_scripts(cfg.execution.cluster, cfg, "/tmp/r")["gpu"])
    cfg = _cfg({**SLURM, "gpu": None})
    assert set(job_scripts(cfg.execution.cluster, cfg, "/tmp/r")) == {"cpu"}


def test_a_gpu_worker_keeps_the_gpu_at_its_place_in_its_job():
    assert own_gpu("gpu-3-0", "4,7") == "4" and own_gpu("gpu-3-1", "4,7") == "7"
    assert own_gpu("gpu-3", "5") == "5" and own_gpu("gpu-0", "") == ""


@pytest.mark.parametrize(("walltime", "seconds"), [("30", 1800), ("10:30", 630), ("02:00:00", 7200),
                                                    ("1-00", 86400), ("1-02:30", 95400), ("2-00:00:10", 172810)])
def test_slurms_walltime_formats(walltime, seconds):
    assert _seconds(walltime) == seconds


def test_memory_is_given_to_sbatch_as_written():
    assert [slurm_memory(m) for m in ("32GB", "512MB", "64G", "1.5GiB")] == ["32G", "512M", "64G", "1.5G"]


@pytest.mark.parametrize(("cluster", "execution", "wrong"), [
    ({**SLURM, "host": "10.0.0.1", "interface": "ib0"}, {}, "give host or interface, not both"),
    ({**SLURM}, {"dask_address": "tcp://a:1"}, "the cluster section names one already"),
    ({**SLURM, "walltime": "2 hours"}, {}, "walltime"),
    ({**SLURM, "cpu": {"cores": 2, "memory": "lots", "max_jobs": 1}}, {}, "memory"),
    ({**SLURM, "cpu": {"cores": 2, "memory": "2GB"}}, {}, "max_jobs"),
])
def test_a_cluster_section_that_cannot_hold_is_refused(cluster, execution, wrong):
    with pytest.raises(ConfigError, match=wrong):
        _cfg(cluster, **execution)


def test_the_command_line_then_the_config_then_the_environment_name_the_cluster(monkeypatch):
    monkeypatch.setenv(clusters.ADDRESS_ENV, "tcp://env:8786")
    assert clusters.chosen(_cfg()).address == "tcp://env:8786"
    assert clusters.chosen(_cfg(dask_address="tcp://cfg:1")).address == "tcp://cfg:1"
    assert clusters.chosen(_cfg(SLURM)).kind == "slurm"
    assert clusters.chosen(_cfg(SLURM), "tls://cli:1").address == "tls://cli:1"
    monkeypatch.delenv(clusters.ADDRESS_ENV)
    assert clusters.chosen(_cfg()).kind == "local"
    assert clusters.api_host(_cfg()) == "127.0.0.1"
    assert clusters.api_host(_cfg({**SLURM, "host": "10.1.2.3"})) == "10.1.2.3"


def test_each_pool_counts_its_tasks_on_a_real_scheduler():
    """GPU tasks are the GPU pool's, the rest the CPU pool's; a task whose input is being
    computed is about to be able to run."""
    import dask
    from distributed import Client, Event, LocalCluster

    with LocalCluster(n_workers=1, processes=False, resources={"CPU": 1}, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        gate = Event()
        with dask.annotate(resources={"CPU": 1}):
            running = client.submit(lambda: gate.wait(), key="running")
        with dask.annotate(resources={"GPU": 1}):
            after = client.submit(lambda _: 1, running, key="gpu-after")
            alone = client.submit(lambda: 1, key="gpu-alone")
        with dask.annotate(resources={"CPU": 1}):
            queued = client.submit(lambda: 1, key="cpu-waits-for-a-slot")
        while client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.unrunnable)) < 1:
            time.sleep(0.05)
        demand, imminent = client.run_on_scheduler(lambda dask_scheduler: pool_demand(dask_scheduler))
        assert demand == {"gpu": 1, "cpu": 2} and imminent == {"gpu": 1}
        gate.set()
        assert queued.result() == 1 and not after.done() and not alone.done()


def _pool(gpu: bool) -> Pool:
    return Pool("gpu" if gpu else "cpu", {}, "vlcorpus-x", slots=1, max_jobs=4, idle_s=20.0, gpu=gpu, log_dir=None,
                startups=[6.0])


def _job(name: str, pool: Pool, idle_for: float | None, now: float, holds: bool = False) -> Job:
    return Job(name, pool, job_id="1", joined=True, idle_since=None if idle_for is None else now - idle_for,
               holds=holds)


def test_when_a_job_may_go():
    scaler = Scaler(cluster=None, pools=[])
    now = time.monotonic()
    gpu, cpu = _pool(gpu=True), _pool(gpu=False)
    # A GPU job goes once idle, unless GPU work is about to come and it has been idle less than
    # a job takes to start (6 s here).
    assert scaler._may_go(_job("gpu-0", gpu, 0.5, now), gpu, imminent=False, now=now)
    assert not scaler._may_go(_job("gpu-0", gpu, 2, now), gpu, imminent=True, now=now)
    assert scaler._may_go(_job("gpu-0", gpu, 7, now), gpu, imminent=True, now=now)
    assert not scaler._may_go(_job("gpu-0", gpu, None, now), gpu, imminent=False, now=now)  # busy
    # A CPU job after idle_s, and ten times that while CPU work is about to come.
    assert not scaler._may_go(_job("cpu-0", cpu, 19, now), cpu, imminent=False, now=now)
    assert scaler._may_go(_job("cpu-0", cpu, 21, now), cpu, imminent=False, now=now)
    assert not scaler._may_go(_job("cpu-0", cpu, 100, now), cpu, imminent=True, now=now)
    assert scaler._may_go(_job("cpu-0", cpu, 201, now), cpu, imminent=True, now=now)
    # A job whose workers hold results stays while no other worker could take them.
    holder = _job("gpu-1", gpu, 30, now, holds=True)
    scaler.jobs = {"gpu-1": holder}
    assert not scaler._may_go(holder, gpu, imminent=False, now=now)
    scaler.jobs["cpu-1"] = _job("cpu-1", cpu, None, now)
    assert scaler._may_go(holder, gpu, imminent=False, now=now)
    # A job whose worker has not joined goes at once: nothing ran on it.
    assert scaler._may_go(Job("cpu-2", cpu), cpu, imminent=True, now=now)


def test_the_jobs_in_a_line():
    gpu, cpu = _pool(gpu=True), _pool(gpu=False)
    scaler = Scaler(cluster=None, pools=[cpu, gpu])
    assert scaler.status() == "SLURM: no jobs"
    scaler.jobs = {"cpu-0": Job("cpu-0", cpu, joined=True), "gpu-0": Job("gpu-0", gpu, reason="Resources"),
                   "gpu-1": Job("gpu-1", gpu, reason="Priority"), "gpu-2": Job("gpu-2", gpu, state="RUNNING")}
    assert scaler.status() == ("SLURM: 1 CPU job running, 2 GPU jobs pending (Priority, Resources), "
                               "1 GPU job starting")


def test_a_worker_belongs_to_its_job_and_sbatch_speaks_for_itself():
    jobs = {"cpu-3": None, "gpu-1": None}
    assert [job_of(w, jobs) for w in ("cpu-3", "cpu-3-1", "gpu-1-0", "cpu-31", "gpu-2")] == \
        ["cpu-3", "cpu-3", "gpu-1", None, None]
    failed = ("Command exited with non-zero exit code.\nExit code: 1\nstderr:\nsbatch: error: invalid partition "
              "specified: nope\nsbatch: error: Batch job submission failed: Invalid partition name specified\n")
    assert sbatch_error(failed) == "Batch job submission failed: Invalid partition name specified"


STUCK_CLOSE = """
import asyncio, sys, time
from distributed import Scheduler, Worker
from distributed.diagnostics.plugin import WorkerPlugin
from flows.clusters.worker_exit import exit_if_closing_hangs

class Stuck(WorkerPlugin):
    def teardown(self, worker):  # as a close that waits on a thread that never ends
        time.sleep(3600)

async def main():
    async with Scheduler(host="127.0.0.1", dashboard_address=None) as scheduler:
        worker = await Worker(scheduler.address, host="127.0.0.1", dashboard_address=None)
        if sys.argv[1] == "watched":
            exit_if_closing_hangs(worker)
        await worker.plugin_add(Stuck())
        await worker.close()
    print("closed")

asyncio.run(main())
"""


@pytest.mark.slow
def test_a_worker_whose_close_hangs_exits():
    """A job's worker that SIGTERM began to close, and whose close waits for ever, ends its
    process (after GRACE_S, 20 s), instead of holding the job's CPUs or GPU until SLURM kills it."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STUCK_CLOSE, "watched"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "closed" not in done.stdout, done.stderr[-2000:]
    assert done.stderr.strip().endswith("still closing after 20 s: exiting"), done.stderr[-2000:]
