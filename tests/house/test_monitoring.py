"""Monitoring: the job-wait histogram, and the shipped alert rules and Grafana dashboard
(``deploy/monitoring/``) checked by ``promtool`` and against what a running worker exports."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync
import yaml

from harness import ROOT, Spawn, eventually, ledger, wait_until
from harness.ports import free_port
from harness.probes import http_get, wait_ready
from tests.consumer.test_consumer import KEYS, Loop
from tests.system.test_clock_skew import _libfaketime, _skewed_env
from tests.system.test_operations import metric_samples, sample
from worker.app import App
from worker.client import Client
from worker.context import JobContext
from worker.core.metrics import Metrics
from worker.core.serializer import msgpack_dumps

# -- worker_job_wait_seconds ----------------------------------------------------------------------


async def test_wait_is_observed_from_the_due_time_per_queue_and_known_task(r: Any) -> None:
    app = App("t")

    @app.task
    async def early(ctx: JobContext) -> None:
        return None

    @app.task
    async def later(ctx: JobContext) -> None:
        return None

    metrics = Metrics()
    lp = Loop(r, app, metrics=metrics)
    await lp.client.enqueue("early")
    await lp.client.enqueue("early")
    await asyncio.sleep(0.6)  # queued, no consumer yet: they wait
    lp.start()
    try:
        await lp.client.enqueue("later", defer_by=1.5)  # due in 1.5 s: waits from then
        plain = Client(r, keys=KEYS, serialize=msgpack_dumps)  # knows no app: enqueues anything
        await plain.enqueue("no_such_function")
        await plain.enqueue("another_typo")

        def seen(task: str, suffix: str = "count", **extra: str) -> float:
            labels = {"queue": "default", "task": task, **extra}
            value = metrics.registry.get_sample_value(f"worker_job_wait_seconds_{suffix}", labels)
            return value or 0.0

        await eventually(lambda: seen("later") == 1 and seen("<unknown>") == 2, what="all runs")
    finally:
        await lp.halt()
    assert seen("early") == 2
    assert seen("early", "bucket", le="0.5") == 0  # waited the 0.6 s before a consumer came
    assert seen("early", "sum") >= 1.2
    assert seen("later", "bucket", le="1.0") == 1  # from its due time, not from its enqueue
    assert seen("<unknown>") == 2  # one label for every name the app does not define
    names = {s.labels.get("task") for m in metrics.registry.collect() for s in m.samples}
    assert not names & {"no_such_function", "another_typo"}


# -- deploy/monitoring: the alert rules and the dashboard -----------------------------------------

MONITORING = ROOT / "deploy" / "monitoring"
ALERTS = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
#: a metric name in PromQL; histograms' series suffixes are stripped to the family's name
METRIC_NAME = re.compile(r"\bworker_[a-z0-9_]+")
#: Grafana's variables, replaced by values PromQL parses (for promtool)
GRAFANA_VARS = {"$__rate_interval": "1m", "$job": ".*"}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        why = "promtool is not installed (Debian package prometheus)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must check the alert rules: {why}")
        pytest.skip(why)
    return found


def _promtool_run(*args: str) -> None:
    proc = subprocess.run(
        [_promtool(), *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _panel_exprs() -> list[str]:
    return [t["expr"] for p in _panels() for t in p["targets"]]


def _dashboard_exprs() -> list[str]:
    """The panels' PromQL and the variables' queries (Grafana's ``label_values(...)``)."""
    exprs = _panel_exprs()
    for var in _dashboard()["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["definition"])
    return exprs


def _names(exprs: list[str]) -> set[str]:
    return {re.sub(r"_(bucket|sum|count)$", "", n) for e in exprs for n in METRIC_NAME.findall(e)}


def test_alert_rules_pass_promtool_check() -> None:
    _promtool_run("check", "rules", str(ALERTS))


def test_alert_rules_unit_tests_fire_and_stay_quiet_as_written() -> None:
    """No leader fires after a minute without one; a growing backlog fires, a steady or a
    draining one does not; a lease changing hands every 2 minutes is flapping, a calm one not."""
    _promtool_run("test", "rules", str(MONITORING / "alerts-test.yml"))


def test_every_alert_has_for_severity_annotations_and_a_runbook_section() -> None:
    rules = _rules()
    names = {r["alert"] for r in rules}
    assert names >= {
        "WorkerNoLeader",
        "WorkerLeaderFlapping",
        "WorkerPeriodicJobStale",
        "WorkerBacklogGrowing",
        "WorkerDeadLettersRising",
        "WorkerComponentCrashLooping",
        "WorkerDurabilityDegraded",
        "WorkerInstanceUnready",
    }
    headings = re.findall(r"^### (\S+)$", (MONITORING / "README.md").read_text(), flags=re.M)
    for rule in rules:
        name = rule["alert"]
        assert rule.get("for"), f"{name}: no `for:`"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        assert notes["runbook"] == f"deploy/monitoring/README.md#{name.lower()}", name
        assert name in headings, f"{name}: no runbook section in deploy/monitoring/README.md"


def test_dashboard_is_grafana_10_with_a_datasource_input_and_valid_promql(
    tmp_path: Path,
) -> None:
    dash = _dashboard()
    assert dash["schemaVersion"] >= 38  # Grafana 10.0
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    titles = [p["title"] for p in _panels()]
    assert len(set(titles)) == len(titles)
    for panel in _panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        if panel["type"] == "timeseries":
            assert panel["fieldConfig"]["defaults"]["custom"]["axisLabel"], panel["title"]
    wanted = {
        "worker_leader",
        "worker_leader_epoch",
        "worker_jobs_total",
        "worker_job_wait_seconds",
        "worker_job_duration_seconds",
        "worker_queue_backlog",
        "worker_jobs_dead_total",
        "worker_periodic_last_success_age_seconds",
        "worker_ready",
    }
    assert wanted <= _names(_dashboard_exprs())
    # every expression parses: promtool checks them as recording rules
    exprs = []
    for e in _panel_exprs():
        for var, value in GRAFANA_VARS.items():
            e = e.replace(var, value)
        exprs.append(e)
    rules = [{"record": f"dashboard:expr{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    _promtool_run("check", "rules", str(path))


@pytest.mark.slow
def test_rules_and_dashboard_use_only_metrics_a_worker_exports_and_waits_use_server_time(
    spawn: Spawn, rsync: redis_sync.Redis, tmp_path: Path
) -> None:
    """A real leader (the ledger app), its host clock 10 minutes ahead of the server's
    (libfaketime): its /metrics has every metric the rules and the dashboard name, and the
    waits of its ticks are those on the server's clock (well under a second, not 600 s)."""
    lib = _libfaketime()
    prefix = spawn.prefix  # type: ignore[attr-defined]
    port = free_port()
    skew = _skewed_env(lib, tmp_path / "ahead.faketime", "+600s")
    leader = spawn("leader", name="l1", env={"WORKER_HEALTH_PORT": str(port), **skew})
    wait_ready(leader, port)
    wait_until(lambda: len(ledger(rsync, prefix, "ticks")) >= 2, 30, what="two ticks")
    code, text = http_get(port, "/metrics")
    assert code == 200
    exported = set(re.findall(r"^# TYPE (\S+) ", text, flags=re.M))
    exported |= set(re.findall(r"^(worker_[a-z0-9_]+)", text, flags=re.M))
    used = _names([r["expr"] for r in _rules()]) | _names(_dashboard_exprs())
    assert used - exported == set(), "named in deploy/monitoring/ but not exported"
    assert len(used) >= 12

    samples = metric_samples(text)
    lane = "default:duty"  # ticks wait in their queue's duty lane
    count = sample(samples, "worker_job_wait_seconds_count", queue=lane, task="tick")
    assert count >= 2
    within_1s = sample(samples, "worker_job_wait_seconds_bucket", queue=lane, task="tick", le="1.0")
    assert within_1s == count, f"{count - within_1s} of {count} ticks waited over 1 s"
