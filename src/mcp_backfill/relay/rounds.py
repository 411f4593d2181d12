"""2026-07-28: the `input_required` rounds the proxy drives on the client's behalf.

A `tools/call`, `prompts/get` or `resources/read` may be answered with `input_required`: questions
(sampling among them) and a `requestState`. For a client that cannot sample, the `RoundDriver`
answers the sampling questions with the sampler and re-sends the request under a proxy-owned id with
the answers and the echoed state, round after round, until the server gives a final result, which
the client receives under its own id. When a round also asks the client something (elicitation,
roots), the client gets a reduced round holding only those questions, and the proxy's own answers
wait in the stash until the client's retry brings them back. The decisions are the pure functions
of `input_required`; this class holds the state and the I/O.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import SamplingError
from mcp_backfill.logs import get_logger
from mcp_backfill.options import env_var, named
from mcp_backfill.relay import input_required as ir
from mcp_backfill.relay.approval import (
    APPROVAL_KEY,
    MAX_APPROVAL_PROMPTS,
    Approver,
    Decision,
    approval_key,
    can_elicit,
    cannot_elicit,
    decision_of,
    form,
    rejected,
    too_many,
)
from mcp_backfill.relay.capabilities import ClientProfile, backfill_capabilities, proxy_answers
from mcp_backfill.relay.progress import RoundProgress
from mcp_backfill.relay.state import InputChain, PendingRequest, RelayOptions, RelayState
from mcp_backfill.relay.tracing import RequestTraces

log = get_logger("relay")

# Ids the proxy gives its own re-sent requests; a string prefix no SDK counter produces.
OWN_ID_PREFIX = "mcp-backfill:"

Sample = Callable[[dict[str, Any], Any], Awaitable[dict[str, Any]]]
"""The sampler's answer to one question: `(params, request id for the logs) -> result`."""
Send = Callable[[bytes], Awaitable[None]]
Refused = Callable[[dict[str, Any], SamplingError, Any], None]
"""Report a question refused before it was sampled: `(params, error, request id for the logs)`."""
Cancelled = Callable[[dict[str, Any], Any], None]
"""Report a question given up before it was sampled (the proxy stopped): `(params, request id)`."""
Claim = Callable[[str, float], Awaitable[bool]]
"""Claims a key once among the replicas sharing the ledger store, until a time (`Spend.claim_once`)."""
Notify = Callable[[bytes, Any], Awaitable[None]]
"""Sends a notification to the client: `(message, the client's id of the request it belongs to)`."""

PROGRESS_TOKENS = 4096
"""Progress tokens of requests whose rounds the proxy may drive that one session remembers at most
(each is forgotten when its request ends; these are the ones whose end the relay did not see)."""


class RoundDriver:
    """Drives the `input_required` rounds of one session's 2026-07-28 requests.

    Long because a round's life is one story told in order: the client's request rewritten, each
    round taken from the server's result, answered by Claude (after approval, if asked), handed to
    the client when it has questions of its own, and ended by an answer, a cancel or the round cap.
    """

    def __init__(
        self,
        options: RelayOptions,
        state: RelayState,
        sample: Sample,
        send_client: Send,
        send_upstream: Send,
        scope: str = "",
        traces: RequestTraces | None = None,
        approver: Approver | None = None,
        claim: Claim | None = None,
        refused: Refused = lambda params, error, request_id: None,
        notify_client: Notify | None = None,
        cancelled: Cancelled = lambda params, request_id: None,
    ) -> None:
        self.options = options
        self.state = state
        key, ttl = options.request_state_key, options.input_stash_ttl
        self.stash: ir.Stash | ir.SealedStash = (
            ir.SealedStash(key, ttl, scope, redeemed=options.redeemed_tokens)
            if key
            else ir.Stash(ttl, expired=self._expired, abandoned=self._abandoned)
        )
        self._sample = sample
        self._send_client = send_client
        self._send_upstream = send_upstream
        # Ids no client can guess, so that none of its own requests can share one (the answer to
        # either would be taken for the other's).
        self._own_prefix = f"{OWN_ID_PREFIX}{secrets.token_hex(6)}:"
        self._own_ids = itertools.count(1)
        self._traces = traces
        self._tg: TaskGroup | None = None
        self.approver = approver
        self._claim = claim
        self._refused = refused
        self._cancelled = cancelled
        self._notify_client = notify_client
        # The requests that may be driven, by the progress token they carry (`RoundProgress`).
        self._tokens: dict[jsonrpc.IdKey, PendingRequest] = {}

    def start(self, task_group: TaskGroup) -> None:
        """Rounds are driven in tasks of `task_group` (the relay's). The approval questions of an
        adopted stash are watched from now on."""
        self._tg = task_group
        if isinstance(self.stash, ir.Stash):
            for token, entry in list(self.stash.entries.items()):
                if entry.pending:
                    task_group.start_soon(self._expire, self.stash, token)

    def adopt(self, stash: ir.Stash | ir.SealedStash) -> None:
        """Use `stash` (another relay's, before `start`): its approval questions that expire are
        refused by this driver, those still open when it is let go reported by it."""
        self.stash = stash
        if isinstance(stash, ir.Stash):
            stash.expired, stash.abandoned = self._expired, self._abandoned

    def abandon_questions(self) -> None:
        """The proxy stops (the stash is let go): the sampling questions still awaiting the user's
        approval were never sampled, and are reported cancelled, charged nothing, as a
        handshake-era sampling request whose session ends while the user is asked; those whose
        question expired, refused. (A sealed stash's open questions are in the client's tokens.)"""
        if isinstance(self.stash, ir.Stash):
            self.stash.abandon()

    # -- client -> upstream ----------------------------------------------------------------------

    def rewrite_request(
        self, message: dict[str, Any], pending: PendingRequest, replies: list[dict[str, Any]]
    ) -> dict[str, Any] | None:
        """A 2026 request: capabilities merged; input_required methods set up for driving.

        Returns the message to send upstream, or None when the proxy answered it itself (its answer
        is appended to `replies`).
        """
        meta = ir.envelope(message.get("params"))
        if meta is None or pending.method == protocol.DISCOVER:
            return message
        version = meta[protocol.META_PROTOCOL_VERSION]
        self.state.check_version(version)
        if version != protocol.STATELESS_VERSION:
            return message  # an unknown revision passes through untouched
        declared = ir.declared_capabilities(meta)
        merged = backfill_capabilities(declared, self.options.mode)
        if merged is None and self.options.mode != "always":
            return message  # nothing to backfill: every round goes to the client untouched
        # `always` takes the sampling of a client that declared it with tools too (nothing merged).
        rewritten = message if merged is None else ir.with_capabilities(message, merged)
        if pending.method not in protocol.INPUT_REQUIRED_METHODS:
            return rewritten
        params: dict[str, Any] = rewritten["params"]
        rounds = 0
        token = ir.stash_token(params)
        if token is not None:
            stashed = self.stash.take(token)
            if stashed is None:
                replies.append(
                    jsonrpc.error_response(message["id"], protocol.INVALID_PARAMS, self._unknown_state())
                )
                return None
            if stashed.pending:
                self._approval_answered(message, params, stashed, pending, declared, replies)
                return None
            params = ir.restore_params(params, stashed)
            rewritten = {**rewritten, "params": params}
            rounds = stashed.rounds
        client = ClientProfile.from_capabilities(declared)
        pending.chain = InputChain(pending.method, ir.base_params(params), client, rounds, message["id"])
        self._track_progress(pending, params)
        return rewritten

    def _track_progress(self, pending: PendingRequest, params: dict[str, Any]) -> None:
        token = protocol.progress_token(params)
        if token is None or pending.chain is None:
            return
        pending.chain.progress = RoundProgress(token)
        jsonrpc.remember(self._tokens, jsonrpc.id_key(token), pending, PROGRESS_TOKENS)

    def _forget_progress(self, pending: PendingRequest) -> None:
        chain = pending.chain
        if self._tokens and chain is not None and chain.progress is not None:
            key = jsonrpc.id_key(chain.progress.token)
            if self._tokens.get(key) is pending:
                del self._tokens[key]

    def upstream_progress(self, message: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
        """A server's `notifications/progress` as the client gets it (see `RoundProgress`)."""
        if not self._tokens:
            return message
        token = params.get("progressToken")
        if not protocol.string_or_integer(token):
            return message
        pending = self._tokens.get(jsonrpc.id_key(token))
        if pending is None or pending.chain is None or pending.chain.progress is None:
            return message
        if not self._live(pending):
            del self._tokens[jsonrpc.id_key(token)]  # ended unseen: its token is the client's again
            return message
        return pending.chain.progress.relayed(message, params, self._driving(pending))

    def _live(self, pending: PendingRequest) -> bool:
        """Is the request still waiting for the upstream or for the proxy?"""
        if self._driving(pending):
            return True
        chain = pending.chain
        upstream_id = chain.upstream_id if chain is not None and chain.upstream_id is not None else None
        key = jsonrpc.id_key(pending.request_id if upstream_id is None else upstream_id)
        return self.state.client_requests.get(key) is pending

    def _approval_answered(
        self,
        message: dict[str, Any],
        params: dict[str, Any],
        stashed: ir.StashedRound,
        pending: PendingRequest,
        declared: dict[str, Any],
        replies: list[dict[str, Any]],
    ) -> None:
        """The client's retry of a round that asked the user to approve the proxy's sampling: on
        a yes, the proxy samples now and re-sends the request; otherwise the request is refused."""
        given = ir.client_answers(params)
        key = stashed.approval_key or APPROVAL_KEY  # a token sealed before the key was kept
        decision, how = decision_of(given.get(key))
        log.info("sampling approval answered", extra={"decision": decision, "how": how})
        if decision == "deny":
            refusal = rejected(how)
            self._refuse_questions(pending.request_id, stashed.pending, refusal)
            replies.append(jsonrpc.error_response(message["id"], refusal.code, refusal.message, refusal.data))
            return
        given = {name: value for name, value in given.items() if name != key}
        client = ClientProfile.from_capabilities(declared)
        base = ir.base_params(params)
        chain = InputChain(pending.method, base, client, stashed.rounds, None, anyio.CancelScope())
        pending.chain = chain
        self._track_progress(pending, params)
        self.state.driving[jsonrpc.id_key(pending.request_id)] = pending
        resumed = ir.Round(stashed.pending, {}, stashed.has_state, stashed.state)
        assert self._tg is not None
        if stashed.nonce and self._claim is not None:
            self._tg.start_soon(self._redeem, pending, chain, stashed, resumed, given, decision)
        else:
            self._allow(decision)
            self._tg.start_soon(self._drive, pending, chain, {}, resumed, given)

    def _allow(self, decision: Decision) -> None:
        if self.approver is not None:
            self.approver.allow(decision)

    async def _redeem(
        self,
        pending: PendingRequest,
        chain: InputChain,
        stashed: ir.StashedRound,
        resumed: ir.Round,
        given: dict[str, Any],
        decision: Decision,
    ) -> None:
        """Claim a sealed approval token in the shared ledger store before sampling for it: the
        same retry may have been redeemed on another replica already. The user's decision counts
        (an "Allow for this session" included) only once the token is this replica's."""
        assert self._claim is not None
        try:
            claimed = await self._claim(f"sealed:{stashed.nonce}", stashed.expires)
        except SamplingError as exc:  # the store could not be asked: the client may retry later
            if isinstance(self.stash, ir.SealedStash):
                self.stash.give_back(stashed)
            self.end(pending)
            await self._fail(pending.request_id, exc.code, exc.message, exc.data)
            return
        if not claimed:
            self.end(pending)
            await self._fail(pending.request_id, protocol.INVALID_PARAMS, self._unknown_state())
            return
        self._allow(decision)
        await self._drive(pending, chain, {}, resumed, given)

    def _unknown_state(self) -> str:
        approval = ""
        if self.approver is not None and self.approver.policy != "never":
            flag = "--approve-timeout"
            approval = (
                f", and a round's approval question for {flag} {self.approver.timeout:g} s ({env_var(flag)})"
            )
        flag = "--input-stash-ttl"
        return (
            "requestState expired or unknown: mcp-backfill keeps its answers to a round for "
            f"{flag} {self.options.input_stash_ttl:g} s ({env_var(flag)}){approval}; retry the request "
            "from the start"
        )

    def client_cancelled(self, message: dict[str, Any], params: dict[str, Any]) -> dict[str, Any] | None:
        """The client gave up on a request the proxy drives: stop, and cancel what is in flight upstream.

        Returns the cancellation to forward upstream (under the upstream's id), or None.
        """
        key = jsonrpc.id_key(params["requestId"])
        driven = self.state.driving.pop(key)
        self._forget_progress(driven)
        chain = driven.chain
        assert chain is not None
        log.info("client cancelled a request the proxy is driving", extra={"request_id": driven.request_id})
        chain.cut = protocol.cancelled_by_client(driven.request_id)
        if chain.scope is not None:
            chain.scope.cancel()
        if chain.upstream_id is None:
            return None  # between rounds: nothing is in flight upstream
        self.state.client_requests.pop(jsonrpc.id_key(chain.upstream_id), None)
        if jsonrpc.id_key(chain.upstream_id) == key:
            return message
        return {**message, "params": {**params, "requestId": chain.upstream_id}}

    # -- upstream -> client ----------------------------------------------------------------------

    def take_round(self, pending: PendingRequest, chain: InputChain, result: dict[str, Any]) -> Any:
        """An `input_required` result: driven here when it holds questions for the proxy (None is
        returned: nothing goes to the client now), else handed to the client under its own id."""
        current = ir.split_round(
            result, lambda params: proxy_answers(self.options.mode, chain.client, params)
        )
        if not current.mine and not current.state_only:
            self.end(pending)
            return jsonrpc.result_response(pending.request_id, result)
        chain.upstream_id = None
        chain.scope = anyio.CancelScope()
        self.state.driving[jsonrpc.id_key(pending.request_id)] = pending
        assert self._tg is not None
        self._tg.start_soon(self._drive, pending, chain, result, current)
        return None

    def end(self, pending: PendingRequest) -> None:
        """The request got its final answer (or an error): nothing more is driven for it."""
        self._forget_progress(pending)
        if self._driving(pending):
            del self.state.driving[jsonrpc.id_key(pending.request_id)]

    def _driving(self, pending: PendingRequest) -> bool:
        """Is this very request still driven? Its id is not enough: once the client cancelled it, a
        new request may reuse the id while the old round's sampling is still stopping."""
        return self.state.driving.get(jsonrpc.id_key(pending.request_id)) is pending

    @staticmethod
    def is_own_id(upstream_id: Any) -> bool:
        """Is this the id of a round the proxy re-sent (whose client may have cancelled since)?"""
        return isinstance(upstream_id, str) and upstream_id.startswith(OWN_ID_PREFIX)

    # -- driving ---------------------------------------------------------------------------------

    async def _drive(
        self,
        pending: PendingRequest,
        chain: InputChain,
        result: dict[str, Any],
        current: ir.Round,
        approved: dict[str, Any] | None = None,
    ) -> None:
        """Answer the proxy's questions of a round, then re-send the request or hand the rest over.

        `approved`: the round's questions were allowed by the user, whose retry brought these
        answers of the client's own.
        """
        if not self._driving(pending):  # cancelled before this task started (its id perhaps reused since)
            self._never_sampled(pending.request_id, chain, current.mine)
            return
        if chain.rounds >= self.options.max_input_rounds:
            self.end(pending)
            await self._fail(
                pending.request_id,
                protocol.INTERNAL_ERROR,
                f"The server asked for input more than {self.options.max_input_rounds} times for one "
                f"request; raise {named('--max-input-rounds')} to allow more rounds",
                {"rounds": chain.rounds},
            )
            return
        if approved is None and self._must_ask(current):
            await self._ask(pending, chain, result, current)
            return
        answers: dict[str, Any] = dict(approved or {})
        assert chain.scope is not None
        span = self._traces.client_span(pending.request_id) if self._traces is not None else None
        with chain.scope, span.activate() if span is not None else contextlib.nullcontext():
            try:
                answers.update(await self._answer_telling(pending, chain, current.mine))
                if current.state_only:
                    await anyio.sleep(random.uniform(*self.options.state_only_backoff))
            except SamplingError as exc:
                if self._driving(pending):
                    self.end(pending)
                    await self._fail(pending.request_id, exc.code, exc.message, exc.data)
                return
        chain.scope = None
        if not self._driving(pending):
            return  # cancelled by the client, or failed by a dying upstream: it expects nothing more
        if current.theirs:
            await self._hand_over(pending, chain, result, current, answers)
            return
        chain.rounds += 1
        upstream_id = f"{self._own_prefix}{next(self._own_ids)}"
        chain.upstream_id = upstream_id
        if chain.progress is not None:
            chain.progress.resent()
        self.state.client_requests[jsonrpc.id_key(upstream_id)] = pending
        params = ir.retry_params(chain.base_params, answers, current.has_state, current.state)
        log.info(
            "input round answered; request re-sent",
            extra={"request_id": pending.request_id, "upstream_id": upstream_id, "round": chain.rounds},
        )
        await self._send_upstream(
            jsonrpc.encode({"jsonrpc": "2.0", "id": upstream_id, "method": chain.method, "params": params})
        )

    async def _hand_over(
        self,
        pending: PendingRequest,
        chain: InputChain,
        result: dict[str, Any],
        current: ir.Round,
        answers: dict[str, Any],
    ) -> None:
        """A mixed round: the client answers its questions; the proxy's answers wait in the stash.

        The round counts toward `--max-input-rounds` like one the proxy re-sends: else a server
        answering every retry with a mixed round would have the proxy sample on each, without end.
        """
        self.end(pending)
        chain.rounds += 1
        token = self.stash.put(answers, current.has_state, current.state, chain.rounds)
        log.info(
            "mixed input round: the client answers the rest",
            extra={
                "request_id": pending.request_id,
                "proxy_keys": list(answers),
                "client_keys": list(current.theirs),
            },
        )
        reduced = ir.reduced_result(result, current.theirs, token)
        await self._send_client(jsonrpc.encode(jsonrpc.result_response(pending.request_id, reduced)))

    def _must_ask(self, current: ir.Round) -> bool:
        approver = self.approver
        return approver is not None and any(approver.needed(params) for params in current.mine.values())

    async def _ask(
        self, pending: PendingRequest, chain: InputChain, result: dict[str, Any], current: ir.Round
    ) -> None:
        """The user must allow the proxy's sampling first: the client gets a reduced round with the
        approval question beside its own, and the unanswered questions wait in the stash. The form
        shows every question that needs approval: a server could put a harmless one first."""
        assert self.approver is not None
        self.end(pending)
        asked = [params for params in current.mine.values() if self.approver.needed(params)]
        refusal = None
        if not can_elicit(chain.client.elicitation):
            refusal = cannot_elicit(self.approver.policy)
        elif len(asked) > MAX_APPROVAL_PROMPTS:
            refusal = too_many(len(asked), self.approver.policy)
            log.warning(
                "sampling approval not asked: too many sampling requests in one round",
                extra={"request_id": pending.request_id, "requests": len(asked)},
            )
        try:
            previews = [self.approver.preview(params) for params in asked] if refusal is None else []
        except SamplingError as exc:
            refusal = exc
        if refusal is not None:
            self._refuse_questions(pending.request_id, current.mine, refusal)
            await self._fail(pending.request_id, refusal.code, refusal.message, refusal.data)
            return
        question = form(previews, None, protocol.STATELESS_VERSION)
        # The question is open for `--approve-timeout`, as in the handshake era: an answer given
        # later (a dialog left open for hours) finds the round gone and samples nothing.
        ttl = min(self.options.input_stash_ttl, self.approver.timeout)
        key = approval_key(current.mine.keys() | current.theirs.keys())
        token = self.stash.put(
            {}, current.has_state, current.state, chain.rounds, current.mine, ttl, key, pending.request_id
        )
        if isinstance(self.stash, ir.Stash) and self._tg is not None:
            self._tg.start_soon(self._expire, self.stash, token)
        theirs = {**current.theirs, key: {"method": protocol.ELICIT, "params": question}}
        log.info("sampling approval asked in the round", extra={"request_id": pending.request_id})
        reduced = ir.reduced_result(result, theirs, token)
        await self._send_client(jsonrpc.encode(jsonrpc.result_response(pending.request_id, reduced)))

    async def _answer_telling(
        self, pending: PendingRequest, chain: InputChain, questions: dict[str, dict[str, Any]]
    ) -> dict[str, Any]:
        """`_answer`, the client sent progress meanwhile when it asked for progress: Claude may take
        minutes, and a client that hears nothing may give up (its timeout), the Claude call wasted."""
        progress, notify = chain.progress, self._notify_client
        if progress is None or notify is None or not questions:
            return await self._answer(pending.request_id, questions)
        outcome: dict[str, Any] | SamplingError

        async def tell() -> None:
            started = anyio.current_time()
            while True:
                await anyio.sleep(self.options.round_progress_interval)
                await notify(progress.notification(anyio.current_time() - started), pending.request_id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(tell)
            try:
                outcome = await self._answer(pending.request_id, questions)
            except SamplingError as exc:
                outcome = exc
            tg.cancel_scope.cancel()
        if isinstance(outcome, SamplingError):
            raise outcome
        return outcome

    async def _answer(self, request_id: Any, questions: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """Answer a round's sampling questions concurrently; the first failure fails the round."""
        answers: dict[str, Any] = {}
        failures: list[SamplingError] = []

        async def answer(key: str, params: dict[str, Any], tg: TaskGroup) -> None:
            try:
                answers[key] = await self._sample(params, f"{request_id}/{key}")
            except SamplingError as exc:
                failures.append(exc)
                tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            for key, params in questions.items():
                tg.start_soon(answer, key, params, tg)
        if failures:
            raise failures[0]
        return answers

    async def _expire(self, stash: ir.Stash, token: str) -> None:
        """Drop the approval question of `token` once its time is up, unless it was answered: its
        sampling requests are refused then (`_expired`), not when a late answer finds it gone (none
        may come)."""
        while True:
            expires = stash.expires(token)
            if expires is None:  # answered in time (taken), or dropped as expired already
                return
            left = expires - stash.clock()
            if left <= 0:
                stash.holds()  # drops it, and any other expired
                return
            await anyio.sleep(max(left, 0.001))  # a loop may wake a tick early: then once more

    def _expired(self, token: str, entry: ir.StashedRound) -> None:
        """A stash entry's time ran out: the sampling requests awaiting its approval are refused."""
        if not entry.pending:
            return
        request_id = entry.asked_for
        log.warning(
            "sampling approval not answered in time; sampling refused",
            extra={"request_id": request_id, "timeout": self.approver.timeout if self.approver else None},
        )
        self._refuse_questions(request_id, entry.pending, rejected("timed out"))

    def _abandoned(self, token: str, entry: ir.StashedRound) -> None:
        """A stash entry let go while its approval question was open: its questions are reported."""
        for key, params in entry.pending.items():
            self._cancelled(params, f"{entry.asked_for}/{key}")

    def _never_sampled(self, request_id: Any, chain: InputChain, questions: dict[str, Any]) -> None:
        """A round's sampling questions (the user's approval given, it may be) that were not
        sampled: the client's cancel came first (`refused` with -32800, as when it cuts them while
        the user is asked), or the proxy stopped (`cancelled`). They had no audit line."""
        if chain.cut is not None:
            refusal = SamplingError(protocol.REQUEST_CANCELLED, chain.cut)
            self._refuse_questions(request_id, questions, refusal)
            return
        for key, params in questions.items():
            self._cancelled(params, f"{request_id}/{key}")

    def _refuse_questions(self, request_id: Any, questions: dict[str, Any], refusal: SamplingError) -> None:
        """The round's sampling questions were refused before any was sampled: each is reported."""
        for key, params in questions.items():
            self._refused(params, refusal, f"{request_id}/{key}")

    async def _fail(self, request_id: Any, code: int, message: str, data: Any = None) -> None:
        await self._send_client(jsonrpc.encode(jsonrpc.error_response(request_id, code, message, data)))
