"""A scriptable streamable-HTTP endpoint that records every HTTP request it gets.

Run it as `python tests/servers/http_recorder.py RECORD_FILE`: it listens on 127.0.0.1 (a free
port), prints `listening on http://127.0.0.1:PORT/mcp` as its first stdout line, and appends one JSON
line per HTTP request to RECORD_FILE: `{"verb", "headers", "body", "peer"}` (header names lower-cased;
`peer`: the client's port, which tells the TCP connections apart).

It speaks just enough of the handshake era for a client to get through `initialize` (session
`rec-session-1`, with a `Set-Cookie: lb=replica-7` as a sticky load balancer sends; a client named
`bad-session-id` gets one MCP does not allow, `rec-\u00e9`, not visible ASCII; one named
`bad-version` the protocol version `2025-11-25\u00e9`), and answers these methods (by the JSON-RPC
method of the POSTed request):

* a notification whose method starts with `notifications/slow-ack`: recorded and acknowledged
  only after 0.2 s (anything sent before its acknowledgement is recorded first);
* `recorder/requests`: result `{"requests": [...]}`, everything recorded so far;
* `fail/500`: HTTP 500, text body `database on fire`;
* `fail/teapot`: HTTP 418, text body `short and stout`;
* `fail/echo-auth`: HTTP 401, a text body quoting the `Authorization` header it was sent (as careless
  servers do);
* `fail/echo-auth-jsonrpc`: HTTP 401 with a JSON-RPC error whose message quotes the `Authorization`
  header it was sent;
* `fail/jsonrpc-400`: HTTP 400 with a JSON-RPC error `-32602 bad params from server` as the body;
* `fail/hang-up`: closes the connection without answering;
* `session/endless-close`: from then on, a DELETE is answered 200 with a body that never ends;
* `fail/endless-500`: HTTP 500 whose text body never ends (a kilobyte every 50 ms, until the client
  closes the connection);
* `fail/redirect`: HTTP 307 to the same URL with a slash after its path (its query kept), as
  Starlette's `redirect_slashes` answers;
* `big/json` and `big/sse` (`params.size`): a result padded to about that many bytes, as a JSON body
  or as the data of one SSE event after a notification;
* `bad/sse`: an SSE stream whose one event is the answer with a byte that is no UTF-8 (not JSON);
* `poll/answer` (`params.polls`): an SSE stream holding only a priming event (an id, `retry: 20`,
  empty data), then its end, as a server that has the client poll for a long-running request
  (2025-11-25); each GET resuming it with `Last-Event-ID` gets the next priming event and its end,
  and the `polls`-th one the result `{"polls": <polls>}` (with `params.label`, the event ids start
  with it instead of `poll`: any text, which travels back in `Last-Event-ID` as UTF-8; the label
  `pollnow` has the priming events say `retry: 0`);
* `poll/replay-sample`: an SSE stream holding a priming event (id `replay-0`, `retry: 20`) and a
  `sampling/createMessage` request (id `dup-1`) with no id of its own, then its end; a GET resuming
  it sends that request again (everything after the priming event, as SSE ids go: an event without
  an `id:` keeps the last one), waits (up to 20 s) for an answer to `dup-1`, then sends the result
  `{"answers": <the answers to dup-1 received so far>}`;
* a client named `standalone-replay` gets a standalone GET stream: the first holds a priming
  event (id `g-0`) and a `sampling/createMessage` request (id `dup-g`) with no id of its own, then
  ends; the next (resuming from `g-0`) sends that request again, waits (up to 20 s) for an answer
  to it, and a second more, then ends; any later GET gets 405 (a client named
  `standalone-replay-batch` gets the same, the request in a JSON array of its own, a batch);
* a client named `standalone-stale` gets a standalone GET stream holding a priming event (id
  `stale-0`, `retry: 20`), then its end; a GET resuming from `stale-0` gets HTTP 400 (`unknown event
  id`), as a server that lost its event store (a restart, another replica); a GET without
  `Last-Event-ID` gets the notification `notifications/fresh` and pings for up to a minute; a
  client named `standalone-stale-empty` gets the same, but the GET resuming from `stale-0` gets an
  SSE stream that ends at once with nothing, as the MCP SDK's server answers an event id its event
  store does not know; a client named `standalone-flaky` gets HTTP 503 for its first three GETs (a
  server restarting behind its load balancer), then the notification `notifications/fresh` and
  pings for up to a minute; a client named `standalone-retry` gets a standalone GET stream holding
  only the line `retry: 60000` (no event after it), then its end, and any later GET gets 405;
* `poll/refused` (`params.endless`: its refusals' bodies do not end): an SSE stream holding only a
  priming event (id `refuse-0`, or `refuse-endless` when endless; `retry: 20`), then its end; a GET
  resuming it gets HTTP 400, text body `unknown event id` (when endless, followed by a line every
  0.2 s for a minute);
* `sse/retry` (`params.retry`, a string): result `{}` as an SSE event whose `retry:` field is that;
* `sse/answer-again` (`params.id`): an SSE stream holding a second answer (result `{"again": true}`)
  to the earlier request `params.id`, as a server that answers a request twice, then result `{}`;
* `session/garble-close`: result `{}`; the DELETE that ends the session is then answered with a body
  that says `Content-Encoding: gzip` and is not;
* `session/forget`: result `{}`, then the session is unknown (every later request gets HTTP 404);
* `reset/mid-stream`: a chunked SSE stream holding a priming event with a notification (id
  `brk-0`, `retry: 20`, the notification `notifications/message`), then, 0.3 s later, a TCP reset
  (no end of the stream, no answer); a GET resuming from `brk-0` gets the result `{"resumed": true}`;
* anything else: result `{"method": <method>}`.

A client named `no-cookie` gets no `Set-Cookie` with its session.

Notifications and responses get 202, except the notification `notifications/stream-forever`: an
SSE stream of pings that does not end (for a minute) as a broken server may answer one; GET gets
405; DELETE ends the session (200).
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SESSION = "rec-session-1"
AFFINITY = "lb=replica-7"
SAMPLE_ID = "dup-1"
STANDALONE_SAMPLE_ID = "dup-g"
SAMPLE_REQUEST: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": SAMPLE_ID,
    "method": "sampling/createMessage",
    "params": {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}], "maxTokens": 50},
}


class State:
    def __init__(self, record_file: Path) -> None:
        self.record_file = record_file
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.session_alive = True
        self.garble_close = False
        self.endless_close = False
        self.replay_request_id: Any = None
        self.break_request_id: Any = None  # the request of `reset/mid-stream`
        self.standalone_replay = False  # a client named `standalone-replay` opened the session
        self.standalone_batch = False  # ... or `standalone-replay-batch`
        self.standalone_gets = 0
        self.standalone_stale: str | bool = False  # a client named `standalone-stale(-empty)` did

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.requests.append(entry)
            with self.record_file.open("a") as out:
                out.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep stderr quiet

    def _record(self, body: Any) -> None:
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.state.record(
            {"verb": self.command, "headers": headers, "body": body, "peer": self.client_address[1]}
        )

    def _reply(
        self, status: int, body: bytes = b"", content_type: str = "application/json", **extra: str
    ) -> None:
        self.send_response(status)
        if body or status != 202:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _result(self, request_id: Any, result: Any, **extra: str) -> None:
        self._reply(200, json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}).encode(), **extra)

    def do_GET(self) -> None:
        self._record(None)
        # http.server reads a header's bytes as Latin-1; an event id goes back as UTF-8.
        resumed = self.headers.get("last-event-id", "").encode("latin-1").decode("utf-8", "replace")
        if self.state.standalone_replay and self.state.standalone_gets < 2:
            self.state.standalone_gets += 1
            self._standalone_replay(again=resumed == "g-0")
            return
        if self.state.standalone_stale == "flaky" and self.state.standalone_gets < 3:
            self.state.standalone_gets += 1
            self._reply(503, b"restarting", "text/plain")
            return
        if self.state.standalone_stale == "retry":
            self.state.standalone_stale = False
            self._reply(200, b"retry: 60000\n", "text/event-stream")
            return
        if self.state.standalone_stale:
            self._standalone_stale(resumed)
            return
        if resumed == "refuse-0":
            self._reply(400, b"unknown event id", "text/plain")
            return
        if resumed == "refuse-endless":
            self._endless_refusal()
            return
        if resumed == "brk-0":
            answer = {"jsonrpc": "2.0", "id": self.state.break_request_id, "result": {"resumed": True}}
            self._reply(200, f"id: brk-1\ndata: {json.dumps(answer)}\n\n".encode(), "text/event-stream")
            return
        if resumed == "replay-0":
            self._replay_sample()
            return
        if resumed.startswith("poll"):
            label, polls, done, request_id = resumed.split("-", 3)
            if int(done) + 1 < int(polls):
                priming = _priming(label, int(polls), int(done) + 1, request_id)
                self._reply(200, priming, "text/event-stream")
            else:
                answer = {"jsonrpc": "2.0", "id": json.loads(request_id), "result": {"polls": int(polls)}}
                self._reply(200, f"data: {json.dumps(answer)}\n\n".encode(), "text/event-stream")
            return
        self._reply(405, b"", Allow="POST, DELETE")

    def _reset_mid_stream(self, request_id: Any) -> None:
        self.state.break_request_id = request_id
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "before the break"}}
        event = f"id: brk-0\nretry: 20\ndata: {json.dumps(note)}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.flush()
        time.sleep(0.3)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()

    def _endless_refusal(self) -> None:
        self.close_connection = True
        self.send_response(400)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        deadline = time.monotonic() + 60
        try:
            self.wfile.write(b"unknown event id\n")
            while time.monotonic() < deadline:
                self.wfile.flush()
                time.sleep(0.2)
                self.wfile.write(b"and more\n")
        except OSError:
            pass  # the client closed it

    def _replay_sample(self) -> None:
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(f"data: {json.dumps(SAMPLE_REQUEST)}\n\n".encode())
        self.wfile.flush()
        deadline = time.monotonic() + 20
        while not self._answers_to(SAMPLE_ID) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a second answer, were one coming, has come
        answers = self._answers_to(SAMPLE_ID)
        with self.state.lock:
            request_id = self.state.replay_request_id
        answer = {"jsonrpc": "2.0", "id": request_id, "result": {"answers": answers}}
        self.wfile.write(f"data: {json.dumps(answer)}\n\n".encode())
        self.wfile.flush()

    def _standalone_replay(self, *, again: bool) -> None:
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        request: Any = {**SAMPLE_REQUEST, "id": STANDALONE_SAMPLE_ID}
        if self.state.standalone_batch:
            request = [request]
        head = "" if again else "id: g-0\nretry: 20\ndata:\n\n"
        self.wfile.write(f"{head}data: {json.dumps(request)}\n\n".encode())
        self.wfile.flush()
        if again:
            deadline = time.monotonic() + 20
            while not self._answers_to(STANDALONE_SAMPLE_ID) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1)

    def _standalone_stale(self, resumed: str) -> None:
        if resumed == "stale-0" and self.state.standalone_stale == "empty":
            self._reply(200, b"", "text/event-stream")
            return
        if resumed == "stale-0":
            self._reply(400, b"unknown event id", "text/plain")
            return
        if self.state.standalone_gets == 0:
            self.state.standalone_gets += 1
            self._reply(200, b"id: stale-0\nretry: 20\ndata:\n\n", "text/event-stream")
            return
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        fresh = {"jsonrpc": "2.0", "method": "notifications/fresh", "params": {}}
        deadline = time.monotonic() + 60
        try:
            self.wfile.write(f"data: {json.dumps(fresh)}\n\n".encode())
            while time.monotonic() < deadline:
                self.wfile.flush()
                time.sleep(0.2)
                self.wfile.write(b": ping\n\n")
        except OSError:
            pass  # the client closed the stream

    def _answers_to(self, request_id: str) -> list[Any]:
        with self.state.lock:
            bodies = [entry["body"] for entry in self.state.requests if entry["verb"] == "POST"]
        items = [item for b in bodies for item in (b if isinstance(b, list) else [b])]
        return [b for b in items if isinstance(b, dict) and "method" not in b and b.get("id") == request_id]

    def do_DELETE(self) -> None:
        self._record(None)
        self.state.session_alive = False
        if self.state.garble_close:
            self._reply(200, b"not gzip", Content_Encoding="gzip")
            return
        if self.state.endless_close:
            self._trickle(200)
            return
        self._reply(200, b"{}")

    def _trickle(self, status: int, chunk: bytes = b" ", pause: float = 0.5) -> None:
        """Answer `status` with a text body that never ends: `chunk` every `pause` seconds, until the
        client closes the connection."""
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            while True:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
                time.sleep(pause)
        except OSError:
            self.close_connection = True

    def _ping_for_a_minute(self) -> None:
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                self.wfile.write(b": ping\n\n")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass  # the client closed the stream

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        message = json.loads(self.rfile.read(length))
        method = message.get("method") if isinstance(message, dict) else None
        if isinstance(method, str) and method.startswith("notifications/slow-ack"):
            time.sleep(0.2)  # recorded, and acknowledged, only after a while
        self._record(message)
        if method != "initialize" and not self.state.session_alive:
            self._reply(404, b"Session not found", "text/plain")
            return
        if "id" not in message or method is None:
            if method == "notifications/stream-forever":
                self._ping_for_a_minute()
                return
            self._reply(202)
            return
        request_id = message["id"]
        if method == "initialize":
            self.state.session_alive = True
            client = message["params"].get("clientInfo", {}).get("name")
            self.state.standalone_replay = client in ("standalone-replay", "standalone-replay-batch")
            self.state.standalone_batch = client == "standalone-replay-batch"
            stale: dict[Any, str | bool] = {
                "standalone-stale": True,
                "standalone-stale-empty": "empty",
                "standalone-flaky": "flaky",
                "standalone-retry": "retry",
            }
            self.state.standalone_stale = stale.get(client, False)
            version = message["params"]["protocolVersion"]
            result = {
                "protocolVersion": version + "\u00e9" if client == "bad-version" else version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "http-recorder", "version": "0"},
            }
            # As a load balancer pinning the session to a replica would (each later request must carry it).
            session = "rec-\u00e9" if client == "bad-session-id" else SESSION
            if client == "no-cookie":
                self._result(request_id, result, Mcp_Session_Id=session)
                return
            self._result(request_id, result, Mcp_Session_Id=session, Set_Cookie=f"{AFFINITY}; Path=/")
        elif method == "recorder/requests":
            with self.state.lock:
                self._result(request_id, {"requests": list(self.state.requests)})
        elif method == "fail/500":
            self._reply(500, b"database on fire", "text/plain")
        elif method == "fail/teapot":
            self._reply(418, b"short and stout", "text/plain")
        elif method == "fail/echo-auth":
            quoted = f"bad credentials: {self.headers.get('authorization')}"
            self._reply(401, quoted.encode(), "text/plain")
        elif method == "fail/echo-auth-jsonrpc":
            error = {"code": -32001, "message": f"bad credentials: {self.headers.get('authorization')}"}
            self._reply(401, json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode())
        elif method == "fail/jsonrpc-400":
            error = {"code": -32602, "message": "bad params from server"}
            self._reply(400, json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode())
        elif method == "fail/redirect":
            path, mark, query = self.path.partition("?")
            location = f"http://{self.headers['host']}{path}/{mark}{query}"
            self._reply(307, b"", "text/plain", Location=location)
        elif method == "fail/endless-500":
            self._trickle(500, b"on fire " * 128, 0.05)
        elif method == "fail/hang-up":
            self.close_connection = True
            self.connection.shutdown(2)
        elif method in ("big/json", "big/sse"):
            padding = "x" * int(message["params"]["size"])
            body = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"padding": padding}}).encode()
            if method == "big/json":
                self._reply(200, body)
                return
            note = json.dumps(
                {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "big"}}
            )
            stream = f"data: {note}\n\n".encode() + b"data: " + body + b"\n\n"
            self._reply(200, stream, "text/event-stream")
        elif method == "bad/sse":
            head = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {"text": ""}})[:-3]
            self._reply(200, b"data: " + head.encode() + b'"\xff"}}\n\n', "text/event-stream")
        elif method == "poll/answer":
            label = message["params"].get("label", "poll")
            priming = _priming(label, int(message["params"]["polls"]), 0, json.dumps(request_id))
            self._reply(200, priming, "text/event-stream")
        elif method == "poll/refused":
            event_id = "refuse-endless" if message["params"].get("endless") else "refuse-0"
            self._reply(200, f"id: {event_id}\nretry: 20\ndata:\n\n".encode(), "text/event-stream")
        elif method == "poll/replay-sample":
            with self.state.lock:
                self.state.replay_request_id = request_id
            events = f"id: replay-0\nretry: 20\ndata:\n\ndata: {json.dumps(SAMPLE_REQUEST)}\n\n"
            self._reply(200, events.encode(), "text/event-stream")
        elif method == "reset/mid-stream":
            self._reset_mid_stream(request_id)
        elif method == "sse/retry":
            answer = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {}})
            stream = f"retry: {message['params']['retry']}\ndata: {answer}\n\n".encode()
            self._reply(200, stream, "text/event-stream")
        elif method == "sse/answer-again":
            again = json.dumps({"jsonrpc": "2.0", "id": message["params"]["id"], "result": {"again": True}})
            answer = json.dumps({"jsonrpc": "2.0", "id": request_id, "result": {}})
            self._reply(200, f"data: {again}\n\ndata: {answer}\n\n".encode(), "text/event-stream")
        elif method == "session/garble-close":
            self.state.garble_close = True
            self._result(request_id, {})
        elif method == "session/endless-close":
            self.state.endless_close = True
            self._result(request_id, {})
        elif method == "session/forget":
            self._result(request_id, {})
            self.state.session_alive = False
        else:
            self._result(request_id, {"method": method})


def _priming(label: str, polls: int, done: int, request_id: str) -> bytes:
    """A priming event of `poll/answer`: its id says how far the polling got, and for which request
    (with the label `pollnow`, it asks for `retry: 0`)."""
    retry = 0 if label == "pollnow" else 20
    return f"id: {label}-{polls}-{done}-{request_id}\nretry: {retry}\ndata:\n\n".encode()


def main() -> None:
    Handler.state = State(Path(sys.argv[1]))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/mcp", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
