"""flows.clusters.scheduler_workers: the workers a build's client sees are the scheduler's, each
time it asks. The GPU routing of a build's stages reads them; the client's cached identity,
which its poll of the scheduler leaves without workers, would send featurize to no GPU."""

from __future__ import annotations

import dask
from distributed import Client, LocalCluster

from flows.clusters import scheduler_workers


def test_the_workers_are_the_schedulers_while_the_clients_poll_runs():
    # The poll every millisecond instead of every 2 s: its worker-less answers land between
    # the asks hundreds of times over, as they did now and then on a busy machine.
    with dask.config.set({"distributed.client.scheduler-info-interval": "1ms"}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=False, resources={"GPU": 1},
                         dashboard_address=None) as cluster, Client(cluster) as client:
        seen = [[w["resources"] for w in scheduler_workers(client).values()] for _ in range(300)]
    assert seen.count([{"GPU": 1}]) == 300, [s for s in seen if s != [{"GPU": 1}]][:3]
