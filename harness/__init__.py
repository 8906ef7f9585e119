"""What the tests (``tests/``) and the benchmarks (``bench/``) share, written once.

- :mod:`harness.realredis`, :mod:`harness.topology`, :mod:`harness.postgres`: real servers and
  topologies (replicas, Sentinels, a Redis Cluster, PostgreSQL) on ports of their own;
- :mod:`harness.apps`: the worker apps the spawned processes run;
- :mod:`harness.ports`: free ports from a block per pytest-xdist worker;
- :mod:`harness.waiting`: :func:`eventually` (async) and :func:`wait_until` (sync);
- :mod:`harness.procs`: real ``python -m worker`` processes (:class:`WorkerProc`);
- :mod:`harness.records`: what the processes and apps wrote (the ledger app's counts, …);
- :mod:`harness.leases`: :class:`FixedLease`, a leader view with a fixed lock value;
- :mod:`harness.timings`: the fast leadership timings the processes run with;
- :mod:`harness.settled`: a fake clock whose steps wait for the Redis replies in flight;
- :mod:`harness.xdist_group`: the `xdist_group` marks kept on the pytest this runs on;
- the scenarios the suite runs short and ``bench/`` runs long (:mod:`harness.soak`,
  :mod:`harness.failover_scenario`, :mod:`harness.shard_failover`).

The names most tests need are re-exported here (``from harness import Spawn, wait_until``).
Not shipped (the wheel holds ``worker`` only); no pytest import, so ``bench/`` loads any of it.
"""

from harness.clients import client_call
from harness.leases import FixedLease
from harness.ports import free_port, free_port_pair, free_ports
from harness.procs import ROOT, CliRun, Spawn, WorkerProc
from harness.records import ledger
from harness.timings import FAST_ENV
from harness.waiting import eventually, wait_until

__all__ = [
    "FAST_ENV",
    "ROOT",
    "CliRun",
    "FixedLease",
    "Spawn",
    "WorkerProc",
    "client_call",
    "eventually",
    "free_port",
    "free_port_pair",
    "free_ports",
    "ledger",
    "wait_until",
]
