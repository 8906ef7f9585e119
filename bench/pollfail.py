"""Poll items whose job fails: how many are still polled once failures have happened.

The README's ``poll_card``: each of ``--cards`` cards is polled every 1 s and reschedules itself,
but its gateway call raises in ``--fail`` of the polls. One ``python -m worker --role all``
process on a fresh embedded server; after ``--seconds`` it counts the cards polled in the last
5 s. Before failed jobs put their item back, every card whose job failed once left the poller.

    python bench/pollfail.py                    # 300 cards, 1 poll in 5 fails, 20 s
    python bench/pollfail.py --root /tmp/old    # the same app against another checkout

The worker process imports this file as its app (``pollfail:app``, with this directory on its
path), so ``--root`` may be any checkout of the framework, this rule or not.
"""

from __future__ import annotations

import argparse
import inspect
import os
import random
import subprocess
import sys
import time
import zlib
from pathlib import Path

from worker import App, JobContext

HERE = Path(__file__).resolve().parent
FAIL = float(os.environ.get("PF_FAIL", "0.2"))

app = App("bench-pollfail")
_kw = (
    {"failure_delay_s": 1.0}
    if "failure_delay_s" in inspect.signature(App.poller).parameters
    else {}
)
app.poller("cards", task="poll_card", shards=4, interval_s=0.2, **_kw)


@app.task
async def poll_card(ctx: JobContext, card_id: str) -> None:
    await ctx.redis.hincrby(f"{ctx.context.settings.key_prefix}bench:polls", card_id, 1)
    if random.random() < FAIL:
        raise ConnectionError("gateway_query failed")
    await ctx.poller("cards").schedule(card_id, delay=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(HERE.parent), help="checkout the worker runs from")
    ap.add_argument("--cards", type=int, default=300)
    ap.add_argument("--fail", type=float, default=FAIL, help="share of polls that raise")
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    sys.path.insert(0, str(HERE.parent))
    from harness.realredis import RealRedis

    srv = RealRedis()
    srv.start()
    r = srv.client()
    prefix = "pf:"
    now = int(time.time() * 1000)
    for n in range(a.cards):
        card = f"card-{n:04d}"
        r.zadd(f"{prefix}poll:{{cards}}:{zlib.crc32(card.encode()) % 4}", {card: now})
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKER_")}
    env.update(
        WORKER_REDIS_URL=srv.url,
        WORKER_KEY_PREFIX=prefix,
        WORKER_APP="pollfail:app",
        WORKER_LOG_LEVEL="WARNING",
        WORKER_HEALTH_PORT="0",
        PYTHONPATH=f"{a.root}:{HERE}",
        PF_FAIL=str(a.fail),
    )
    cmd = [sys.executable, "-m", "worker", "run", "--role", "all"]
    quiet = subprocess.DEVNULL
    worker = subprocess.Popen(cmd, cwd=a.root, env=env, stdout=quiet, stderr=quiet)
    try:
        time.sleep(max(0.0, a.seconds - 5))
        before = {k: int(v) for k, v in r.hgetall(f"{prefix}bench:polls").items()}
        time.sleep(5)
        after = {k: int(v) for k, v in r.hgetall(f"{prefix}bench:polls").items()}
    finally:
        worker.terminate()
        worker.wait(30)
        srv.stop()
    alive = sum(1 for k, v in after.items() if v > before.get(k, 0))
    print(
        f"{a.root}: {alive} of {a.cards} cards still polled after {a.seconds:g} s "
        f"({a.fail:.0%} of polls fail; {sum(after.values())} polls)"
    )


if __name__ == "__main__":
    main()
