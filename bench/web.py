"""The operator console at scale: 50 instances, 1,000 periodic jobs, 10,000 dead letters.

Seeds a real server with what a large cluster leaves in Redis (50 heartbeat records with their
component health, a leader with a history, 1,000 periodic jobs with their last tick and last
success, 10,000 dead letters with ~300-byte payloads, a queue of 1,000 jobs and an hour of
throughput counters), starts a real ``python -m worker web`` for ``bench.apps:many_periodic_app``
(1,000 periodic jobs), and times:

- each HTTP response (sequential requests on one connection, after one warm-up): the page, its
  script, ``/api/overview`` (everything but dead letters, including the doctor's checklist,
  which it re-runs every 5 s), a page of 50 dead letters, the last page, one dead letter's
  detail;
- the page in headless Chromium when ``chromium``, ``chromedriver`` and selenium are there:
  from ``driver.get()`` until the 50 instance rows and the dead-letter count are on screen
  (token already in the session), and switching to the dead-letters view until its 50 rows
  show.

    python bench/web.py            # 30 requests per URL, 5 page loads
    python bench/web.py --quick    # 10 and 3

Target: the page loads in under 1 s with this data.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("BENCH_PERIODIC_N", "1000")

import redis as redis_sync

from bench._common import (
    child_env,
    machine,
    pct,
    print_machine,
    python,
    spawn,
    start_server,
    table,
    wait_until,
)
from harness.ports import free_port

PREFIX = "bench:"
TOKEN = "bench-console-token-0123456789"
INSTANCES = 50
DEAD = 10_000
QUEUED = 1_000
TARGET_S = 1.0


def seed(r: redis_sync.Redis, periodic_names: list[str]) -> None:
    """What a large cluster leaves in Redis (see module docstring)."""
    now = int(time.time() * 1000)
    p = r.pipeline(transaction=False)
    components = ["heartbeat", "health-server", "consumer", "leader-election"]
    for n in range(INSTANCES):
        leader = n == 0
        rec = {
            "id": f"i{n:03d}-abcdef", "app": "bench-many-periodic", "name": f"worker-{n:03d}",
            "role": "all" if n < 3 else "consumer", "host": f"host-{n % 10}", "pid": 1000 + n,
            "version": "0.1.0", "started_ms": now - 3_600_000, "heartbeat_ms": now,
            "components": components if n < 3 else components[:3],
            "is_leader": leader, "epoch": 7 if leader else None,
            "lease_age_s": 812.4 if leader else None, "in_flight": n % 7, "ready": True,
            "unready": [], "uptime_s": 3600.0,
            "health": {c: "ok" for c in (components if n < 3 else components[:3])},
            "clock_offset_ms": 0.4, "clock_rtt_ms": 0.3,
        }  # fmt: skip
        p.set(f"{PREFIX}instance:{rec['id']}", json.dumps(rec), px=600_000)
        p.zadd(f"{PREFIX}instances", {rec["id"]: now})
    p.set(f"{PREFIX}leader", "7:bench-token", px=600_000)
    p.set(f"{PREFIX}leader:epoch", 7)
    p.hset(f"{PREFIX}leader:state", mapping={"epoch": 7, "renewed_ms": now, "released": ""})
    for e in range(1, 8):
        p.lpush(
            f"{PREFIX}leader:history",
            f"{e}|{now - (8 - e) * 600_000}|after expiry|worker-00{e % 3}",
        )
    for name in periodic_names:
        p.hset(f"{PREFIX}periodic:last", name, now - now % 1000)
        run = {"at_ms": now - 500, "tick_ms": now - now % 1000, "instance": "i001-abcdef"}
        p.hset(f"{PREFIX}periodic:runs", f"{name}:success", json.dumps(run))
    p.execute()
    payload = base64.b64encode(b"\x85\xa1t\xc0\xa1f\xa7send_it\xa1a\x91" + b"x" * 250).decode()
    for start in range(0, DEAD, 1000):
        p = r.pipeline(transaction=False)
        for n in range(start, start + 1000):
            job_id = f"{PREFIX}job:{n:06d}"
            rec = {
                "job_id": job_id, "reason": "max 5 retries exceeded", "kind": "retries",
                "queue": "default", "task": "send_it", "tries": 6, "at_ms": now - n * 100,
                "instance": "i002-abcdef", "size": 264, "sha256": "0" * 64, "truncated": False,
                "payload_b64": payload,
            }  # fmt: skip
            p.hset(f"{PREFIX}dead:jobs", job_id, json.dumps(rec))
            p.zadd(f"{PREFIX}dead", {job_id: now - n * 100})
        p.execute()
    p = r.pipeline(transaction=False)
    p.zadd(f"{PREFIX}queue", {f"q{n}": now - 1000 + n for n in range(QUEUED)})
    minute = now // 60_000
    for m in range(minute - 59, minute + 1):
        key = f"{PREFIX}stats:default:{m // 60}"
        p.hset(key, mapping={f"{m}:done": 55_000 + m % 7 * 1000, f"{m}:failed": m % 5})
        p.pexpire(key, 7_200_000)
    p.execute()


def fetch(url: str) -> tuple[float, int]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
    return time.perf_counter() - t0, len(body)


def time_http(base: str, n: int) -> list[list[Any]]:
    last = -(-DEAD // 50)
    urls = [
        ("page (index.html)", ""),
        ("static/app.js", "static/app.js"),
        ("api/overview", "api/overview"),
        ("api/dead page 1 (50)", "api/dead?page=1&size=50"),
        (f"api/dead page {last} (last)", f"api/dead?page={last}&size=50"),
        ("api/dead/<id> (detail)", f"api/dead/{PREFIX}job:005000"),
    ]
    rows = []
    for label, path in urls:
        fetch(base + path)  # warm-up
        times, size = [], 0
        for _ in range(n):
            t, size = fetch(base + path)
            times.append(t * 1000)
        kib = f"{size / 1024:.1f} KiB"
        rows.append(
            [label, kib, f"{pct(times, 50):.1f}", f"{pct(times, 95):.1f}", f"{max(times):.1f}"]
        )
    return rows


def time_browser(base: str, n: int) -> list[list[Any]] | str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return "selenium not installed: browser load not measured"
    if not chromium or not driver_path:
        return "chromium/chromedriver not installed: browser load not measured"
    options = Options()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="bench-web-chromium-")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1500,1000", f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    shown = """return document.querySelectorAll('#instances tbody tr[data-instance]').length === 50
        && document.getElementById('dead-count').textContent === '10000';"""
    dead_rows = "return document.querySelectorAll('#dead tbody tr[data-job]').length === 50;"
    try:
        driver.get(base)
        driver.execute_script("sessionStorage.setItem('worker.token', arguments[0]);", TOKEN)
        loads, tabs = [], []
        for _ in range(n):
            driver.get("about:blank")
            t0 = time.perf_counter()
            driver.get(base + "#cluster")
            wait_until(lambda: driver.execute_script(shown), 30, "the cluster view", 0.005)
            loads.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            driver.find_element("css selector", '#tabs a[data-tab="dead"]').click()
            wait_until(lambda: driver.execute_script(dead_rows), 30, "50 dead letters", 0.005)
            tabs.append((time.perf_counter() - t0) * 1000)
        return [
            ["page load to cluster view filled", f"{pct(loads, 50):.0f}", f"{max(loads):.0f}"],
            ["dead-letters view: 50 rows shown", f"{pct(tabs, 50):.0f}", f"{max(tabs):.0f}"],
        ]
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="10 requests per URL, 3 page loads")
    ap.add_argument("--smoke", action="store_true", help="does it run: 2 requests, 1 page load")
    args = ap.parse_args()
    n_http, n_page = (2, 1) if args.smoke else (10, 3) if args.quick else (30, 5)

    from bench.apps import many_periodic_app

    server, url = start_server()
    workdir = Path(tempfile.mkdtemp(prefix="bench-web-"))
    proc = None
    try:
        r = redis_sync.Redis.from_url(url)
        info = machine(url)
        seed(r, list(many_periodic_app.periodics))
        port = free_port()
        env = child_env(
            WORKER_REDIS_URL=url, WORKER_KEY_PREFIX=PREFIX,
            WORKER_APP="bench.apps:many_periodic_app",
            WORKER_WEB_TOKEN=TOKEN, WORKER_WEB_PORT=str(port), WORKER_LOG_LEVEL="WARNING",
            BENCH_PERIODIC_N=str(len(many_periodic_app.periodics)),
        )  # fmt: skip
        proc = spawn([python(), "-m", "worker", "web"], env, workdir / "web.log")
        base = f"http://127.0.0.1:{port}/"
        wait_until(lambda: "worker console:" in (workdir / "web.log").read_text(), 30, "console")
        print_machine(info)
        print(
            f"seeded: {r.zcard(PREFIX + 'instances')} instances, "
            f"{r.hlen(PREFIX + 'periodic:last')} periodic jobs (the app declares "
            f"{len(many_periodic_app.periodics)}), {r.zcard(PREFIX + 'dead')} dead letters, "
            f"{r.zcard(PREFIX + 'queue')} queued jobs\n"
        )
        print(f"HTTP, {n_http} sequential requests each (ms):")
        print(table(["response", "size", "p50", "p95", "max"], time_http(base, n_http)))
        browser = time_browser(base, n_page)
        print(f"\nheadless Chromium, {n_page} loads (ms; the target is {TARGET_S * 1000:.0f}):")
        print(browser if isinstance(browser, str) else table(["what", "p50", "max"], browser))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
