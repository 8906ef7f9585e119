"""Settings: defaults, precedence (CLI > env > TOML file > defaults), one-line errors."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from worker.core.errors import ConfigError
from worker.settings import DEMO_APP, Settings, load_settings, mask_url


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("WORKER_"):
            monkeypatch.delenv(name)


def config_error(**overrides: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(**overrides)
    msg = str(info.value)
    assert "\n" not in msg and msg.strip() == msg, f"not one line: {msg!r}"
    return msg


def test_defaults() -> None:
    s = load_settings()
    assert s.role == "all"
    assert s.redis_url is None
    assert s.app == DEMO_APP
    assert s.key_prefix == "worker:"
    assert s.serializer == "msgpack"  # not pickle
    assert s.log_level == "INFO"
    assert s.log_format == "auto"
    assert s.leader_election == "redis"
    assert (
        s.leader_ttl_s,
        s.leader_renew_interval_s,
        s.leader_renew_deadline_s,
        s.leader_poll_interval_s,
    ) == (10.0, 2.0, 6.0, 1.0)
    assert (s.heartbeat_interval_s, s.orphan_stale_s) == (4.0, 10.0)
    assert (s.idle_poll_max_s, s.idle_poll_subscribed_s) == (1.0, 30.0)
    assert s.instance_name == f"{socket.gethostname()}-{os.getpid()}"


def test_env_overrides_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_ROLE", "consumer")
    monkeypatch.setenv("WORKER_INSTANCE_NAME", "c-1")
    monkeypatch.setenv("WORKER_LEADER_TTL_S", "20")
    monkeypatch.setenv("WORKER_CONCURRENCY", "7")
    monkeypatch.setenv("WORKER_REDIS_URL", "redis://r:6379/1")
    s = load_settings()
    assert (s.role, s.instance_name, s.leader_ttl_s, s.concurrency) == ("consumer", "c-1", 20.0, 7)
    assert s.redis_url == "redis://r:6379/1"


def test_cli_overrides_beat_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_ROLE", "consumer")
    monkeypatch.setenv("WORKER_INSTANCE_NAME", "from-env")
    s = load_settings(role="leader", instance_name="from-cli")
    assert (s.role, s.instance_name) == ("leader", "from-cli")
    # an absent flag (None) does not mask the environment
    s = load_settings(role=None, instance_name=None)
    assert (s.role, s.instance_name) == ("consumer", "from-env")


def test_empty_redis_url_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_REDIS_URL", "")
    assert load_settings().redis_url is None


def test_toml_file_sits_below_env_and_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "worker.toml"
    cfg.write_text('role = "leader"\nconcurrency = 7\nkey_prefix = "file:"\nlog_level = "DEBUG"\n')
    monkeypatch.setenv("WORKER_CONFIG_FILE", str(cfg))
    s = load_settings()
    assert (s.role, s.concurrency, s.key_prefix, s.log_level) == ("leader", 7, "file:", "DEBUG")

    monkeypatch.setenv("WORKER_ROLE", "consumer")
    monkeypatch.setenv("WORKER_CONCURRENCY", "9")
    s = load_settings()
    assert (s.role, s.concurrency, s.key_prefix) == ("consumer", 9, "file:")

    s = load_settings(role="all")
    assert (s.role, s.concurrency) == ("all", 9)


@pytest.mark.parametrize(
    ("env", "value", "must_contain"),
    [
        ("WORKER_ROLE", "boss", ["WORKER_ROLE", "'all'", "'leader'", "'consumer'"]),
        ("WORKER_LOG_LEVEL", "TRACE", ["WORKER_LOG_LEVEL", "'DEBUG'", "'INFO'", "'ERROR'"]),
        ("WORKER_LOG_FORMAT", "xml", ["WORKER_LOG_FORMAT", "'json'", "'console'"]),
        ("WORKER_SERIALIZER", "yaml", ["WORKER_SERIALIZER", "'msgpack'", "'json'", "'pickle'"]),
        ("WORKER_LEADER_ELECTION", "zk", ["WORKER_LEADER_ELECTION", "'redis'", "'static'"]),
        ("WORKER_CONCURRENCY", "-1", ["WORKER_CONCURRENCY", "greater than or equal to 1"]),
        ("WORKER_CONCURRENCY", "abc", ["WORKER_CONCURRENCY", "integer"]),
        ("WORKER_LEADER_TTL_S", "-5", ["WORKER_LEADER_TTL_S", "greater than 0"]),
        ("WORKER_SHUTDOWN_TIMEOUT_S", "-1", ["WORKER_SHUTDOWN_TIMEOUT_S", "greater than"]),
        ("WORKER_HEALTH_PORT", "70000", ["WORKER_HEALTH_PORT", "65535"]),
        ("WORKER_KEY_PREFIX", "", ["WORKER_KEY_PREFIX", "at least 1"]),
        (
            "WORKER_REDIS_URL",
            "http://h:1/0",
            ["WORKER_REDIS_URL", "redis://", "rediss://", "unix://"],
        ),
        ("WORKER_REDIS_URL", "localhost:6379", ["WORKER_REDIS_URL", "redis://"]),
        ("WORKER_APP", "nocolon", ["WORKER_APP", "package.module:attribute"]),
        ("WORKER_APP", "pkg.mod:", ["WORKER_APP", "package.module:attribute"]),
        ("WORKER_APP", "a b:c", ["WORKER_APP", "package.module:attribute"]),
    ],
)
def test_bad_env_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, must_contain: list[str]
) -> None:
    monkeypatch.setenv(env, value)
    msg = config_error()
    for fragment in must_contain:
        assert fragment in msg, (fragment, msg)


@pytest.mark.parametrize(
    ("env", "bad"),
    [
        # renew >= deadline
        ({"WORKER_LEADER_RENEW_INTERVAL_S": "6"}, True),
        # deadline >= ttl
        ({"WORKER_LEADER_RENEW_DEADLINE_S": "10"}, True),
        ({"WORKER_LEADER_RENEW_DEADLINE_S": "20"}, True),
        # ttl below deadline
        ({"WORKER_LEADER_TTL_S": "5"}, True),
        (
            {
                "WORKER_LEADER_TTL_S": "3",
                "WORKER_LEADER_RENEW_DEADLINE_S": "2.5",
                "WORKER_LEADER_RENEW_INTERVAL_S": "0.5",
            },
            False,
        ),
    ],
)
def test_timing_relation_renew_lt_deadline_lt_ttl(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], bad: bool
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if not bad:
        load_settings()
        return
    msg = config_error()
    for name in (
        "WORKER_LEADER_RENEW_INTERVAL_S",
        "WORKER_LEADER_RENEW_DEADLINE_S",
        "WORKER_LEADER_TTL_S",
    ):
        assert name in msg


def test_orphan_stale_must_be_twice_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_HEARTBEAT_INTERVAL_S", "2")
    monkeypatch.setenv("WORKER_ORPHAN_STALE_S", "3.9")
    msg = config_error()
    assert "WORKER_ORPHAN_STALE_S" in msg and "WORKER_HEARTBEAT_INTERVAL_S" in msg
    monkeypatch.setenv("WORKER_ORPHAN_STALE_S", "4")
    assert load_settings().orphan_stale_s == 4.0


def test_cli_override_error_names_flag_and_variable() -> None:
    msg = config_error(role="boss")
    assert "--role" in msg and "WORKER_ROLE" in msg and "'consumer'" in msg


def test_bad_redis_url_error_masks_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_REDIS_URL", "http://user:s3cr3t@h:6379/0")
    msg = config_error()
    assert "s3cr3t" not in msg
    assert "WORKER_REDIS_URL" in msg


def test_missing_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WORKER_CONFIG_FILE", str(tmp_path / "nope.toml"))
    msg = config_error()
    assert "WORKER_CONFIG_FILE" in msg and "nope.toml" in msg


@pytest.mark.parametrize("text", ["role = \n", "[unclosed\n", "a = 1\na = 2\n", "x = 'a\nb'\n"])
def test_bad_toml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, text: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    monkeypatch.setenv("WORKER_CONFIG_FILE", str(cfg))
    msg = config_error()
    assert msg.startswith("WORKER_CONFIG_FILE")


def test_bad_value_inside_toml_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cfg = tmp_path / "w.toml"
    cfg.write_text('serializer = "yaml"\n')
    monkeypatch.setenv("WORKER_CONFIG_FILE", str(cfg))
    msg = config_error()
    assert "WORKER_SERIALIZER" in msg and "'msgpack'" in msg


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://user:s3cr3t@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:s3cr3t@host/0", "redis://:***@host/0"),
        ("rediss://u:p%40ss@host:6380/2", "rediss://u:***@host:6380/2"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("unix:///run/redis.sock?db=0", "unix:///run/redis.sock?db=0"),
        ("redis://:s3cr3t@[::1]:6379/0", "redis://:***@[::1]:6379/0"),
        ("redis://host:6379/0?password=s3cr3t", "redis://host:6379/0?password=***"),
        ("unix:///run/r.sock?db=1&password=s3cr3t", "unix:///run/r.sock?db=1&password=***"),
        # a password with @ (redis-py splits at the last @), or unencoded / # ?
        ("redis://user:s3cr3t@x@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://user:p@s3cr3t@host:6379", "redis://user:***@host:6379"),
        ("redis://:s3cr3t/x@host/0", "redis://:***@host/0"),
        ("redis://:x#s3cr3t@host/0", "redis://:***@host/0"),
        ("redis://:x?s3cr3t@host/0", "redis://:***@host/0"),
        ("redis://h/0?password=s3cr3t@x&db=1", "redis://h/0?password=***&db=1"),
        ("redis://h:notaport:s3cr3t@h2", "redis://h:***@h2"),
        ("redis://user@host/0", "redis://user@host/0"),
        ("", ""),
        (None, ""),
    ],
)
def test_mask_url(url: str | None, expected: str) -> None:
    masked = mask_url(url)
    assert masked == expected
    assert "s3cr3t" not in masked and "p%40ss" not in masked


def test_redacted_has_no_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_REDIS_URL", "redis://admin:s3cr3t@redis:6379/0")
    s = load_settings()
    assert s.redis_url == "redis://admin:s3cr3t@redis:6379/0"  # the real value is kept
    red = s.redacted()
    assert "s3cr3t" not in repr(red)
    assert red["redis_url"] == "redis://admin:***@redis:6379/0"
    assert red["role"] == "all"


def test_settings_class_validates_without_load_settings() -> None:
    with pytest.raises(ValueError, match="WORKER_APP"):
        Settings(app="no-colon")


def test_likely_typos_are_reported_but_kubernetes_service_variables_are_not() -> None:
    from worker.settings import likely_typos

    env = {
        "WORKER_CONCURENCY": "5",  # typo
        "worker_log_levl": "DEBUG",  # typo, lower case
        "WORKER_SERVICE_HOST": "10.0.0.1",  # injected by Kubernetes for a Service "worker"
        "WORKER_PORT_8080_TCP": "tcp://10.0.0.1:8080",
        "WORKER_CONCURRENCY": "5",  # a real setting
        "HOME": "/root",
    }
    assert likely_typos(env) == [
        "WORKER_CONCURENCY is not a setting; did you mean WORKER_CONCURRENCY?",
        "worker_log_levl is not a setting; did you mean WORKER_LOG_LEVEL?",
    ]


# -- values that validated but broke at run time ------------------------------------------------

FLOAT_FIELDS = sorted(
    name for name, f in Settings.model_fields.items() if f.annotation in (float, float | None)
)


def test_every_float_setting_is_covered() -> None:
    assert "leader_ttl_s" in FLOAT_FIELDS and "job_timeout_s" in FLOAT_FIELDS
    assert len(FLOAT_FIELDS) >= 15


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e309", "Infinity"])
@pytest.mark.parametrize("field", FLOAT_FIELDS)
def test_non_finite_floats_are_refused(
    monkeypatch: pytest.MonkeyPatch, field: str, value: str
) -> None:
    monkeypatch.setenv(f"WORKER_{field.upper()}", value)
    msg = config_error()
    assert msg.startswith(f"WORKER_{field.upper()}: invalid value {value!r}"), msg


@pytest.mark.parametrize(
    ("env", "value", "limit"),
    [
        ("WORKER_LEADER_TTL_S", "1e12", "86400"),
        ("WORKER_HEARTBEAT_INTERVAL_S", "86401", "86400"),
        ("WORKER_ORPHAN_STALE_S", "1e9", "86400"),
        ("WORKER_SHUTDOWN_TIMEOUT_S", "1e9", "86400"),
        ("WORKER_DRAIN_DELAY_S", "1e9", "86400"),
        ("WORKER_REDIS_CONNECT_TIMEOUT_S", "1e9", "86400"),
        ("WORKER_RESTART_BACKOFF_CAP_S", "1e9", "86400"),
        ("WORKER_JOB_TIMEOUT_S", "604801", "604800"),
        ("WORKER_KEEP_RESULT_S", "1e15", "604800"),
    ],
)
def test_huge_durations_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, limit: str
) -> None:
    monkeypatch.setenv(env, value)
    msg = config_error()
    assert msg.startswith(env) and limit in msg, msg


def test_largest_allowed_durations_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_JOB_TIMEOUT_S", "604800")
    monkeypatch.setenv("WORKER_KEEP_RESULT_S", "604800")
    monkeypatch.setenv("WORKER_SHUTDOWN_TIMEOUT_S", "86400")
    s = load_settings()
    assert (s.job_timeout_s, s.keep_result_s, s.shutdown_timeout_s) == (604800, 604800, 86400)


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("redis://host:notaport/0", None),
        ("redis://host:99999/0", None),
        ("redis://host:0/0", None),
        ("redis://host/0?db=x", None),
        ("redis://host/zero", None),
        ("redis://host/0?socket_timeout=soon", None),
        ("redis://:Zq7/Xk9@host:6379/0", "Xk9"),
        ("redis://:Zq7#Xk9@host:6379/0", "Xk9"),
        ("redis://:Zq7?Xk9@host:6379/0", "Xk9"),
        ("redis://user:Zq7/Xk9@host/0", "Xk9"),
    ],
)
def test_malformed_redis_url_is_one_line_with_password_masked(
    monkeypatch: pytest.MonkeyPatch, url: str, secret: str | None
) -> None:
    monkeypatch.setenv("WORKER_REDIS_URL", url)
    msg = config_error()
    assert msg.startswith("WORKER_REDIS_URL: "), msg
    assert "Traceback" not in msg
    if secret is not None:  # an unencoded special character in the password
        assert "percent-encode" in msg, msg
        assert "Zq7" not in msg and secret not in msg, msg


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:p@ss@host:6379/0",  # redis-py splits at the last @
        "redis://:p%2Fss@host:6379/0",
        "rediss://host:6380/2?ssl_cert_reqs=none",
        "unix:///run/redis.sock?db=1",
        "redis://[::1]:6379/0",
        "redis://host",
        "redis://host/",
    ],
)
def test_good_redis_urls_still_load(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("WORKER_REDIS_URL", url)
    assert load_settings().redis_url == url


def test_unknown_key_in_config_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "w.toml"
    cfg.write_text('role = "leader"\nconcurency = 5\n')
    monkeypatch.setenv("WORKER_CONFIG_FILE", str(cfg))
    msg = config_error()
    assert msg == "WORKER_CONFIG_FILE: unknown setting 'concurency'; did you mean 'concurrency'?"
    cfg.write_text("[leader]\nttl_s = 5\n")
    msg = config_error()
    assert msg.startswith("WORKER_CONFIG_FILE: unknown setting 'leader'"), msg
    assert str(cfg) in msg or "config/worker.toml" in msg, msg


def test_unknown_env_names_stay_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_SERVICE_HOST", "10.0.0.1")  # Kubernetes, for a Service "worker"
    monkeypatch.setenv("WORKER_PORT_8080_TCP", "tcp://10.0.0.1:8080")
    assert load_settings().role == "all"


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("WORKER_KEY_PREFIX", "my app:"),
        ("WORKER_KEY_PREFIX", "app*"),
        ("WORKER_KEY_PREFIX", "app?"),
        ("WORKER_KEY_PREFIX", "app[1]:"),
        ("WORKER_KEY_PREFIX", "app{1}:"),  # a hash tag only at the start (the slot's tag)
        ("WORKER_KEY_PREFIX", "{}:"),
        ("WORKER_KEY_PREFIX", "{a}{b}:"),
        ("WORKER_KEY_PREFIX", "app\n"),
        ("WORKER_KEY_PREFIX", "a" * 65),
        ("WORKER_INSTANCE_NAME", "pod 1"),
        ("WORKER_INSTANCE_NAME", "pod*"),
        ("WORKER_INSTANCE_NAME", "p{1}"),
        ("WORKER_INSTANCE_NAME", "x" * 129),
    ],
)
def test_identifiers_are_limited_to_a_safe_charset(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str
) -> None:
    monkeypatch.setenv(env, value)
    msg = config_error()
    assert msg.startswith(f"{env}: invalid value"), msg
    assert "A-Z a-z 0-9 . _ : -" in msg or "at most" in msg, msg


def test_safe_identifiers_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_KEY_PREFIX", "shop.v2_orders:-")
    monkeypatch.setenv("WORKER_INSTANCE_NAME", "worker-leader-7d9f8b6c4-x2x9z")
    s = load_settings()
    assert (s.key_prefix, s.instance_name) == ("shop.v2_orders:-", "worker-leader-7d9f8b6c4-x2x9z")
    assert load_settings(key_prefix="a" * 64, instance_name="b" * 128).key_prefix == "a" * 64


# -- the Redis URL from a mounted file (a Kubernetes Secret volume) ------------------------------


def test_redis_url_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "url"
    secret.write_text("redis://app:s3cr3t@redis:6379/0\n")
    monkeypatch.setenv("WORKER_REDIS_URL_FILE", str(secret))
    s = load_settings()
    assert s.redis_url == "redis://app:s3cr3t@redis:6379/0"
    assert "s3cr3t" not in repr(s.redacted())
    # an explicit --redis-url wins over the file
    assert load_settings(redis_url="redis://other:6379/1").redis_url == "redis://other:6379/1"


def test_redis_url_file_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WORKER_REDIS_URL_FILE", str(tmp_path / "missing"))
    msg = config_error()
    assert msg.startswith("WORKER_REDIS_URL_FILE: cannot read") and "missing" in msg, msg

    empty = tmp_path / "empty"
    empty.write_text("\n")
    monkeypatch.setenv("WORKER_REDIS_URL_FILE", str(empty))
    assert config_error().startswith("WORKER_REDIS_URL_FILE: ")

    bad = tmp_path / "bad"
    bad.write_text("redis://:Zq7/Xk9@redis:6379/0")
    monkeypatch.setenv("WORKER_REDIS_URL_FILE", str(bad))
    msg = config_error()
    assert msg.startswith("WORKER_REDIS_URL_FILE: invalid URL") and "Xk9" not in msg, msg

    good = tmp_path / "good"
    good.write_text("redis://redis:6379/0")
    monkeypatch.setenv("WORKER_REDIS_URL_FILE", str(good))
    monkeypatch.setenv("WORKER_REDIS_URL", "redis://redis:6379/0")
    msg = config_error()
    assert "WORKER_REDIS_URL" in msg and "WORKER_REDIS_URL_FILE" in msg and "both" in msg


def test_worst_case_shutdown() -> None:
    leader = Settings(role="leader")
    # drain 5 + stop grace 5 + leadership stop 2 + release 2 + shutdown 30 + work slack 5
    # + infra 2 + two deregistrations 2 + 2
    assert leader.worst_case_shutdown_s() == 55.0
    assert Settings(role="all").worst_case_shutdown_s() == 55.0
    assert Settings(role="consumer").worst_case_shutdown_s() == 46.0
    longer = Settings(role="leader", shutdown_timeout_s=60, drain_delay_s=0, stop_grace_s=1)
    assert longer.worst_case_shutdown_s() == 0 + 1 + 2 + 2 + 60 + 5 + 2 + 4


def test_health_host_defaults_to_loopback() -> None:
    s = load_settings()
    assert s.health_host == "127.0.0.1"
    assert s.allow_eviction is False and s.status_show_errors is False


@pytest.mark.parametrize(
    ("url", "wait", "expected"),
    [
        ("redis://h:6379/0", None, (0, True)),  # one server: nothing to wait for
        ("redis+sentinel://s1:26379/m/0", None, (1, True)),  # the attached ones, up to 1
        ("redis+cluster://n1:7000", None, (1, True)),
        ("redis+sentinel://s1:26379/m/0", "1", (1, False)),  # a number is strict
        ("redis+sentinel://s1:26379/m/0", "0", (0, False)),
    ],
)
def test_wait_replicas_auto_adapts_and_a_number_is_strict(
    monkeypatch: pytest.MonkeyPatch, url: str, wait: str | None, expected: tuple[int, bool]
) -> None:
    monkeypatch.setenv("WORKER_REDIS_URL", url)
    monkeypatch.setenv("WORKER_KEY_PREFIX", "{app}:")
    if wait is not None:
        monkeypatch.setenv("WORKER_REDIS_WAIT_REPLICAS", wait)
    rep = load_settings().replication()
    assert (rep.replicas, rep.adaptive) == expected
