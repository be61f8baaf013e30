"""The Dask cluster the server's compare and replay jobs run on (`accuracy serve --cluster`).

Jobs run in child processes (jobs.py). Starting a `LocalCluster` in each would cost seconds per
job, so for `local:N` the server starts one at startup (loopback only, through
accuracy.cluster.dask_client) and hands its scheduler address, `tcp://127.0.0.1:PORT`, to every
job child, which connects to it as to any remote scheduler; the cluster stops with the server.
A `tcp://host:port` spec is handed to the children as given. Without --cluster this module is
never imported, and neither is Dask.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

log = logging.getLogger(__name__)


class JobCluster:
    """Owns the server's cluster (if it started one) and says where job children connect."""

    def __init__(self, spec: str) -> None:
        from accuracy.cluster import dask_client, parse_cluster

        kind, value = parse_cluster(spec)  # ClusterError: a one-line message for the operator
        self.spec = spec
        self._stack = contextlib.ExitStack()
        if kind == "local":
            client: Any = self._stack.enter_context(dask_client(spec))
            self.address: str = client.scheduler.address
            log.info("started a Dask LocalCluster with %s workers at %s", value, self.address)
        else:
            self.address = str(value)

    def describe(self) -> str:
        """One line for the operator: what jobs run on."""
        if self.address == self.spec:
            return f"jobs run on the Dask cluster at {self.address}"
        return f"jobs run on a Dask cluster {self.spec} (scheduler {self.address})"

    def close(self) -> None:
        """Stop the cluster the server started (idempotent); a remote one is left running."""
        self._stack.close()
