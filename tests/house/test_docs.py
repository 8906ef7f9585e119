"""Docs stay true: every setting is in the configuration page's table and in config/worker.toml
with its real default, and the README's two quickstart commands are the ones CI runs."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_every_setting_is_in_the_configuration_table() -> None:
    table = (ROOT / "docs" / "configuration.md").read_text()
    rows = set(re.findall(r"^\| `(WORKER_[A-Z_]+)` \|", table, flags=re.M))
    expected = {f"WORKER_{name.upper()}" for name in Settings.model_fields} | {"WORKER_CONFIG_FILE"}
    assert expected - rows == set(), "settings missing from docs/configuration.md"
    assert rows - expected == set(), "docs/configuration.md documents settings that do not exist"


def test_config_file_lists_every_default(monkeypatch: object) -> None:
    text = (ROOT / "config" / "worker.toml").read_text()
    data = tomllib.loads(text)
    defaults = Settings.model_construct()  # defaults without reading the environment
    # no TOML value: commented out
    unset = {
        "instance_name",
        "redis_url",
        "redis_url_file",
        "sentinel_username",
        "sentinel_password",
        "web_token",
        "web_token_file",
        "outbox_dsn",
    }
    missing = set(Settings.model_fields) - set(data) - unset
    assert not missing, f"config/worker.toml lacks {missing}"
    for name in unset:
        assert f"# {name} = " in text, f"config/worker.toml lacks a commented {name}"
    for name, value in data.items():
        assert getattr(defaults, name) == value, f"{name}: file says {value!r}"


def test_quickstart_commands_match_ci() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -e '.[embedded]' && python -m worker --role all" in README
    assert "pip install -e '.[test]' && python -m pytest -n 4" in README
    assert "python -m pip install --quiet -e '.[test]'" in ci
    # the README's command, run by CI (CI=1: the browser tests fail instead of skipping)
    assert re.search(r"^(CI=1 )?python -m pytest -n 4$", ci, re.M), ci


#: A reference to the project's planning (its issues, its rounds of work) rather than to the
#: product itself: the package and its docs speak of what the product does.
PLANNING = re.compile(r"\b(?:seed|issue|ticket)s? ?#?\d+", re.I)
#: Where the product speaks: the package, the docs, the README, the examples, the changelog.
SPOKEN = ["worker", "docs", "examples", "README.md", "CHANGELOG.md"]


def planning_references(root: Path) -> list[str]:
    found = []
    for name in SPOKEN:
        top = root / name
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for p in paths:
            if p.suffix not in {".py", ".md", ".html", ".js", ".css", ".toml", ".txt", ""}:
                continue
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if PLANNING.search(line):
                    found.append(f"{p.relative_to(root)}:{n}: {line.strip()}")
    return found


def test_no_planning_references_in_the_package_or_the_docs() -> None:
    assert planning_references(ROOT) == []


def test_the_planning_reference_finder_finds_them(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(
        "Fixed in issue 21.\nAs seed 002 asked.\nSee issue #4.\nCluster seed nodes.\n"
        "arq's key (github.com/python-arq/arq/issues/291).\n"
    )
    assert [f.split(": ", 1)[1] for f in planning_references(tmp_path)] == [
        "Fixed in issue 21.",
        "As seed 002 asked.",
        "See issue #4.",
    ]
