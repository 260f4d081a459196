#!/usr/bin/env python3
"""A local HTTP endpoint for webhook deliveries, for the integration tests
(tests/common/webhooks.rs) and the benchmark (bench/phases/webhooks.py).

    python tests/webhook_receiver.py --port P --config CONFIG.json --log LOG.jsonl [--fast]

It listens on 127.0.0.1:P (0: a free port) and prints `listening on <port>`
on stdout once it accepts connections. CONFIG.json maps a URL path to how
that path answers a POST:

    {"/a": {"secret": "whsec_...", "fail_first": 5, "fail_status": 500,
            "status": 200, "sleep": 0.0}}

  secret       verify each request's Standard Webhooks signature with it
               (the PyPI package standardwebhooks); no secret: not verified
  fail_first   answer fail_status to the path's first N requests, counted over
               every request the log holds for the path (so the count goes on
               across a restart of the receiver on the same log)
  fail_status  default 500
  status       the answer after that, default 200
  location     a Location header to send with every answer (for redirects)
  sleep        seconds to wait before answering (past the sender's timeout:
               the sender gives up, the request stays in the log)

A path not in the config answers 404. The config is read again for every
request: a test changes it by writing a temporary file and renaming it over
CONFIG.json.

Every request appends one JSON line to LOG.jsonl, flushed when the request
arrives, before the sleep and the answer: path, webhook_id,
webhook_timestamp, webhook_signature, content_type, body (the raw body as
text), verified (true, false, or null without a secret), verify_error (why
verification failed), received_at (time.time()), received_mono
(time.monotonic(), the clock of the bench's publishers) and status (the
answer it is about to give). Bodies over --max-body bytes (64 MiB) are
refused with 413, logged with a null body.

--fast is the benchmark's mode: the config is read once at start, nothing is
verified (verified is null), and log lines are written in batches (every
50 ms and at exit on SIGTERM or SIGINT) instead of one flush per request.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 64 * 1024 * 1024


class Receiver(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True  # a request sleeping past its sender's timeout never blocks exit
    request_queue_size = 128

    def __init__(self, port, config_path, log_path, fast, max_body):
        super().__init__(("127.0.0.1", port), Handler)
        self.config_path, self.fast, self.max_body = config_path, fast, max_body
        self.config = read_config(config_path) if fast else None
        self.lock = threading.Lock()  # orders the counts and the log's lines
        self.counts = count_requests(log_path)
        self.log = open(log_path, "a", encoding="utf-8")
        if self.log.tell() and not ends_with_newline(log_path):
            self.log.write("\n")  # end a line cut short by a kill: the next one starts afresh
        self.pending = []  # --fast: lines not yet written
        if fast:
            threading.Thread(target=self.flush_periodically, daemon=True).start()

    def behaviour(self, path):
        config = self.config if self.fast else read_config(self.config_path)
        return config.get(path)

    def record(self, entry, behaviour):
        """Count the request, decide its status and log it; the status."""
        with self.lock:
            n = self.counts.get(entry["path"], 0)
            self.counts[entry["path"]] = n + 1
            if entry.get("status") is None:  # not already refused (413)
                if behaviour is None:
                    entry["status"] = 404
                elif n < behaviour.get("fail_first", 0):
                    entry["status"] = behaviour.get("fail_status", 500)
                else:
                    entry["status"] = behaviour.get("status", 200)
            line = json.dumps(entry) + "\n"
            if self.fast:
                self.pending.append(line)
            else:
                self.log.write(line)
                self.log.flush()
        return entry["status"]

    def flush(self):
        with self.lock:
            lines, self.pending = self.pending, []
            self.log.writelines(lines)
            self.log.flush()

    def flush_periodically(self):
        while True:
            time.sleep(0.05)
            self.flush()


def read_config(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def count_requests(log_path):
    """Requests per path in an existing log (fail_first counts them)."""
    counts = {}
    try:
        with open(log_path, encoding="utf-8") as f:
            for line in f:
                try:
                    path = json.loads(line)["path"]
                except ValueError:  # a line cut short by a kill is not a request
                    continue
                counts[path] = counts.get(path, 0) + 1
    except FileNotFoundError:
        pass
    return counts


def ends_with_newline(path):
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def verify(secret, body, headers):
    """(verified, why not) with the Standard Webhooks reference verifier."""
    from standardwebhooks.webhooks import Webhook  # only here: --fast runs without it

    try:
        Webhook(secret).verify(body, headers)
        return True, None
    except Exception as e:  # noqa: BLE001 (a malformed header raises ValueError, not only the library's error)
        return False, f"{type(e).__name__}: {e}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response has a Content-Length
    # The headers and the body are two writes: without TCP_NODELAY the body
    # waits for the sender's delayed ACK (40 ms per request).
    disable_nagle_algorithm = True

    def do_POST(self):
        received_at, received_mono = time.time(), time.monotonic()
        path = self.path.split("?", 1)[0]
        h = self.headers
        entry = dict(path=path, webhook_id=h.get("webhook-id"), webhook_timestamp=h.get("webhook-timestamp"),
                     webhook_signature=h.get("webhook-signature"), content_type=h.get("content-type"),
                     body=None, verified=None, verify_error=None, received_at=received_at,
                     received_mono=received_mono, status=None)
        body = self.read_body()
        behaviour = self.server.behaviour(path)
        if body is None:
            entry["status"] = 413
            self.close_connection = True  # the rest of the body is still unread
        else:
            entry["body"] = body.decode("utf-8", errors="replace")
            if behaviour and behaviour.get("secret") and not self.server.fast:
                headers = {k: h.get(k) for k in ("webhook-id", "webhook-timestamp", "webhook-signature")
                           if h.get(k) is not None}
                entry["verified"], entry["verify_error"] = verify(behaviour["secret"], body, headers)
        status = self.server.record(entry, behaviour)
        if behaviour and behaviour.get("sleep") and body is not None:
            time.sleep(behaviour["sleep"])
        reply = b"ok\n" if 200 <= status < 300 else f"status {status}\n".encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(reply)))
            if behaviour and behaviour.get("location"):  # a redirect's target
                self.send_header("Location", behaviour["location"])
            self.end_headers()
            self.wfile.write(reply)
        except (BrokenPipeError, ConnectionResetError):  # the sender gave up (its timeout)
            self.close_connection = True

    def read_body(self):
        """The request body (Content-Length or chunked), or None when it is
        larger than the server's max_body."""
        limit = self.server.max_body
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            parts, size = [], 0
            while True:
                n = int(self.rfile.readline(1024).split(b";", 1)[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline(1024).strip():  # trailers, up to the empty line
                        pass
                    return b"".join(parts)
                size += n
                if size > limit:
                    return None
                parts.append(self.rfile.read(n))
                self.rfile.readline(1024)  # the CRLF after each chunk
        n = int(self.headers.get("content-length") or 0)
        if n > limit:
            return None
        return self.rfile.read(n)

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass  # the JSON log is the record; nothing on stderr per request


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True, help="port on 127.0.0.1 (0: a free one)")
    ap.add_argument("--config", required=True, help="JSON: URL path -> behaviour")
    ap.add_argument("--log", required=True, help="JSON lines, one per request (appended)")
    ap.add_argument("--fast", action="store_true",
                    help="benchmark mode: config read once, no verification, log written in batches")
    ap.add_argument("--max-body", type=int, default=MAX_BODY, help="largest body accepted, bytes")
    args = ap.parse_args()
    server = Receiver(args.port, args.config, args.log, args.fast, args.max_body)

    def stop(signum, frame):
        # Runs in the main thread, which is inside serve_forever: shutdown()
        # from here would wait for itself; write the pending lines and leave.
        server.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"listening on {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
