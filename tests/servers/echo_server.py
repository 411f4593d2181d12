"""A raw stdio JSON-RPC upstream (no MCP SDK) for the proxy's pass-through fidelity tests.

Run it as `python tests/servers/echo_server.py`. It reads newline-delimited JSON from stdin and
writes one JSON message per line to stdout (flushed after every line). Ids are returned exactly as
received (`1` stays an int, `"1"` stays a string, `0` and `null` work). It exits 0 on stdin EOF.

Client → server messages:

* `initialize` (request): result `{"protocolVersion": <requested, else "2025-11-25">,
  "capabilities": {...}, "serverInfo": {"name": "echo-server", ...}, "echo": <params as received>}`.
* any other request: result `{"echo": <the whole request object as received>}`.
* any notification: recorded, then announced with the notification
  `{"method": "notifications/echo", "params": {"received": <the notification>}}`.
* a response nobody is waiting for: announced as `notifications/echo` with
  `{"unsolicited_response": <the response>}`.
* a batch (JSON array): every element handled as above; the replies go out as one array, followed
  by the `notifications/echo` announcements for the batch's notifications.
* a line that is not JSON (or nested deeper than `json` reads): error `-32700` with id `null`; a
  JSON value that is not a message:
  error `-32600`.

Test-control requests (the result is always sent after the action):

* `test/ask_client` `{"method": M, "params": P, "id": X}`: sends the request
  `{"jsonrpc": "2.0", "id": X, "method": M, "params": P}` to the client (`params` omitted when P is
  absent, `id` defaults to `"echo-ask-<n>"`), keeps serving other lines until the response with id X
  arrives, then answers `{"client_response": <the full response object>}`.
* `test/notify_client` `{"method": M, "params": P}`: sends that notification, answers
  `{"sent": true}`.
* `test/notifications`: answers `{"notifications": [<every notification received so far>]}`.
* `test/lines`: answers `{"lines": [<every line received so far, as text, without its newline>]}`:
  the bytes themselves, for what a parsed message cannot show (a number's digits, key order).
* `test/answer_raw` `{"result": T}`: answers with the JSON text T written as it is as its result
  (numbers a parsed value cannot carry, key order, duplicate keys).
* `test/answer_in_batch` `{"before": [M...], "after": [M...]}`: answers with one array holding the
  messages `before`, its result `{"echo": …}`, then the messages `after`, each as given.
* `test/exit` `{"code": N}`: answers `{"echo": …}`, then exits with status N (default 0).
* `test/garbage`: writes a non-JSON line to stdout, then answers `{"echo": …}`.
* `test/malformed_answer`: answers with a line that is no JSON (a byte that is no UTF-8 in a string).
* `test/stderr` `{"text": T}`: writes T to stderr, then answers `{"echo": …}`.

Fault helpers:

* `test/flood` `{"count": N, "method": M}`: writes N notifications `M` (default
  `notifications/message`) with params `{"seq": i}` (i = 0..N-1) as fast as it can, then answers
  `{"flooded": N}`.
* `test/ignore`: never answered (a server that hangs on one request but serves the others).
* `test/ask_and_exit` `{"method": M, "params": P, "code": C, "delay": S}`: sends the request `M`
  to the client (id `"echo-crash-ask"`), sleeps S seconds (default 0) and exits with status C
  (default 3) without reading the answer: a crash in the middle of a request, while its own
  request to the client is in flight.
* `test/sample_many` `{"count": N, "window": W, "params": P}`: sends N `sampling/createMessage`
  requests (params P, ids `"bulk-<batch>-<i>"`), at most W (default 8) in flight, serving other
  lines meanwhile, and answers `{"count": N, "results": R, "errors": {code: n}}` once each has its
  response. A response to an id that is not awaited (a duplicate) is announced as usual.
"""

import json
import sys
import time
from typing import Any, BinaryIO

GARBAGE_LINE = "this line is not JSON-RPC {"


class EchoServer:
    def __init__(self, stdin: BinaryIO, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self.notifications: list[Any] = []
        self._awaited: dict[str, Any] = {}  # key(id) -> response, None while still waiting
        self._ask_counter = 0
        self._bulk_batches = 0
        self._deferred: list[Any] | None = None  # announcements held back while answering a batch
        self.lines: list[str] = []  # every line received, as text (`test/lines`)

    # -- I/O ----------------------------------------------------------------------------------

    def write_line(self, text: str) -> None:
        # A lone surrogate (valid JSON as an escape) has no UTF-8 form: write it as its \u escape.
        self._stdout.write(text.encode("utf-8", errors="backslashreplace") + b"\n")
        self._stdout.flush()

    def send(self, message: Any) -> None:
        self.write_line(json.dumps(message, ensure_ascii=False, separators=(",", ":")))

    def serve(self) -> int:
        """Handle lines until stdin closes; returns the exit status."""
        try:
            while self.serve_one():
                pass
        except SystemExit as stop:
            return stop.code if isinstance(stop.code, int) else 0
        except BrokenPipeError:
            pass  # the client closed our stdout: nothing left to do
        return 0

    def serve_one(self) -> bool:
        """Read and handle one line; False on EOF."""
        raw = self._stdin.readline()
        if not raw:
            return False
        if not raw.strip():
            return True
        self.lines.append(raw.rstrip(b"\r\n").decode("utf-8", errors="backslashreplace"))
        try:
            message = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):  # nested deeper than json reads
            self.send(error_response(None, -32700, "Parse error"))
            return True
        if isinstance(message, list):
            # The batch's answer goes out first, then the notifications/echo its notifications caused.
            outer, self._deferred = self._deferred, []
            try:
                replies = [reply for item in message if (reply := self.handle(item)) is not None]
                if not message:
                    self.send(error_response(None, -32600, "Invalid Request: empty batch"))
                elif replies:
                    self.send(replies)
            finally:
                deferred, self._deferred = self._deferred, outer
            for announcement in deferred:
                self.announce(announcement)
        else:
            reply = self.handle(message)
            if reply is not None:
                self.send(reply)
        return True

    # -- dispatch -------------------------------------------------------------------------------

    def handle(self, message: Any) -> Any:
        """Handle one message; returns the reply to send, if any."""
        if not isinstance(message, dict):
            return error_response(None, -32600, "Invalid Request: not an object")
        method = message.get("method")
        if method is None and "id" in message and ("result" in message or "error" in message):
            self.on_response(message)
            return None
        if not isinstance(method, str):
            return error_response(message.get("id"), -32600, "Invalid Request: no method")
        if "id" not in message:
            self.notifications.append(message)
            self.announce({"received": message})
            return None
        return self.on_request(message["id"], method, message.get("params"), message)

    def on_response(self, response: dict[str, Any]) -> None:
        key = id_key(response["id"])
        if key in self._awaited and self._awaited[key] is None:
            self._awaited[key] = response
        else:
            self.announce({"unsolicited_response": response})

    def announce(self, params: dict[str, Any]) -> None:
        """Emit notifications/echo (after the reply when inside a batch)."""
        if self._deferred is not None:
            self._deferred.append(params)
        else:
            self.send(notification("notifications/echo", params))

    def on_request(self, request_id: Any, method: str, params: Any, request: dict[str, Any]) -> Any:
        args = params if isinstance(params, dict) else {}
        if method == "initialize":
            version = args.get("protocolVersion")
            return result_response(
                request_id,
                {
                    "protocolVersion": version if isinstance(version, str) else "2025-11-25",
                    "capabilities": {"tools": {}, "prompts": {}, "resources": {}, "logging": {}},
                    "serverInfo": {"name": "echo-server", "version": "1.0.0"},
                    "echo": params,
                },
            )
        if method == "test/ask_client":
            return result_response(request_id, {"client_response": self.ask_client(args)})
        if method == "test/notify_client":
            if not isinstance(args.get("method"), str):
                return error_response(request_id, -32602, "test/notify_client needs params.method")
            self.send(build_message(None, args["method"], args))
            return result_response(request_id, {"sent": True})
        if method == "test/notifications":
            return result_response(request_id, {"notifications": self.notifications})
        if method == "test/lines":
            return result_response(request_id, {"lines": self.lines})
        if method == "test/answer_raw":
            head = json.dumps({"jsonrpc": "2.0", "id": request_id})[:-1]
            self.write_line(f'{head},"result":{args.get("result", "{}")}}}')
            return None
        if method == "test/answer_in_batch":
            before, after = args.get("before", []), args.get("after", [])
            self.send([*before, result_response(request_id, {"echo": request}), *after])
            return None
        if method == "test/exit":
            code = args.get("code", 0)
            self.send(result_response(request_id, {"echo": request}))
            raise SystemExit(code if isinstance(code, int) else 0)
        if method == "test/flood":
            count = args.get("count", 1000)
            name = str(args.get("method", "notifications/message"))
            for seq in range(count if isinstance(count, int) else 0):
                self.send(notification(name, {"seq": seq}))
            return result_response(request_id, {"flooded": count})
        if method == "test/ignore":
            return None
        if method == "test/ask_and_exit":
            self.send(build_message("echo-crash-ask", str(args.get("method", "ping")), args))
            delay = args.get("delay", 0)
            time.sleep(delay if isinstance(delay, int | float) else 0)
            code = args.get("code", 3)
            raise SystemExit(code if isinstance(code, int) else 3)
        if method == "test/sample_many":
            return result_response(request_id, self.sample_many(args))
        if method == "test/malformed_answer":
            head = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"text": ""}})[:-3]
            self._stdout.write(head.encode() + b'"\xff"}}\n')
            self._stdout.flush()
            return None
        if method == "test/garbage":
            self.write_line(GARBAGE_LINE)
        elif method == "test/stderr":
            text = str(args.get("text", ""))
            self._stderr.write((text if text.endswith("\n") else text + "\n").encode("utf-8"))
            self._stderr.flush()
        return result_response(request_id, {"echo": request})

    def ask_client(self, args: dict[str, Any]) -> Any:
        """Send a request to the client and serve other lines until its response arrives."""
        if "id" in args:
            ask_id = args["id"]
        else:
            self._ask_counter += 1
            ask_id = f"echo-ask-{self._ask_counter}"
        key = id_key(ask_id)
        self._awaited[key] = None
        self.send(build_message(ask_id, str(args.get("method", "ping")), args))
        while self._awaited[key] is None:
            if not self.serve_one():
                raise SystemExit(0)  # client went away while we were waiting
        return self._awaited.pop(key)

    def sample_many(self, args: dict[str, Any]) -> dict[str, Any]:
        """Many sampling requests with a bounded window in flight; every one must be answered."""
        count = args.get("count", 100)
        window = args.get("window", 8)
        count = count if isinstance(count, int) else 100
        window = window if isinstance(window, int) and window > 0 else 8
        self._bulk_batches += 1
        ids = [f"bulk-{self._bulk_batches}-{i}" for i in range(count)]
        outstanding: list[str] = []
        sent = answered = results = 0
        errors: dict[str, int] = {}
        while answered < count:
            while sent < count and len(outstanding) < window:
                self._awaited[id_key(ids[sent])] = None
                message = build_message(ids[sent], "sampling/createMessage", {"params": args.get("params")})
                self.send(message)
                outstanding.append(ids[sent])
                sent += 1
            if not self.serve_one():
                raise SystemExit(0)
            for request_id in [i for i in outstanding if self._awaited[id_key(i)] is not None]:
                response = self._awaited.pop(id_key(request_id))
                outstanding.remove(request_id)
                answered += 1
                if "result" in response:
                    results += 1
                else:
                    code = str(response.get("error", {}).get("code"))
                    errors[code] = errors.get(code, 0) + 1
        return {"count": count, "results": results, "errors": errors}


def id_key(request_id: Any) -> str:
    """Distinguishes 1 from "1" (and from 1.0) when matching responses to requests."""
    return f"{type(request_id).__name__}:{json.dumps(request_id)}"


def build_message(message_id: Any, method: str, args: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0"}
    if message_id is not None:
        message["id"] = message_id
    message["method"] = method
    if "params" in args:
        message["params"] = args["params"]
    return message


def notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def result_response(request_id: Any, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def main() -> int:
    return EchoServer(sys.stdin.buffer, sys.stdout.buffer, sys.stderr.buffer).serve()


if __name__ == "__main__":
    sys.exit(main())
