"""Starts `serval serve` on a free loopback port for end-to-end tests and stops it."""
import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServalServer:
    def __init__(self, binary, model, *args, name="test-model", threads=1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = name
        # SERVAL_SERVER_ARGS: flags every test server gets (scripts/test.sh runs
        # the server tests again with "--async-scheduling on").
        extra = shlex.split(os.environ.get("SERVAL_SERVER_ARGS", ""))
        self.cmd = [str(binary), "serve", "--model", str(model), "--port", str(self.port),
                    "--served-model-name", name, "--threads", str(threads), *extra, *map(str, args)]
        # stderr to a file: the access log of a long test would fill a pipe and block the server.
        self.log = tempfile.TemporaryFile(mode="w+", errors="replace")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.log, text=True)
        self._wait_healthy()

    def _wait_healthy(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serval serve exited ({self.proc.returncode}):\n{self.read_log()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError("serval serve did not become healthy")

    def metrics(self) -> dict:
        """Unlabelled-by-reason samples of /metrics: name -> value (labels dropped)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            out[name_labels.split("{", 1)[0]] = float(value)
        return out

    def post(self, path, body, headers=None, timeout=60):
        """POST JSON (dict, or raw str/bytes); returns (status, headers, parsed body or text)."""
        data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, hdrs, raw = r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            status, hdrs, raw = e.code, dict(e.headers), e.read()
        try:
            return status, hdrs, json.loads(raw)
        except ValueError:
            return status, hdrs, raw.decode(errors="replace")

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.stderr = self.read_log()
        return self.proc.returncode

    def read_log(self) -> str:
        self.log.seek(0)
        return self.log.read()


def wait_until(predicate, timeout=10.0, interval=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def accepts_connections(port) -> bool:
    """Whether the server still accepts connections (a drain shuts its listening socket)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def read_response(conn) -> bytes:
    """One HTTP response with a Content-Length body, read from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def parse_sse(raw: str):
    """Splits an SSE body into its data payloads; asserts the framing is well formed."""
    assert raw.endswith("\n\n"), raw[-200:]
    payloads = []
    for event in raw[:-2].split("\n\n"):
        lines = event.split("\n")
        assert len(lines) == 1 and lines[0].startswith("data: "), repr(event)
        payloads.append(lines[0][len("data: "):])
    assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
    return [json.loads(p) for p in payloads[:-1]]
