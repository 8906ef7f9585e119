"""No-op job throughput: our consumer (framework defaults) vs plain arq ``Worker``.

OURS: a real ``python -m worker run --role consumer`` process with the framework defaults
(concurrency 100, poll_delay 0.05 s, msgpack, uvloop, INFO logging, heartbeat and holds
tracking on) running ``bench.apps:noop_app`` (one no-op task).

BASELINES: a child process running plain ``arq.worker.Worker`` on the default asyncio loop
with arq's own defaults (max_jobs 10, poll_delay 0.5 s, pickle), tuned arq (max_jobs 100,
poll_delay 0.05 s) and tuned arq on uvloop (to separate the loop from the rest). arq's logger
is left unconfigured (no per-job lines), which favours the baseline.

Each run: fresh keyspace, start the worker and wait until it polls (ours: until every consumer
process waits on the wake marker), pre-fill N jobs due at a moment T0 a little ahead
(so start-up and filling are not timed) and, for ours, announce T0 on the wake marker once (one
``ZADD`` of the due time, what ``enqueue_many`` sets for a batch due at one moment: without
it the fill is a plain arq client's, unannounced, and an idle consumer with no leader finds it
at its 30 s fallback look, which the bench would time instead of the consumer; the consumer
sets a timer and claims at T0, as every build since the wake channel did), then time T0 ->
queue empty (arq removes a job from the queue when it finishes). Commands per job come from
commandstats between T0 and the end (the harness's own ZCARD polls subtracted); CPU per job from
the worker process (psutil) and the server (INFO cpu). Rounds are interleaved, order rotating.

    python bench/consumer.py            # 20k jobs (arq defaults: 4k), 3 rounds (~4 min)
    python bench/consumer.py --quick    # 4k jobs (arq defaults: 1k), 2 rounds

--processes N compares OURS with 1 process against ``--processes N`` (one parent, N consumer
children on the same queue) instead of the arq baselines, for two workloads, all rounds
interleaved the same way: the no-op job, and a CPU-bound job (``burn``: spins ``--cpu-ms`` of
CPU time, 1 ms by default, on 1/4 as many jobs). Worker CPU is the sum over the parent and its
children:

    python bench/consumer.py --processes 2   # 20k no-op + 5k CPU-bound jobs, 3 rounds (~2 min)

--tracing compares OURS with tracing off against ``WORKER_TRACING=otel`` running
``bench.apps:traced_noop_app`` (the OpenTelemetry SDK's provider with a span processor that
drops every span: the cost of making them, not of shipping them), every job's record carrying
a trace context (a CONSUMER span with a remote parent per run), rounds interleaved:

    python bench/consumer.py --tracing        # 20k jobs, 3 rounds: overhead in us/job

--against DIR compares OURS with OURS run from another checkout (``git archive <commit> | tar
-x -C DIR``: a regression check), rounds interleaved the same way; repeat it to compare with
several checkouts in one run (``ours-against-1``, ``ours-against-2``, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import redis as redis_sync

from bench._common import (
    ROOT,
    announce,
    child_env,
    fill_queue,
    machine,
    median,
    print_breakdowns,
    print_machine,
    python,
    result_count,
    rotated,
    spawn,
    spawn_worker,
    start_server,
    stop_procs,
    table,
    time_drain,
    wait_until,
    worker_env,
)

PREFIX = "bench:"
OUR_QUEUE = f"{PREFIX}queue"
ARQ_QUEUE = "arq:queue"


class Variant(NamedTuple):
    label: str
    kind: str  # ours | arq
    max_jobs: int
    poll_delay: float
    loop: str
    processes: int = 1
    cpu_ms: float = 0.0  # 0: the no-op job; else the CPU-bound ``burn`` job
    tracing: bool = False  # WORKER_TRACING=otel, the SDK provider, traced records
    root: str = ""  # "": this checkout; else the checkout the worker runs from (--against)


OURS_LABEL = "ours: consumer role, defaults (100 / 0.05 s, uvloop)"
VARIANTS: dict[str, Variant] = {
    "ours": Variant(OURS_LABEL, "ours", 100, 0.05, "uvloop"),
    "arq-default": Variant(
        "arq Worker, defaults (max_jobs 10, poll 0.5 s)", "arq", 10, 0.5, "asyncio"
    ),
    "arq-tuned": Variant(
        "arq Worker, tuned (max_jobs 100, poll 0.05 s)", "arq", 100, 0.05, "asyncio"
    ),
    "arq-tuned-uvloop": Variant("arq Worker, tuned, on uvloop", "arq", 100, 0.05, "uvloop"),
}


TRACING_VARIANTS: dict[str, Variant] = {
    "ours": Variant("ours, tracing off", "ours", 100, 0.05, "uvloop"),
    "ours-otel": Variant("ours, WORKER_TRACING=otel (SDK)", "ours", 100, 0.05, "uvloop",
                         tracing=True),
}  # fmt: skip


def scaling_variants(n: int, cpu_ms: float) -> dict[str, Variant]:
    """``--processes N``: ours with one process against ours with N, no-op and CPU-bound."""
    out = {}
    for suffix, job, ms in (("", "no-op", 0.0), ("-cpu", f"{cpu_ms:g} ms CPU", cpu_ms)):
        for procs in (1, n):
            name = f"ours{suffix}" + (f"-x{procs}" if procs > 1 else "")
            label = f"ours, {job} job, --processes {procs}"
            out[name] = Variant(label, "ours", 100, 0.05, "uvloop", procs, ms)
    return out


# -- child: plain arq worker -------------------------------------------------------------------
async def _noop(ctx: dict[str, Any], *args: Any) -> None:
    return None


def child_arq(url: str, max_jobs: int, poll_delay: float, loop: str) -> None:
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    async def main() -> None:
        w = Worker(
            functions=[func(_noop, name="noop")],  # type: ignore[arg-type]
            redis_settings=RedisSettings.from_dsn(url),
            max_jobs=max_jobs,
            poll_delay=poll_delay,
        )
        await w.async_run()

    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())
    else:
        asyncio.run(main())


# -- parent ------------------------------------------------------------------------------------
def start_worker(
    name: str, spec: Variant, url: str, logdir: Path, rnd: int
) -> subprocess.Popen[bytes]:
    _, kind, max_jobs, poll_delay, loop, processes, _, tracing, root = spec
    log = logdir / f"{name}-{rnd}.log"
    if kind == "ours":
        app = "bench.apps:traced_noop_app" if tracing else "bench.apps:noop_app"
        env = worker_env(url, app, PREFIX, WORKER_TRACING="otel" if tracing else "off")
        if root:  # the other checkout first on the path, and the cwd (python -m puts it first)
            env["PYTHONPATH"] = root
        cwd = Path(root) if root else ROOT
        return spawn_worker("consumer", env, log, "--processes", str(processes), cwd=cwd)
    args = [python(), __file__, "--child-arq", url, str(max_jobs), str(poll_delay), loop]
    return spawn(args, child_env(), log)


def health_key_exists(r: redis_sync.Redis, kind: str, processes: int = 1) -> bool:
    if kind == "ours":  # one per consumer process
        return sum(1 for _ in r.scan_iter(f"{PREFIX}arq-health:*")) >= processes
    return bool(r.exists(f"{ARQ_QUEUE}:health-check"))


def subscribed(r: redis_sync.Redis, processes: int, root: str = "") -> bool:
    """Every consumer process waits on the wake marker (``BZPOPMIN``, and a second one on the
    duty lanes' marker where the checkout has one; an announcement before would wake fewer).
    A build before the wake marker waits on none: idle, it looks at the queue's head every
    ``idle_poll_max_s`` (0.5 s there) and sleeps until the due time it finds."""
    keys = Path(root or Path(__file__).resolve().parent.parent) / "worker/storage/keys.py"
    text = keys.read_text() if keys.exists() else ""  # a build before the wings polls instead
    markers = 2 if "wake_duty_marker" in text else 1 if "wake_marker" in text else 0
    waiting = [c for c in r.client_list() if c.get("cmd") == "bzpopmin"]
    return len(waiting) >= markers * processes


def fill(
    r: redis_sync.Redis, kind: str, n: int, due_ms: int, cpu_ms: float = 0.0, traced: bool = False
) -> None:
    from worker.core.serializer import get_serializer, job_payload

    ser, _ = get_serializer("msgpack")

    def payload(i: int) -> bytes:
        if kind == "ours":
            fn, args = ("burn", (cpu_ms,)) if cpu_ms else ("noop", (i,))
            extra = (
                {"otel": {"traceparent": f"00-{i + 1:032x}-{i + 1:016x}-01"}} if traced else None
            )
            return job_payload(fn, args, {}, due_ms, ser, extra=extra)
        # arq's own Worker reads its default, pickle (the bench's arq variants need arq)
        from arq.jobs import serialize_job

        return serialize_job("noop", (i,), {}, None, due_ms, serializer=None)

    fill_queue(r, OUR_QUEUE if kind == "ours" else ARQ_QUEUE, n, due_ms, payload)


def run_once(name: str, spec: Variant, url: str, n: int, logdir: Path, rnd: int) -> dict[str, Any]:
    kind, processes = spec.kind, spec.processes
    queue = OUR_QUEUE if kind == "ours" else ARQ_QUEUE
    r = redis_sync.Redis.from_url(url)
    r.flushall()
    proc = start_worker(name, spec, url, logdir, rnd)
    try:
        wait_until(lambda: health_key_exists(r, kind, processes), 30, f"{name} to start polling")
        if kind == "ours":
            wait_until(
                lambda: subscribed(r, processes, spec.root), 30, f"{name} to subscribe to wake-ups"
            )
        time.sleep(0.5)
        t0_wall = time.time() + 1.0 + n / 10_000  # filling must finish before T0 (loaded box)
        due_ms = int(t0_wall * 1000)
        fill(r, kind, n, due_ms, spec.cpu_ms, spec.tracing)
        if kind == "ours":
            announce(r, PREFIX, due_ms)
        if time.time() >= t0_wall:
            raise RuntimeError("filling took longer than the lead time; raise it")
        ps = psutil.Process(proc.pid)  # CPU of its children too (--processes N)
        # arq removes a job from the queue when it finishes: an empty queue is "all done"
        res = time_drain(r, ps, n, t0_wall, lambda: int(r.zcard(queue)), {"zcard": 1}, name)
    finally:
        stop_procs([proc], 15)
    done = result_count(r)
    r.close()
    if done != n:
        raise AssertionError(f"{name}: {done} results for {n} jobs (see {logdir})")
    res["worker_ms"] = res["worker_us"] / 1000
    return res


def main() -> None:
    """``python bench/consumer.py`` (also ``python -m bench consumer``)."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child-arq":
        _, _, url, max_jobs, poll_delay, loop = sys.argv
        child_arq(url, int(max_jobs), float(poll_delay), loop)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--n", type=int, help="jobs per run (20k; quick 4k)")
    ap.add_argument("--n-default", type=int, help="jobs for arq defaults (4k; quick 1k)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (3; quick 2)")
    ap.add_argument("--processes", type=int, help="compare 1 process with --processes N instead")
    ap.add_argument("--cpu-ms", type=float, default=1.0, help="--processes: CPU per burn job (1)")
    ap.add_argument("--tracing", action="store_true", help="compare tracing off with otel")
    ap.add_argument(
        "--against",
        metavar="DIR",
        action="append",
        help="compare ours with ours run from another checkout (repeat for several)",
    )
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(VARIANTS)}")
    args = ap.parse_args()
    variants = scaling_variants(args.processes, args.cpu_ms) if args.processes else VARIANTS
    if args.tracing:
        variants = TRACING_VARIANTS
    if args.against:
        variants = {"ours": VARIANTS["ours"]}
        for i, where in enumerate(args.against):
            root = str(Path(where).resolve())
            name = "ours-against" + (f"-{i + 1}" if len(args.against) > 1 else "")
            variants[name] = VARIANTS["ours"]._replace(label=f"ours from {root}", root=root)
    if args.only:
        wanted = [v.strip() for v in args.only.split(",") if v.strip()]
        if unknown := set(wanted) - set(variants) or ("ours" not in wanted and {"ours"}):
            ap.error(f"--only: unknown or missing 'ours': {sorted(unknown)}")
        variants = {k: variants[k] for k in wanted}
    n = args.n or (4_000 if args.quick else 20_000)
    n_default = args.n_default or (1_000 if args.quick else 4_000)
    rounds = args.rounds or (2 if args.quick else 3)

    server, url = start_server()
    logdir = Path(tempfile.mkdtemp(prefix="bench-consumer-"))
    try:
        print_machine(machine(url))
        print(f"{n} jobs per run ({n_default} for arq defaults, timer-bound), {rounds} rounds; "
              f"logs in {logdir}")  # fmt: skip
        results: dict[str, list[dict[str, Any]]] = {k: [] for k in variants}
        names = list(variants)
        for rnd in range(rounds):
            order = rotated(names, rnd)
            for name in order:
                jobs = n_default if name == "arq-default" else n
                jobs = jobs // 4 if variants[name].cpu_ms else jobs
                res = run_once(name, variants[name], url, jobs, logdir, rnd)
                results[name].append(res)
                print(f"round {rnd + 1} {name:16s} {res['n']:6d} jobs in {res['secs']:6.2f} s = "
                      f"{res['rate']:7.0f} jobs/s, {res['cmds']:.1f} cmds/job, "
                      f"worker CPU {res['worker_ms']:.3f} ms/job", flush=True)  # fmt: skip

        print()
        title = "--processes scaling" if args.processes else "No-op job throughput"
        print(f"## {title} (median of rounds)")
        rows = []
        for name, spec in variants.items():
            rs = results[name]
            rate = median([x["rate"] for x in rs])
            # compared with ours on one process, same workload
            base = median([x["rate"] for x in results["ours-cpu" if spec.cpu_ms else "ours"]])
            rows.append([
                spec.label, f"{rate:,.0f}", f"{base / rate:.2f}x",
                f"{median([x['cmds'] for x in rs]):.1f}",
                f"{median([x['worker_ms'] for x in rs]):.3f}",
                f"{median([x['server_us'] for x in rs]):.0f}",
            ])  # fmt: skip
        print(table(
            ["variant", "jobs/s", "1 process is" if args.processes else "ours is",
             "Redis commands/job", "worker CPU ms/job",
             "server CPU us/job"],
            rows,
        ))  # fmt: skip
        if args.tracing:
            off, on = (median([x["worker_ms"] for x in results[k]]) for k in ("ours", "ours-otel"))
            print(f"tracing on costs {(on - off) * 1000:.0f} us of worker CPU per job")
        if args.processes:
            for job in ("", "-cpu"):
                one = median([x["rate"] for x in results[f"ours{job}"]])
                many = median([x["rate"] for x in results[f"ours{job}-x{args.processes}"]])
                print(f"--processes {args.processes}, ours{job}: {many / one:.2f}x one process")
        print_breakdowns(results, "commands/job")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
