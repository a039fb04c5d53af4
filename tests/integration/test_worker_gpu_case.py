"""A worker started ``--gpu H100`` is an H100 worker as the fleet names one: its heartbeats say
``h100`` and pool ``h100@MODEL``, as ``--fleet H100:2`` names the pool. (The GPU type was
checked without regard to case and sent as given: the streams found no price under ``H100``
and billed the worker nothing, and the autoscaler kept it apart from the ``h100`` pool.)"""

import asyncio
import subprocess
import sys

from tests.integration.worker_support import Observer


def test_a_worker_names_its_gpu_type_as_the_fleet_does(kafka_bootstrap, catalog):
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "worker", "--slot", "0", "--gpu", "H100",
         "--bootstrap", kafka_bootstrap, "--namespace", catalog.namespace],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        async def first_status():
            async with Observer(kafka_bootstrap, catalog) as observer:
                await observer.until(lambda: observer.statuses, timeout_s=60)
                return observer.statuses[0]

        status = asyncio.run(first_status())
    finally:
        proc.kill()
        out, _ = proc.communicate()
    assert (status.gpu_type, status.pool) == ("h100", "h100@llama-3-8b"), out[-2000:]
