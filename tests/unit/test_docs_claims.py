"""What the docs say about the code and the build, checked against them: the claims that went stale
once already and are cheap to pin down."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from mcp_backfill.config import SECRET_FILE_VARIABLES
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


def test_the_container_page_lists_every_variable_read_from_a_file() -> None:
    page = (ROOT / "docs" / "container.md").read_text()
    section = page[page.index("**Secrets as files.**") :].split("\n\n", 1)[0]
    assert [name for name in SECRET_FILE_VARIABLES if f"`{name}`" not in section] == []


def test_the_pages_the_container_files_point_to_exist() -> None:
    for name in ("Dockerfile", "compose.yaml"):
        text = (ROOT / name).read_text()
        assert "README's" not in text, f"{name}: point to a page under docs/, not a README section"
        for page in re.findall(r"\bdocs/[\w./-]+\.md\b", text):
            assert (ROOT / page).is_file(), f"{name} points to {page}, which does not exist"
    assert "docs/container.md" in (ROOT / "Dockerfile").read_text()


def test_getting_started_lists_every_runtime_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0] for requirement in project["dependencies"]]
    page = (ROOT / "docs" / "getting-started.md").read_text()
    listed = page[page.index("Runtime dependencies:") :].split("\n\n", 1)[0]
    assert [name for name in names if f"`{name}`" not in listed] == []


def test_the_contributing_source_tree_names_every_module() -> None:
    page = (ROOT / "docs" / "contributing.md").read_text()
    tree = page[page.index("```\nsrc/mcp_backfill/") :].split("\n```", 1)[0]
    package = ROOT / "src" / "mcp_backfill"
    modules = {path.name for path in package.rglob("*.py")} - {"__init__.py", "__main__.py"}
    packages = {path.parent.name + "/" for path in package.rglob("__init__.py")} - {"mcp_backfill/"}
    assert sorted(name for name in modules | packages if name not in tree) == []


def test_the_drain_option_names_every_signal_serve_drains_on() -> None:
    """`serve` drains on the signals `_watch_signals` receives (SIGHUP too, since it reloads
    nothing); `--drain-timeout`'s help, its reference cell and the sidecar page name each of them."""
    import inspect

    from mcp_backfill.options import OPTIONS
    from mcp_backfill.sidecar import server

    source = inspect.getsource(server._watch_signals)
    receiver = source[source.index("open_signal_receiver(") :].split(")", 1)[0]
    signals = re.findall(r"signal\.(SIG[A-Z]+)", receiver)
    assert set(signals) >= {"SIGTERM", "SIGINT"}
    drain = next(option for option in OPTIONS if option.flag == "--drain-timeout")
    sidecar = (ROOT / "docs" / "sidecar.md").read_text()
    drains = next(line for line in sidecar.splitlines() if " drains (" in line)
    for name in signals:
        assert name in drain.help, (name, drain.help)
        assert name in drain.doc, (name, drain.doc)
        assert name in drains, (name, drains)


def test_the_readme_names_the_node_the_conformance_suite_needs() -> None:
    """`scripts/test` runs the conformance suite (required, not skipped), which needs a Node that
    npm brings only on x86-64 Linux: the README's requirement line names that Node."""
    from tests.conformance import NODE_MIN

    readme = (ROOT / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("scripts/test "))
    assert f"Node {NODE_MIN}" in line, line


def test_the_eras_page_shows_the_proxys_own_ids_as_they_are_made() -> None:
    """The ids of the rounds the proxy re-sends carry a random part after the prefix (so that
    neither side can guess them): the page shows that shape, not a bare counter."""
    import inspect

    from mcp_backfill.relay.rounds import OWN_ID_PREFIX, RoundDriver

    made = inspect.getsource(RoundDriver.__init__)
    assert 'f"{OWN_ID_PREFIX}{secrets.token_hex(6)}:"' in made
    page = (ROOT / "docs" / "protocol-eras.md").read_text()
    shown = re.findall(r"`(" + re.escape(OWN_ID_PREFIX) + r"[^`]*)`", page)
    assert shown
    for text in shown:
        assert re.fullmatch(re.escape(OWN_ID_PREFIX) + r"<random>:N", text), text


def test_serve_help_names_every_path_and_how_2026_requests_share_upstreams() -> None:
    """`serve --help` says what is served beside `/mcp` (the app's routes: `/readyz` included, the
    path the probes and HAProxy ask) and that 2026-07-28 requests share an upstream per client
    identity only: different clients never share one (docs/sidecar.md)."""
    import inspect

    from mcp_backfill.cli import build_parser
    from mcp_backfill.sidecar import app

    routes = set(re.findall(r'path == "(/[a-z]+)"', inspect.getsource(app.SidecarApp._route)))
    assert routes >= {"/healthz", "/readyz", "/metrics"}
    description = " ".join((build_parser(serve=True).description or "").split())
    for path in sorted(routes):
        assert path in description, path
    assert "2026-07-28 requests share one." not in description
    assert "2026-07-28 requests of one client identity share one" in description, description


def _audit_section() -> str:
    page = (ROOT / "docs" / "limits.md").read_text()
    return " ".join(page[page.index("## Audit log") :].split("\n## ", 1)[0].split())


def test_the_audit_log_section_names_the_outcomes_that_carry_an_error() -> None:
    """The sentence about `error` names exactly the outcomes whose line has one, and its fields."""
    from mcp_backfill.sampling.audit import AuditRecord

    carrying = set()
    for outcome in ("refused", "failed", "timed_out", "cancelled"):
        record = AuditRecord(request_id=1, session="stdio")
        if outcome == "cancelled":
            record.cancelled = True
        else:
            record.fail(-32603, "why", {"limit": "rate_limit", "status": 529}, outcome)
        entry = record.entry()
        assert entry["outcome"] == outcome
        if "error" in entry:
            carrying.add(outcome)
            fields = set(entry["error"])
    section = _audit_section()
    sentence = next(part for part in section.split(". ") if "in `error`" in part)
    subject = sentence[: sentence.index(" carry the JSON-RPC")].rsplit(";", 1)[-1]
    named = {name for name in ("refused", "failed", "timed_out", "cancelled") if f"`{name}`" in subject}
    assert named == carrying, sentence
    for name in fields:
        assert f"`{name}`" in sentence, (name, sentence)


def test_the_audit_log_section_says_what_request_id_is_in_either_era() -> None:
    """A 2026-07-28 round's sampling question has no id of the server's: the proxy audits it under
    the id of the request the round answered and the question's key."""
    import inspect

    from mcp_backfill.relay.rounds import RoundDriver

    assert 'self._sample(params, f"{request_id}/{key}")' in inspect.getsource(RoundDriver._answer)
    section = _audit_section()
    assert "`<id>/<key>`" in section, "the audit section does not show the 2026-07-28 request_id"


# What the pages name that belongs to other tools: docker's and mkdocs' flags, the credential
# arguments `clients list` masks, the abbreviation the options page says is refused, and the
# variable a Kubernetes Service link would inject (named in a manifest's comment as a hazard).
FOREIGN_FLAGS = {"--build-arg", "--stop-timeout", "--quiet", "--strict", "--api-key", "--token", "--prov"}
FOREIGN_VARIABLES = {"MCP_BACKFILL_REDIS_PORT"}


def _user_pages() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "Dockerfile", ROOT / "compose.yaml"]
    for folder in ("docs", "deploy", "examples"):
        pages += sorted(
            path
            for path in (ROOT / folder).rglob("*")
            if path.suffix in (".md", ".yaml", ".cfg", ".py", ".json", ".toml")
        )
    return pages


def _every_flag() -> set[str]:
    import argparse

    from mcp_backfill.cli import build_parser
    from mcp_backfill.clients.command import build_parser as clients_parser
    from mcp_backfill.doctor import CAPABILITIES_FLAG

    flags = {CAPABILITIES_FLAG}
    parsers = [build_parser(serve=False), build_parser(serve=True), clients_parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            flags.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    return flags


def test_every_flag_the_docs_name_in_code_exists() -> None:
    """A flag in inline code (`--flag`, `--flag VALUE`) on a user's page is one of mcp-backfill's."""
    flags = _every_flag()
    named = {
        (page.relative_to(ROOT).as_posix(), flag)
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for flag in re.findall(r"`(--[a-z][a-z0-9-]*)(?:[ =][^`]*)?`", page.read_text())
    }
    assert len(named) > 50
    assert sorted((page, flag) for page, flag in named if flag not in flags | FOREIGN_FLAGS) == []


def test_every_variable_the_docs_name_is_read() -> None:
    """An `MCP_BACKFILL_*` variable on a user's page (docs, README, examples, container and deploy
    files) is an option's, its `_FILE` form, one the proxy reads besides, or a test runner's knob."""
    from mcp_backfill.config import OTHER_VARIABLES
    from mcp_backfill.options import OPTIONS

    variables = {option.env for option in OPTIONS} | set(OTHER_VARIABLES)
    variables |= {f"{name}_FILE" for name in SECRET_FILE_VARIABLES}
    knobs = set(re.findall(r"MCP_BACKFILL_TEST_[A-Z_]+", (ROOT / "scripts" / "test").read_text()))
    named = {
        (page.relative_to(ROOT).as_posix(), name)
        for page in _user_pages()
        for name in re.findall(r"\bMCP_BACKFILL_[A-Z0-9_]*[A-Z0-9]\b", page.read_text())
    }
    assert len(named) > 50
    unknown = variables | knobs | FOREIGN_VARIABLES
    assert sorted((page, name) for page, name in named if name not in unknown) == []


def test_the_serve_options_about_upstreams_hold_for_an_http_upstream_and_2026_clients() -> None:
    """`--max-sessions` counts, and `--session-idle-timeout` closes, upstreams of either kind (a
    process, or an HTTP session with `--upstream-url`), the 2026-07-28 clients' too
    (`StatelessHubs` takes the idle timeout): neither text speaks of processes alone."""
    import inspect

    from mcp_backfill.options import BY_FLAG
    from mcp_backfill.sidecar import server

    assert "idle_timeout=config.session_idle_timeout" in inspect.getsource(server)
    for flag in ("--max-sessions", "--session-idle-timeout"):
        option = BY_FLAG[flag]
        for text in (option.help, option.doc):
            if "process" in text:
                assert "HTTP session" in text, (flag, text)
    idle = BY_FLAG["--session-idle-timeout"]
    for text in (idle.help, idle.doc):
        assert "2026-07-28" in text, text


def test_the_replicas_page_offers_redis_failover_only_through_a_url_the_store_takes() -> None:
    """`--state-store` takes one address (`open_store`: redis://, rediss://, unix://); the page
    offered "Sentinel for failover", which redis-py reaches only through a client of its own."""
    from mcp_backfill.errors import ConfigError
    from mcp_backfill.stores import open_store

    with pytest.raises(ConfigError):
        open_store("redis+sentinel://sentinel:26379/mymaster", lease_seconds=30, timeout=2)
    page = (ROOT / "docs" / "replicas.md").read_text()
    for mention in re.finditer(r"[^.]*\bSentinel\b[^.]*", page):
        assert "not speak the Sentinel protocol" in mention.group() or "proxies" in mention.group(), mention
    persistence = page[page.index("**Run Redis used as the ledger with persistence**") :].split("\n\n", 1)[0]
    assert "count" in persistence
    assert '"Allow once"' in persistence
