"""The release check (docs/releasing.md): the tag, worker/version.py and CHANGELOG.md agree.

    python .ci/release_check.py          # the CHANGELOG's top release is version.py's version
    python .ci/release_check.py v0.2.0   # ... the tag names that version, its entry is dated

The release workflow (.github/workflows/release.yml) runs it with the pushed tag before it
builds anything; tests/house/test_release.py runs it on every test run. Prints one line and exits 0,
or one line per problem on stderr and exits 1. Standard library only (it runs before any
install).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: What hatch reads (``[tool.hatch.version] path = "worker/version.py"``).
VERSION_LINE = re.compile(r'^__version__ = "([^"]*)"$', re.M)
#: A release version as this project spells it: X.Y.Z, optionally a pre-release (PEP 440).
RELEASE = re.compile(r"\d+\.\d+\.\d+((a|b|rc)\d+)?")
HEADING = re.compile(r"^## \[([^\]]+)\](.*)$", re.M)
DATED = re.compile(r" - \d{4}-\d{2}-\d{2}")


def problems(root: Path, tag: str | None) -> tuple[str, list[str]]:
    """``(version, problems)`` of the tree at ``root``; ``tag`` as pushed (``v0.2.0``)."""
    found = VERSION_LINE.findall((root / "worker" / "version.py").read_text())
    if len(found) != 1:
        return "", ['worker/version.py must hold exactly one line __version__ = "X.Y.Z"']
    version = found[0]
    errors = []
    if not RELEASE.fullmatch(version):
        errors.append(f"worker/version.py: {version!r} is not a release version (X.Y.Z)")
    releases = [
        (name, rest)
        for name, rest in HEADING.findall((root / "CHANGELOG.md").read_text())
        if name.lower() != "unreleased"
    ]
    if not releases:
        errors.append("CHANGELOG.md has no release entry (## [X.Y.Z] - YYYY-MM-DD)")
    elif releases[0][0] != version:
        errors.append(
            f"CHANGELOG.md's top release is [{releases[0][0]}], worker/version.py says {version}"
        )
    elif tag is not None and not DATED.fullmatch(releases[0][1]):
        errors.append(f"CHANGELOG.md: date the entry, ## [{version}] - YYYY-MM-DD")
    if tag is not None and tag != f"v{version}":
        errors.append(f"tag {tag} does not name worker/version.py's version (v{version})")
    return version, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("tag", nargs="?", help="the release tag, v<version>")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    version, errors = problems(args.root, args.tag)
    for error in errors:
        print(f"release check: {error}", file=sys.stderr)
    if errors:
        return 1
    what = f"tag {args.tag}, " if args.tag else ""
    print(f"release check: {what}worker/version.py and CHANGELOG.md agree on {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
