"""Real Redis topologies for tests and benchmarks, all from the one ``valkey-server`` binary on
free loopback ports: a Sentinel set (a primary, replicas, three Sentinels) and a Redis Cluster.

Both can lose a node on purpose (SIGKILL, as a crash would), wait for the failover the
Sentinels or the cluster perform, and bring the dead node back (it rejoins as a replica).
Nothing here knows the framework; tests and ``bench/failover.py`` drive workers against the
URLs (:attr:`SentinelSet.url`, :attr:`Cluster.url`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from harness.ports import free_port_pair
from worker.runtime.embedded import EmbeddedServer, death_signal_hook, find_server_binary


def wait_for(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last!r})")


def sentinel_state(reply: Any) -> dict[str, Any]:
    """A ``SENTINEL MASTER``/``REPLICAS`` entry as a dict: redis-py up to 6 leaves the flat list
    of names and values, 7 on parses it (``flags`` becomes a set)."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def stop_nodes(nodes: list[Node], root: Path) -> None:
    """Stop every node (one that will not stop left as it is) and remove ``root``, their
    directory, unless ``WORKER_TOPOLOGY_KEEP`` is set (to read the nodes' logs)."""
    for node in nodes:
        with contextlib.suppress(Exception):
            node.stop()
    if not os.environ.get("WORKER_TOPOLOGY_KEEP"):
        shutil.rmtree(root, ignore_errors=True)


class Node:
    """One data node (primary or replica, or a cluster node) with a fixed port and directory,
    restartable in place."""

    def __init__(
        self,
        root: Path,
        name: str,
        port: int,
        extra_args: tuple[str, ...] = (),
        password: str | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.dir = root / name
        self.extra_args = extra_args
        self.password = password
        self.server: EmbeddedServer | None = None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def pid(self) -> int | None:
        return self.server.pid if self.server is not None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def start(self) -> None:
        self.server = EmbeddedServer(
            port=self.port,
            unix_socket=False,
            dir=str(self.dir),
            extra_args=(
                "--repl-diskless-sync",
                "yes",
                "--repl-diskless-sync-delay",
                "0",
                *self.extra_args,
            ),
        )
        self.server.start(timeout=15)
        if self.password:  # set after start: the start-up check pings without a password
            with redis.Redis(host="127.0.0.1", port=self.port) as c:
                c.config_set("masterauth", self.password)
                c.config_set("requirepass", self.password)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.server is not None:
            self.server.kill()

    def pause(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.resume()
            self.server.stop()

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("password", self.password)
        kwargs.setdefault("socket_timeout", 5)
        kwargs.setdefault("socket_connect_timeout", 2)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def role(self) -> str:
        with self.client() as c:
            return str(c.info("replication")["role"])

    def synced_replica_of(self, primary: Node) -> bool:
        """This node replicates ``primary`` and its link is up."""
        with self.client() as c:
            info = c.info("replication")
        return bool(
            info["role"] == "slave"
            and int(info.get("master_port", 0)) == primary.port
            and info.get("master_link_status") == "up"
        )

    def __repr__(self) -> str:
        return f"Node({self.name}, port={self.port}, pid={self.pid})"


class SentinelSet:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels (quorum 2) monitoring it as
    ``master``. Failure detection after ``down_after_ms``; a failover may take a few seconds
    more (election, promotion, reconfiguration)."""

    def __init__(
        self,
        *,
        replicas: int = 1,
        sentinels: int = 3,
        master: str = "mymaster",
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        password: str | None = None,
        sentinel_password: str | None = None,
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="worker-sentinel-", dir="/tmp"))
        self.master = master
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.password = password
        self.sentinel_password = sentinel_password
        self.nodes = [
            Node(self.root, f"node{i}", free_port_pair(), password=password)
            for i in range(replicas + 1)
        ]
        self.sentinel_ports = [free_port_pair() for _ in range(sentinels)]
        self._sentinels: list[subprocess.Popen[bytes]] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> SentinelSet:
        first, *rest = self.nodes
        first.start()
        for node in rest:
            node.start()
            with node.client() as c:
                c.replicaof(*first.address)
        for node in rest:
            wait_for(lambda n=node: n.synced_replica_of(first), timeout, f"{node} to sync")
        for port in self.sentinel_ports:
            self._sentinels.append(self._start_sentinel(port, first))
        for port in self.sentinel_ports:
            wait_for(
                lambda p=port: self._sentinel_ready(p),
                timeout,
                f"sentinel :{port} to see the primary, its replicas and the other sentinels",
            )
        return self

    def _start_sentinel(self, port: int, primary: Node) -> subprocess.Popen[bytes]:
        conf = self.root / f"sentinel-{port}.conf"
        lines = [
            f"port {port}",
            "bind 127.0.0.1",
            f"dir {self.root}",
            f"logfile {self.root}/sentinel-{port}.log",
            f"sentinel monitor {self.master} 127.0.0.1 {primary.port} 2",
            f"sentinel down-after-milliseconds {self.master} {self.down_after_ms}",
            f"sentinel failover-timeout {self.master} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {self.master} 1",
        ]
        if self.password:
            lines.append(f"sentinel auth-pass {self.master} {self.password}")
        if self.sentinel_password:
            lines.append(f"requirepass {self.sentinel_password}")
            lines.append(f"sentinel sentinel-pass {self.sentinel_password}")
        conf.write_text("\n".join(lines) + "\n")
        log = open(self.root / f"sentinel-{port}.out", "ab")  # noqa: SIM115 - child owns it
        try:
            return subprocess.Popen(
                [find_server_binary(), str(conf), "--sentinel"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=death_signal_hook(),  # a killed test run takes them down too
            )
        finally:
            log.close()

    def sentinel_client(self, port: int) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=port,
            password=self.sentinel_password,
            socket_timeout=2,
            socket_connect_timeout=1,
            decode_responses=True,
        )

    def _sentinel_ready(self, port: int) -> bool:
        with self.sentinel_client(port) as c:
            info = sentinel_state(c.execute_command("SENTINEL", "MASTER", self.master))
            replicas = c.execute_command("SENTINEL", "REPLICAS", self.master)
        return (
            int(info.get("num-other-sentinels", 0)) >= len(self.sentinel_ports) - 1
            and int(info.get("num-slaves", 0)) >= len(self.nodes) - 1
            and len(replicas) >= len(self.nodes) - 1
        )

    def close(self) -> None:
        for proc in self._sentinels:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        stop_nodes(self.nodes, self.root)

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses ------------------------------------------------------------------------------
    def url(self, *, db: int = 0, user: str | None = None) -> str:
        """``redis+sentinel://…`` naming every Sentinel (the data nodes' password included when
        the set has one; the Sentinels' password is not in it)."""
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        auth = ""
        if self.password:
            auth = f"{user or ''}:{self.password}@"
        return f"redis+sentinel://{auth}{hosts}/{self.master}/{db}"

    def primary_port(self) -> int | None:
        """The primary's port as a majority of the reachable Sentinels name it."""
        votes: dict[int, int] = {}
        for port in self.sentinel_ports:
            try:
                with self.sentinel_client(port) as c:
                    addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master)
            except redis.RedisError:
                continue
            if addr:
                votes[int(addr[1])] = votes.get(int(addr[1]), 0) + 1
        if not votes:
            return None
        port, count = max(votes.items(), key=lambda kv: kv[1])
        return port if count * 2 > len(self.sentinel_ports) else None

    def primary(self) -> Node:
        port = self.primary_port()
        for node in self.nodes:
            if node.port == port:
                return node
        raise LookupError(f"no primary known (sentinels name port {port})")

    # -- faults ---------------------------------------------------------------------------------
    def kill_primary(self) -> Node:
        """SIGKILL the current primary; returns it (restart it with :meth:`restart`)."""
        node = self.primary()
        node.kill()
        return node

    def wait_failover(self, old: Node, timeout: float = 30.0) -> Node:
        """Wait until the Sentinels name a new primary that answers as one, and it has a
        synced replica again when a live one exists."""

        def promoted() -> Node | None:
            port = self.primary_port()
            if port is None or port == old.port:
                return None
            node = next(n for n in self.nodes if n.port == port)
            with node.client() as c:
                if c.info("replication")["role"] != "master":
                    return None
            return node

        return wait_for(promoted, timeout, "a failover")  # type: ignore[no-any-return]

    def wait_promotable(self, timeout: float = 30.0) -> None:
        """Wait until the first Sentinel (the one :meth:`failover` asks) would promote a
        replica: one up, linked, and whose link it does not remember as down. Right after a
        failover it may not yet: it refreshes a replica's INFO every 10 s, and until then a
        replica that was reconfigured a moment ago still counts as long unlinked
        (``NOGOODSLAVE No suitable replica to promote``)."""

        def promotable() -> bool:
            with self.sentinel_client(self.sentinel_ports[0]) as c:
                replicas = c.execute_command("SENTINEL", "REPLICAS", self.master)
            for flat in replicas:
                info = sentinel_state(flat)
                if (
                    info.get("flags") in ("slave", {"slave"})
                    and info.get("master-link-status") == "ok"
                    and int(info.get("master-link-down-time", 1)) == 0
                ):
                    return True
            return False

        wait_for(promotable, timeout, "a replica the Sentinels would promote", interval=0.2)

    def failover(self, *, wait: bool = True, timeout: float = 30.0) -> None:
        """``SENTINEL FAILOVER`` (after :meth:`wait_promotable` unless ``wait`` is false), sent
        again while the Sentinel answers ``NOGOODSLAVE`` or ``INPROG``: a forced failover that
        does not stop the old primary (it serves until the Sentinels reconfigure it)."""
        if wait:
            self.wait_promotable(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.sentinel_client(self.sentinel_ports[0]) as c:
                    c.execute_command("SENTINEL", "FAILOVER", self.master)
                return
            except redis.ResponseError as exc:
                busy = str(exc).startswith(("NOGOODSLAVE", "INPROG"))
                if not busy or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def manual_failover(self, timeout: float = 30.0) -> Node:
        """:meth:`failover`, then wait for the new primary."""
        old = self.primary()
        self.failover()
        return self.wait_failover(old, timeout)

    def restart(self, node: Node) -> None:
        """Start a killed node again (as a primary of its own, empty); the Sentinels make it a
        replica of the current primary within about ten seconds."""
        node.start()

    def rejoin_now(self, node: Node) -> None:
        """``REPLICAOF`` the current primary on a restarted ``node`` at once: what the
        Sentinels do once they next refresh its INFO (every 10 s), without that wait."""
        with node.client() as c:
            c.replicaof(*self.primary().address)

    def wait_replica(self, node: Node, timeout: float = 60.0) -> None:
        """Wait until ``node`` replicates the current primary with its link up."""
        wait_for(
            lambda: node.synced_replica_of(self.primary()),
            timeout,
            f"{node} to rejoin as a synced replica",
            interval=0.2,
        )


class Cluster:
    """A Redis Cluster of ``masters`` primaries (slots split evenly) with ``replicas`` replicas
    each, failure detection after ``node_timeout_ms``."""

    def __init__(self, *, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1000) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="worker-cluster-", dir="/tmp"))
        args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(node_timeout_ms),
            "--cluster-require-full-coverage", "no",
        )  # fmt: skip
        self.masters = [Node(self.root, f"m{i}", free_port_pair(), args) for i in range(masters)]
        self.replicas = [
            Node(self.root, f"m{i}r{j}", free_port_pair(), args)
            for i in range(masters)
            for j in range(replicas)
        ]
        self.replicas_per_master = replicas
        self.slot = 0

    @property
    def nodes(self) -> list[Node]:
        return self.masters + self.replicas

    def start(self, timeout: float = 30.0) -> Cluster:
        for node in self.nodes:
            node.start()
        first = self.masters[0]
        with first.client() as c:
            for node in self.nodes[1:]:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        n = len(self.masters)
        for i, node in enumerate(self.masters):
            lo, hi = i * 16384 // n, (i + 1) * 16384 // n - 1
            with node.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
        wait_for(lambda: self._all_know_each_other(), timeout, "cluster nodes to meet")
        for i, master in enumerate(self.masters):
            with master.client() as c:
                node_id = c.execute_command("CLUSTER", "MYID")
            for j in range(self.replicas_per_master):
                replica = self.replicas[i * self.replicas_per_master + j]
                with replica.client() as c:
                    c.execute_command("CLUSTER", "REPLICATE", node_id)
        wait_for(lambda: self._ok(), timeout, "cluster_state:ok on every node")
        for i, master in enumerate(self.masters):
            for j in range(self.replicas_per_master):
                replica = self.replicas[i * self.replicas_per_master + j]
                wait_for(lambda r=replica, m=master: r.synced_replica_of(m), timeout, "sync")
        return self

    def _all_know_each_other(self) -> bool:
        for node in self.nodes:
            with node.client() as c:
                known = c.execute_command("CLUSTER", "NODES")
            text = known.decode() if isinstance(known, bytes) else str(known)
            if len([line for line in text.splitlines() if line.strip()]) < len(self.nodes):
                return False
        return True

    def _ok(self) -> bool:
        for node in self.nodes:
            if not node.running:
                continue
            with node.client() as c:
                info = c.execute_command("CLUSTER", "INFO")
            text = info.decode() if isinstance(info, bytes) else str(info)
            if "cluster_state:ok" not in text:
                return False
        return True

    def close(self) -> None:
        stop_nodes(self.nodes, self.root)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self) -> str:
        """``redis+cluster://`` naming the first primaries as seed nodes."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.masters)

    # -- the slot an app lives in: the same interface as SentinelSet's primary ------------------
    def watch(self, slot: int) -> Cluster:
        """Make :meth:`primary` and the fault helpers about ``slot`` (an app's hash slot)."""
        self.slot = slot
        return self

    def primary(self) -> Node:
        return self.owner(self.slot)

    def restart(self, node: Node) -> None:
        """Start a killed node again: with its nodes.conf it rejoins as a replica of the node
        that took its slots over."""
        node.start()

    def wait_replica(self, node: Node, timeout: float = 60.0) -> None:
        wait_for(
            lambda: node.synced_replica_of(self.primary()),
            timeout,
            f"{node} to rejoin as a synced replica",
            interval=0.2,
        )

    def owner(self, slot: int) -> Node:
        """The node serving ``slot`` as the live nodes see it."""
        for node in self.nodes:
            if not node.running:
                continue
            try:
                with node.client() as c:
                    layout = c.execute_command("CLUSTER", "SLOTS")
            except redis.RedisError:
                continue
            for start, end, primary, *_ in layout:
                if int(start) <= slot <= int(end):
                    port = int(primary[1])
                    found = next(n for n in self.nodes if n.port == port)
                    if found.running:
                        return found
        raise LookupError(f"no live node serves slot {slot}")

    def wait_failover(self, old: Node, timeout: float = 30.0) -> Node:
        """Wait until a node other than ``old`` serves the watched slot as a primary."""

        def promoted() -> Node | None:
            try:
                node = self.owner(self.slot)
            except LookupError:  # the live nodes still name the dead one: not yet
                return None
            return node if node is not old and node.role() == "master" else None

        return wait_for(promoted, timeout, f"slot {self.slot} to fail over")  # type: ignore[no-any-return]

    # -- resharding -----------------------------------------------------------------------------
    def migrate_slot(self, slot: int, to: Node, *, batch: int = 10, pause_s: float = 0.0) -> int:
        """Move ``slot`` to ``to`` as ``valkey-cli --cluster reshard`` does: ``SETSLOT
        IMPORTING`` on the target, ``MIGRATING`` on the source, ``MIGRATE`` of ``batch`` keys at
        a time (``pause_s`` between batches), then ``SETSLOT NODE`` on both and every other
        primary. Returns how many batches it took."""
        source = self.owner(slot)
        assert source is not to, "the slot is already there"
        with source.client() as src, to.client() as dst:
            src_id = src.execute_command("CLUSTER", "MYID")
            dst_id = dst.execute_command("CLUSTER", "MYID")
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            batches = 0
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                src.execute_command("MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "KEYS", *keys)
                batches += 1
                time.sleep(pause_s)
            dst.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        for node in self.masters:
            if node not in (source, to) and node.running:
                with node.client() as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        return batches
