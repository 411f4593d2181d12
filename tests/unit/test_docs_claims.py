"""What the docs say about the code and the build, checked against them: the claims that went stale
once already and are cheap to pin down."""

from __future__ import annotations

import yaml

from tests.harness import ROOT


def test_the_strict_docs_build_fails_on_a_broken_link_or_anchor() -> None:
    """docs/contributing.md: a broken link fails `scripts/test`'s build. MkDocs reports a missing
    anchor only at `info` unless told, and `--quiet` drops warnings before `--strict` counts them."""
    validation = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["validation"]
    assert validation["links"]["not_found"] == "warn"
    assert validation["links"]["anchors"] == "warn"
    builds = [line for line in (ROOT / "scripts" / "test").read_text().splitlines() if "mkdocs build" in line]
    assert builds
    for line in builds:
        assert "--strict" in line
        assert "--quiet" not in line, line
        assert " -q " not in line, line
