"""A release a maintainer can cut (docs/releasing.md): the version in one place, a CHANGELOG entry
that names it, a tag that must agree with both, and a trusted-publishing workflow of the right
shape. The workflow itself cannot run here (no repository host, no PyPI); what it runs can:
the release check below, and the build and ``twine check --strict`` of
tests/house/test_packaging.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from worker.version import __version__

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / ".ci" / "release_check.py"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def release_check(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK), "--root", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_version_lives_in_one_place() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["hatch"]["version"] == {"path": "worker/version.py"}
    import worker

    assert worker.__version__ == __version__
    # no page quotes the version as the installed one (it would be stale after a release)
    pattern = re.compile(rf"fenced[-_]worker\W{{1,2}}{re.escape(__version__)}\b", re.I)
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert not pattern.search(path.read_text()), path


def test_the_changelog_names_the_version_and_a_tag_here_agrees() -> None:
    out = release_check()
    assert out.returncode == 0, out.stderr
    assert __version__ in out.stdout
    # a release tag on this commit (a release checkout) must name the same version, dated
    tags = subprocess.run(
        ["git", "-C", str(ROOT), "tag", "--points-at", "HEAD", "--list", "v*"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.split()
    for tag in tags:
        out = release_check(tag)
        assert out.returncode == 0, out.stderr


def make_tree(tmp_path: Path, version: str, changelog: str) -> Path:
    (tmp_path / "worker").mkdir()
    (tmp_path / "worker" / "version.py").write_text(f'__version__ = "{version}"\n')
    (tmp_path / "CHANGELOG.md").write_text(changelog)
    return tmp_path


CUT = "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-12-02\n\n- a change\n\n## [0.1.0]\n"


@pytest.mark.parametrize(
    ("version", "changelog", "tag", "error"),
    [
        ("0.2.0", CUT, "v0.2.0", None),
        ("0.2.0", CUT, None, None),
        ("0.2.0", CUT, "v0.2.1", "tag v0.2.1 does not name worker/version.py's version (v0.2.0)"),
        ("0.2.0", CUT, "0.2.0", "tag 0.2.0 does not name"),
        ("0.2.1", CUT, None, "CHANGELOG.md's top release is [0.2.0], worker/version.py says 0.2.1"),
        ("0.2.0", CUT.replace(" - 2026-12-02", ""), "v0.2.0", "date the entry"),
        ("0.2.0", "# Changelog\n\n## [Unreleased]\n", None, "no release entry"),
        ("0.2", CUT, None, "'0.2' is not a release version"),
    ],
)
def test_the_release_check_refuses_what_disagrees(
    tmp_path: Path, version: str, changelog: str, tag: str | None, error: str | None
) -> None:
    out = release_check(*([tag] if tag else []), root=make_tree(tmp_path, version, changelog))
    if error is None:
        assert out.returncode == 0, out.stderr
        assert out.stderr == ""
    else:
        assert out.returncode == 1 and error in out.stderr, out.stderr
        assert out.stdout == ""


def workflow() -> dict[str, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def test_the_release_workflow_lints_and_parses() -> None:
    lint = subprocess.run(
        [sys.executable, "-m", "yamllint", "-s", "-c", ".yamllint.yaml", ".github"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    data = workflow()
    # YAML 1.1 reads the key `on` as True; GitHub reads it as "on"
    assert data[True] == {"push": {"tags": ["v*"]}}
    assert data["permissions"] == {}  # nothing by default; each job asks for what it needs


def test_the_release_workflow_checks_builds_and_publishes_by_trusted_publishing() -> None:
    jobs = workflow()["jobs"]
    assert set(jobs) == {"build", "publish"}
    build, publish = jobs["build"], jobs["publish"]

    assert build["permissions"] == {"contents": "read"}
    runs = [step["run"] for step in build["steps"] if "run" in step]
    script = "\n".join(runs)
    order = [
        'python .ci/release_check.py "$GITHUB_REF_NAME"',
        "python -m build",
        "python -m twine check --strict dist/*",
        "pip install dist/*.whl",
        '--version)" = "fenced-worker ${GITHUB_REF_NAME#v}"',
    ]
    positions = [script.find(command) for command in order]
    assert -1 not in positions and positions == sorted(positions), positions
    assert build["steps"][-1]["uses"].startswith("actions/upload-artifact@")

    # only the publishing job may mint the OIDC token, in the environment PyPI trusts
    assert publish["needs"] == "build"
    assert publish["permissions"] == {"id-token": "write"}
    assert publish["environment"]["name"] == "pypi"
    assert publish["environment"]["url"] == "https://pypi.org/p/fenced-worker"
    uses = [step.get("uses", "") for step in publish["steps"]]
    assert uses[0].startswith("actions/download-artifact@")
    assert uses[-1] == "pypa/gh-action-pypi-publish@release/v1"
    assert all("with" not in step or "password" not in step["with"] for step in publish["steps"])
    assert not any("run" in step for step in publish["steps"])  # nothing else runs with the token


def test_the_release_procedure_is_documented() -> None:
    page = (ROOT / "docs" / "releasing.md").read_text()
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert {"Releasing": "releasing.md"} in nav
    for needed in (
        "worker/version.py",
        "CHANGELOG.md",
        "python .ci/release_check.py v",
        "python -m build",
        "python -m twine check --strict dist/*",
        ".github/workflows/release.yml",
        "id-token: write",
        "cannot run here",
        "pip install 'fenced-worker[embedded]'",
    ):
        assert needed in page, needed
