"""Task-augmented sampling answered by the proxy (handshake era, MCP 2025-11-25).

When the proxy answers a `sampling/createMessage` that carries `params.task`, the server gets a
`CreateTaskResult` at once and the Claude call runs in the background; the server then asks the
proxy `tasks/get`, `tasks/result` (which waits for a terminal status), `tasks/list` and
`tasks/cancel`. Requests about tasks the client owns (a client that runs tasks itself, say for
elicitation) go to the client untouched: the proxy's task ids carry a prefix, so routing is by id.
A `tasks/list` is the client's when it declared `tasks.list`; the proxy's tasks are then added to
its last page. Every status change is announced with `notifications/tasks/status`.

Cancelling a task cancels its Claude call, charged like any cancelled call; so does the client
cancelling the request a task was made for (`cut_for_client`); an expired task is forgotten (a
working one is cancelled first, as is one evicted to make room past `MAX_TASKS`); a failure
becomes a failed task whose `tasks/result` is the JSON-RPC error the request would have got.

Everything sent to the upstream about tasks is sent for the session it belongs to: once the client
begins a new one (`end_session`), what was still to be sent for the one before (a task not sent
yet, a status notification, a `tasks/result` answer) is dropped, not sent into the new session.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from mcp_backfill import jsonrpc, protocol
from mcp_backfill.errors import SamplingError
from mcp_backfill.logs import get_logger
from mcp_backfill.relay.answering import InHand
from mcp_backfill.relay.capabilities import ClientProfile
from mcp_backfill.relay.task_book import (
    EVICTED,
    EXPIRED,
    MAX_TASKS,
    SamplingTask,
    TaskBook,
    TaskError,
    is_own_task,
)

log = get_logger("relay")

Run = Callable[[dict[str, Any], Any, Any, Callable[[], str | None]], Awaitable[dict[str, Any]]]
"""Answers one sampling request: `(params, request id, related client request id, cut) -> result`,
where `cut()` is the refusal (-32800) once the client's cancel has cut the task, else None."""


class SamplingTasks:
    """The proxy's sampling tasks for one session, and its answers to the server's `tasks/*`.

    Long because every way a task ends (its call's end, `tasks/cancel`, the client's cancel, its
    TTL, eviction, a new session) meets every message about it (the task, its status, the answers
    to `tasks/*`) in the same state: the calls' scopes, the waits and the ids in flight.
    """

    def __init__(
        self,
        book: TaskBook,
        run: Run,
        send_upstream: Callable[[bytes], Awaitable[None]],
        *,
        hand: InHand | None = None,
    ) -> None:
        self.book = book
        # The server's requests answered here count with the session's others (see `InHand`).
        self._hand = hand if hand is not None else InHand()
        self._run = run
        self._send_upstream = send_upstream
        self._scopes: dict[str, anyio.CancelScope] = {}  # working tasks' Claude calls
        self._done: dict[str, anyio.Event] = {}
        self._related: dict[str, jsonrpc.IdKey] = {}  # working tasks' client requests, when known
        self._cut: dict[str, str] = {}  # working tasks the client's cancel cut: the refusal
        self._waiting: dict[jsonrpc.IdKey, anyio.CancelScope] = {}  # tasks/result requests waiting
        # Task-augmented requests whose task has yet to be sent: their ids, to their tasks' ids.
        self._creating: dict[jsonrpc.IdKey, str] = {}
        self._client_lists: set[jsonrpc.IdKey] = set()  # tasks/list requests the client answers
        self._replies: list[bytes] = []  # answers ready for the upstream (`take_replies`)
        # The client's session (counted from 0; `end_session` begins the next): what is sent to the
        # upstream about tasks is sent only in the session it belongs to.
        self._session = 0
        self._tg: TaskGroup | None = None

    def start(self, task_group: TaskGroup) -> None:
        self._tg = task_group

    # -- creating and running --------------------------------------------------------------------

    def create(self, request_id: Any, params: dict[str, Any], related: Any = None) -> None:
        """A task-augmented sampling request: answered with a task now, sampled in the background."""
        requested = params["task"].get("ttl")
        task, evicted = self.book.create(requested)
        self._forget(evicted)
        # The call ends with the task's TTL: a task forgotten keeps no call running (and billed) for
        # an answer nobody can fetch, whether or not a later request of the session looks at the book.
        scope = anyio.CancelScope(deadline=anyio.current_time() + task.expires() - self.book.clock())
        self._scopes[task.task_id] = scope
        self._done[task.task_id] = anyio.Event()
        if related is not None:
            self._related[task.task_id] = jsonrpc.id_key(related)
        self._creating[jsonrpc.id_key(request_id)] = task.task_id
        log.info("sampling task created", extra={"request_id": request_id, "task_id": task.task_id})
        untasked = {key: value for key, value in params.items() if key != "task"}
        assert self._tg is not None
        self._hand.start(self._tg, self._work, request_id, untasked, related, task, scope, self._session)

    async def _work(
        self,
        request_id: Any,
        params: dict[str, Any],
        related: Any,
        task: SamplingTask,
        scope: anyio.CancelScope,
        session: int,
    ) -> None:
        finished = False
        key = jsonrpc.id_key(request_id)
        try:
            if self._creating.get(key) == task.task_id:  # not cancelled by the server before it went out
                created = jsonrpc.result_response(request_id, {"task": task.wire()})
                await self._send(session, jsonrpc.encode(created), "task", request_id)
            if self._creating.get(key) == task.task_id:  # not a later request's under the same id
                del self._creating[key]
            with scope:  # cancelled already if the server cancelled the request: nothing is sampled
                try:
                    result = await self._run(params, request_id, related, lambda: self._cut.get(task.task_id))
                    finished = self.book.finish(task, "completed", ("result", result))
                except SamplingError as exc:
                    error = {"code": exc.code, "message": exc.message}
                    if exc.data is not None:
                        error["data"] = exc.data
                    finished = self.book.finish(task, "failed", ("error", error), exc.message)
            if scope.cancelled_caught and not task.terminal:  # forgotten (expired, evicted) while working
                message = EVICTED if task.evicted else EXPIRED
                error = {"code": protocol.REQUEST_CANCELLED, "message": message}
                finished = self.book.finish(task, "cancelled", ("error", error), message + ".")
                # Forgotten now, if its call's deadline ended it before the book was looked at:
                # ending it made it a task just finished, kept past its TTL for an answer it has not.
                self.book.tasks.pop(task.task_id, None)
        finally:
            self._scopes.pop(task.task_id, None)
            self._related.pop(task.task_id, None)
            self._cut.pop(task.task_id, None)
            done = self._done.pop(task.task_id, None)
            if done is not None:
                done.set()
        if finished:
            log.info("sampling task finished", extra={"task_id": task.task_id, "status": task.status})
            await self._announce(task, session)

    def cut_for_client(self, related: Any, refusal: str) -> None:
        """The client cancelled its request `related`: the working tasks made for it are cancelled
        (their Claude calls stopped, and charged), their result the error `refusal` (-32800)."""
        key = jsonrpc.id_key(related)
        error = {"code": protocol.REQUEST_CANCELLED, "message": refusal}
        for task_id in [task_id for task_id, made_for in self._related.items() if made_for == key]:
            task = self.book.tasks.get(task_id)
            if task is None or not self.book.finish(task, "cancelled", ("error", error), refusal):
                continue
            log.info(
                "client cancelled the request a sampling task was made for; cancelled",
                extra={"task_id": task_id, "related": related},
            )
            self._cut[task_id] = refusal
            self._scopes[task_id].cancel()
            assert self._tg is not None
            self._tg.start_soon(self._announce, task, self._session)

    def end_session(self) -> None:
        """The client began a new session (`initialize` again): the tasks of the one before are
        cancelled (their Claude calls stopped, and charged) and forgotten. Its server (over an HTTP
        upstream, a session already deleted) can no longer fetch them, and the new one must not
        see them. Nothing more is sent about them: not a task still to be sent, nor a status
        notification, nor the answer to a `tasks/result` still waiting (the requests of the session
        before are no longer the server's; over an HTTP upstream they would be POSTed into the new
        session)."""
        self._session += 1
        self._creating.clear()  # their ids are free for the new session's requests
        for waiting in self._waiting.values():
            waiting.cancel()
        self._waiting.clear()
        self._client_lists.clear()
        if not self.book.tasks:
            self.book.clear()
            return
        message = "The session the task was made in ended: the client began a new one"
        error = {"code": protocol.REQUEST_CANCELLED, "message": message}
        for task in self.book.tasks.values():
            if self.book.finish(task, "cancelled", ("error", error), message + "."):
                scope = self._scopes.get(task.task_id)
                if scope is not None:
                    scope.cancel()
        log.info("client began a new session; its earlier sampling tasks are cancelled and forgotten")
        self.book.clear()

    def _forget(self, tasks: list[SamplingTask]) -> None:
        """Tasks dropped from the book (expired, or evicted to make room): a working one's Claude
        call is stopped (and charged, as any cancelled call)."""
        for task in tasks:
            scope = self._scopes.get(task.task_id)
            if scope is None:
                continue
            if task.evicted:
                log.warning(
                    "sampling task evicted while working, to make room for a new one (the session "
                    f"kept {MAX_TASKS} tasks, MAX_TASKS, none finished); cancelled",
                    extra={"task_id": task.task_id},
                )
            else:
                log.info("sampling task expired while working; cancelled", extra={"task_id": task.task_id})
            scope.cancel()

    async def _announce(self, task: SamplingTask, session: int) -> None:
        note = {"jsonrpc": "2.0", "method": protocol.TASKS_STATUS, "params": task.wire()}
        await self._send(session, jsonrpc.encode(note), "task status", task_id=task.task_id)

    async def _send(
        self, session: int, raw: bytes, what: str, request_id: Any = None, *, task_id: str | None = None
    ) -> None:
        """Send `raw` to the upstream if the client's session it belongs to is still the current one."""
        if session == self._session:
            await self._send_upstream(raw)
            return
        log.debug(
            "message about a sampling task of the client's session before its new one; dropped",
            extra={"sent": what, "request_id": request_id, "task_id": task_id},
        )

    # -- the server's tasks/* requests -----------------------------------------------------------

    def take_request(
        self, message: dict[str, Any], method: str, params: dict[str, Any], client: ClientProfile
    ) -> dict[str, Any] | None:
        """One of the server's `tasks/*` requests: None when the proxy answers it, else the message,
        for the client. A `tasks/result` is answered in the background (it waits for its task);
        the others' answers are ready at once, for the relay to send (`take_replies`), so that none
        waits for room among the requests in hand (those may all be Claude calls of long tasks)."""
        mine = self.answers(method, params, client)
        if not mine:
            if method == protocol.TASKS_LIST:  # the proxy's tasks join the client's last page
                self._client_lists.add(jsonrpc.id_key(message["id"]))
            return message
        self._forget(self.book.expire())
        if method == protocol.TASKS_RESULT:
            # Being answered from now on: a cancel of it, or another request under its id, read
            # before its answering task first runs finds it.
            scope = anyio.CancelScope()
            self._waiting[jsonrpc.id_key(message["id"])] = scope
            assert self._tg is not None
            self._hand.start(self._tg, self._fetch, message["id"], params, self._session, scope)
            return None
        try:
            reply = jsonrpc.result_response(message["id"], self._now(method, params))
        except TaskError as exc:
            reply = jsonrpc.error_response(message["id"], protocol.INVALID_PARAMS, str(exc))
        self._replies.append(jsonrpc.encode(reply))
        return None

    @property
    def replies_ready(self) -> bool:
        """Are answers waiting for `take_replies`?"""
        return bool(self._replies)

    def take_replies(self) -> list[bytes]:
        """The answers to the server's `tasks/get`, `tasks/list` and `tasks/cancel` taken since the
        last call, for the upstream, in order."""
        replies, self._replies = self._replies, []
        return replies

    @staticmethod
    def answers_at_once(method: str, params: dict[str, Any], client: ClientProfile) -> bool:
        """Is the server's `tasks/*` request the proxy's to answer at once (not a `tasks/result`)?"""
        return method != protocol.TASKS_RESULT and SamplingTasks.answers(method, params, client)

    @staticmethod
    def answers(method: str, params: dict[str, Any], client: ClientProfile) -> bool:
        """Is the server's `tasks/*` request the proxy's to answer (else the client's)?"""
        if method == protocol.TASKS_LIST:
            return not client.lists_tasks()
        return is_own_task(params.get("taskId")) or client.tasks is None

    async def _fetch(
        self, request_id: Any, params: dict[str, Any], session: int, scope: anyio.CancelScope
    ) -> None:
        """`tasks/result`, in the background: once its task is terminal, what the sampling request
        would have returned. `scope` is cancelled when the server cancels it: no answer is sent.
        Its id stays in use until its answer is sent (or it is cancelled)."""
        key = jsonrpc.id_key(request_id)
        try:
            reply = None
            with scope:
                reply = await self._result(request_id, params)
            if reply is None or scope.cancel_called:
                return  # the server cancelled its tasks/result: it expects no answer
            await self._send(session, jsonrpc.encode(reply), "tasks/result answer", request_id)
        finally:
            if self._waiting.get(key) is scope:  # not a later request's
                del self._waiting[key]

    def _now(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The answer to `tasks/get`, `tasks/list` or `tasks/cancel`; raises `TaskError`."""
        if method == protocol.TASKS_GET:
            return self.book.get(params.get("taskId")).wire()
        if method == protocol.TASKS_LIST:
            tasks, cursor = self.book.page(params.get("cursor"))
            page: dict[str, Any] = {"tasks": [task.wire() for task in tasks]}
            if cursor is not None:
                page["nextCursor"] = cursor
            return page
        task = self.book.cancel(params.get("taskId"))
        log.info("sampling task cancelled by the server", extra={"task_id": task.task_id})
        scope = self._scopes.get(task.task_id)
        if scope is not None:
            scope.cancel()
        assert self._tg is not None
        self._tg.start_soon(self._announce, task, self._session)
        return task.wire()

    async def _result(self, request_id: Any, params: dict[str, Any]) -> dict[str, Any]:
        """The answer to `tasks/result`, once its task is terminal."""
        try:
            task = self.book.get(params.get("taskId"))
        except TaskError as exc:
            return jsonrpc.error_response(request_id, protocol.INVALID_PARAMS, str(exc))
        done = self._done.get(task.task_id)
        if done is not None and not task.terminal:
            await done.wait()
        assert task.outcome is not None
        task.fetched = True
        kind, body = task.outcome
        if kind == "error":
            return jsonrpc.error_response(request_id, body["code"], body["message"], body.get("data"))
        meta = {**(body.get("_meta") or {}), protocol.META_RELATED_TASK: {"taskId": task.task_id}}
        return jsonrpc.result_response(request_id, {**body, "_meta": meta})

    def waiting(self, request_id: Any) -> bool:
        """Is `request_id` a `tasks/result` of the server's not answered yet, or a task-augmented
        request whose task has yet to be sent?"""
        key = jsonrpc.id_key(request_id)
        return key in self._waiting or key in self._creating

    def cancel_waiting(self, request_id: Any) -> bool:
        """The server cancelled a `tasks/result` it was waiting on, or a task-augmented request
        whose task had yet to be sent; False if it is neither."""
        key = jsonrpc.id_key(request_id)
        scope = self._waiting.pop(key, None)  # its id is free again
        if scope is not None:
            scope.cancel()
            return True
        task_id = self._creating.pop(key, None)
        if task_id is None:
            return False
        # The server has no task id to ask `tasks/cancel` with, nor will it look at the task: the
        # task is forgotten, never announced, and its Claude call never starts (nothing is charged).
        task = self.book.tasks.pop(task_id, None)
        if task is not None:
            message = "The server cancelled the request before its task was sent"
            error = {"code": protocol.REQUEST_CANCELLED, "message": message}
            self.book.finish(task, "cancelled", ("error", error), message + ".")
        scope = self._scopes.get(task_id)
        if scope is not None:
            scope.cancel()
        log.info(
            "server cancelled a task-augmented sampling request before its task was sent; forgotten",
            extra={"request_id": request_id, "task_id": task_id},
        )
        return True

    # -- the client's tasks/list -----------------------------------------------------------------

    def list_cancelled(self, request_id: Any) -> None:
        """The server cancelled a request: if a `tasks/list` the client answers, no answer need come."""
        if self._client_lists:
            self._client_lists.discard(jsonrpc.id_key(request_id))

    def merge_list(self, message: dict[str, Any]) -> dict[str, Any]:
        """The client's response to a forwarded `tasks/list`, with the proxy's tasks on its last page."""
        key = jsonrpc.id_key(message.get("id"))
        if key not in self._client_lists:
            return message
        self._client_lists.discard(key)
        result = message.get("result")
        last_page = isinstance(result, dict) and not result.get("nextCursor")
        if not last_page or not isinstance(result, dict) or not isinstance(result.get("tasks"), list):
            return message
        self.book.expire()
        mine = [task.wire() for task in self.book.tasks.values()]
        return {**message, "result": {**result, "tasks": [*result["tasks"], *mine]}} if mine else message
