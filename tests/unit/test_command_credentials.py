"""A command's arguments as the proxy logs them and `clients list` shows them: credentials masked,
in each way a command line gives them (`credentials.shown_args`)."""

from __future__ import annotations

import pytest

from mcp_backfill.credentials import shown_args


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--api-key", "SECRET"], ["--api-key", "***"]),
        (["--apiKey=SECRET"], ["--apiKey=***"]),
        (["-e", "GITHUB_TOKEN=SECRET"], ["-e", "GITHUB_TOKEN=***"]),
        (["--header", "Authorization: Bearer SECRET"], ["--header", "Authorization: ***"]),
        (["postgres://me:SECRET@db/x"], ["postgres://***@db/x"]),
        (["--password", "${PW}"], ["--password", "${PW}"]),  # a reference, not the credential
        (["--token", "-"], ["--token", "-"]),
        # The same given to an option with `=`: shown whole (found by review).
        (["--header=Authorization: Bearer SECRET"], ["--header=Authorization: ***"]),
        (["-H=X-Api-Key: SECRET"], ["-H=X-Api-Key: ***"]),
        (["--env=GITHUB_TOKEN=SECRET"], ["--env=GITHUB_TOKEN=***"]),
        (["--dsn=postgresql://me:SECRET@db/x"], ["--dsn=postgresql://***@db/x"]),
        (["--url=https://h/mcp?api_key=SECRET"], ["--url=https://h/mcp?api_key=***"]),
        (["--mode=fast", "--dir=/tmp/x"], ["--mode=fast", "--dir=/tmp/x"]),
    ],
)
def test_credentials_in_arguments_are_masked(args: list[str], shown: list[str]) -> None:
    assert shown_args(args) == shown
