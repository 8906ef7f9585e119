"""Worker timings shared by the multi-process tests and the benchmarks that reuse their
scenarios (no pytest import here: ``bench/`` loads it too)."""

from __future__ import annotations

#: Fast leadership timings for multi-process tests (still renew < deadline < ttl).
FAST_ENV = {
    "WORKER_LEADER_TTL_S": "3",
    "WORKER_LEADER_RENEW_INTERVAL_S": "0.5",
    "WORKER_LEADER_RENEW_DEADLINE_S": "1.5",
    "WORKER_LEADER_POLL_INTERVAL_S": "0.25",
    "WORKER_HEARTBEAT_INTERVAL_S": "0.5",
    "WORKER_ORPHAN_STALE_S": "2",
    # jobs some tests write as a plain arq client does (unannounced) are found within 1 s
    "WORKER_IDLE_POLL_SUBSCRIBED_S": "1",
    "WORKER_DRAIN_DELAY_S": "0",
    "WORKER_SHUTDOWN_TIMEOUT_S": "10",
    "WORKER_STOP_GRACE_S": "2",
    "WORKER_RESTART_BACKOFF_CAP_S": "2",
    "WORKER_HEALTH_PORT": "0",
    "WORKER_LOG_FORMAT": "json",
    "WORKER_LOG_LEVEL": "INFO",
}
