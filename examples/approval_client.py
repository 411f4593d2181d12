"""Approval through elicitation, with the user's answers scripted: what `--approve elicit` looks like.

A client with no sampling support but with elicitation (as many desktop clients have) calls the
weather example's `summarize` tool through mcp-backfill started with `--approve elicit`. Before
the proxy sends the server's sampling request to Claude, it asks the user through the client's
elicitation; here the "user" answers from `--answers` in order (`allow_once`, `allow_session`,
`deny`, `decline`), and each question is printed.

    python examples/approval_client.py --answers allow_once,deny -- \\
        mcp-backfill --provider mock --approve elicit -- python examples/weather_server.py

One `summarize` call is made per answer. After `allow_session` the proxy asks no more, so later
answers go unused. Exit status: 0 when every call went as the answers say (allowed calls answered,
denied ones refused as rejected by the user), 1 otherwise.
"""

import argparse
import os
import sys
from typing import Any

import anyio
from mcp import Client, StdioServerParameters, types
from mcp.shared.exceptions import MCPError

REJECTED = "User rejected sampling request"  # the sampling spec's message (code -1)


def scripted_user(answers: list[str]) -> Any:
    """An elicitation callback that prints each question and answers it from `answers`."""

    async def answer(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        print(f"asked:\n    {params.message.replace(chr(10), chr(10) + '    ')}", flush=True)
        choice = answers.pop(0) if answers else "decline"
        print(f"user answers: {choice}\n", flush=True)
        if choice == "decline":
            return types.ElicitResult(action="decline")
        if choice == "cancel":
            return types.ElicitResult(action="cancel")
        return types.ElicitResult(action="accept", content={"decision": choice})

    return answer


async def run(answers: list[str], command: list[str]) -> int:
    server = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    script = list(answers)
    ok, session_allowed = True, False
    async with Client(server, mode="legacy", elicitation_callback=scripted_user(script)) as client:
        for n in range(1, len(answers) + 1):
            expected = "answered"
            if not session_allowed:
                choice = script[0] if script else "decline"
                session_allowed = choice == "allow_session"
                expected = "answered" if choice.startswith("allow") else "refused"
            arguments = {"text": f"Text number {n}: mcp-backfill asks before it spends."}
            try:
                result = await client.call_tool("summarize", arguments)
                text = "".join(b.text for b in result.content if isinstance(b, types.TextContent))
                outcome = "answered" if not result.is_error else "failed"
            except MCPError as error:
                outcome, text = "failed", error.message
            if outcome == "failed" and REJECTED in text:
                outcome = "refused"
            print(f"summarize #{n}: {outcome}: {text.strip()}\n", flush=True)
            ok = ok and outcome == expected
    return 0 if ok else 1


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        print("usage: approval_client.py --answers A,B,... -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="approval_client.py")
    parser.add_argument("--answers", default="allow_once,deny", help="comma-separated scripted answers")
    args = parser.parse_args(argv[:split])
    return anyio.run(run, [a.strip() for a in args.answers.split(",") if a.strip()], argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main())
