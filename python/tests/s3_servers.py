"""Real servers for the remote-data tests, on loopback: moto's S3 server and
a small TCP proxy in front of it that limits bandwidth, cuts responses
mid-body, answers some requests with HTTP 503 or never answers."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class Moto:
    """`moto_server -H 127.0.0.1 -p PORT` as a subprocess."""

    def __init__(self) -> None:
        self.port = free_port()
        exe = Path(sys.executable).with_name("moto_server")
        self.proc = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        )

    def upload_tree(self, bucket: str, prefix: str, root: Path) -> int:
        """Uploads every file under `root` as `prefix/<relative path>`; returns the bytes."""
        s3 = self.client()
        try:
            s3.create_bucket(Bucket=bucket)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        total = 0
        for p in sorted(root.rglob("*")):
            if p.is_file():
                key = f"{prefix}/{p.relative_to(root).as_posix()}"
                s3.upload_file(str(p), bucket, key)
                total += p.stat().st_size
        return total

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class FaultProxy:
    """A TCP proxy in front of `upstream_port`, one request per connection
    (it answers `Connection: close`). Settings may change while it runs:
    `rate` (bytes/s over all connections, 0 = unlimited), `fail_every` (every
    n-th request gets a 503), `cut_every` (every n-th GET with a body is cut
    after half of it), `hang` (requests are read and never answered).
    `ranged` counts the GETs that asked for a byte range."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.rate = 0.0
        self.fail_every = 0
        self.cut_every = 0
        self.hang = False
        self.requests = 0
        self.failed = 0
        self.cut = 0
        self.ranged = 0
        self._lock = threading.Lock()
        self._next_send = time.monotonic()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_head(conn: socket.socket) -> tuple[bytes, bytes] | None:
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk
        head, rest = bytes(buf).split(b"\r\n\r\n", 1)
        return head, rest

    @staticmethod
    def _content_length(head: bytes) -> int:
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                return int(v.strip())
        return 0

    def _throttle(self, n: int) -> None:
        if self.rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            # A token bucket holding 5 ms of the rate: a sleep that wakes
            # late is made up by the next sends instead of lowering the rate.
            start = max(now - 0.005, self._next_send)
            self._next_send = start + n / self.rate
        delay = start - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _relay(self, up: socket.socket, conn: socket.socket, length: int, sent: int) -> None:
        """Passes the rest of the body (to `length` bytes, or until the
        upstream closes when `length` < 0) from `up` to `conn` through a
        pipe with `splice`, so that the bytes never enter Python (the proxy
        shares the CPUs with what it serves): what one read from the server
        brought, at most 256 kB (2.6 ms of a 100 MB/s link), at a time under
        the rate limit."""
        r, w = os.pipe()
        try:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 18)
            while length < 0 or sent < length:
                want = 1 << 18 if length < 0 else min(1 << 18, length - sent)
                n = os.splice(up.fileno(), w, want)
                if n == 0:
                    return
                self._throttle(n)
                moved = 0
                while moved < n:
                    moved += os.splice(r, conn.fileno(), n - moved)
                sent += n
        finally:
            os.close(r)
            os.close(w)

    def _serve(self, conn: socket.socket) -> None:
        try:
            got = self._read_head(conn)
            if got is None:
                return
            head, rest = got
            need = self._content_length(head)
            body = bytearray(rest)
            while len(body) < need:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            rest = bytes(body)
            with self._lock:
                self.requests += 1
                n = self.requests
                if head.startswith(b"GET ") and b"\r\nrange:" in head.lower():
                    self.ranged += 1
            if self.hang:
                time.sleep(3600)
                return
            if self.fail_every and n % self.fail_every == 0:
                with self._lock:
                    self.failed += 1
                conn.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                    b"Connection: close\r\n\r\n"
                )
                return
            lines = [l for l in head.split(b"\r\n") if not l.lower().startswith(b"connection:")]
            request = b"\r\n".join(lines) + b"\r\nConnection: close\r\n\r\n" + rest
            with socket.create_connection(("127.0.0.1", self.upstream)) as up:
                up.sendall(request)
                # The reply is passed on as it arrives (a link, not a
                # store-and-forward hop): its head first, then its body
                # under the rate limit (see `_relay`).
                got = self._read_head(up)
                if got is None:
                    return
                rhead, pending = got
                status = rhead.split(b" ", 2)[1] if rhead.count(b" ") else b""
                length = self._content_length(rhead)
                if head.startswith(b"HEAD ") or status in (b"204", b"304"):
                    length = 0
                elif not any(l.lower().startswith(b"content-length:") for l in rhead.split(b"\r\n")):
                    length = -1  # until the upstream closes
                rlines = [l for l in rhead.split(b"\r\n") if not l.lower().startswith(b"connection:")]
                rhead = b"\r\n".join(rlines) + b"\r\nConnection: close"
                cut = (
                    self.cut_every
                    and head.startswith(b"GET ")
                    and length > 1024
                    and n % self.cut_every == 1 % self.cut_every
                )
                if cut:
                    with self._lock:
                        self.cut += 1
                    length //= 2
                conn.sendall(rhead + b"\r\n\r\n")
                sent = 0
                if pending:
                    take = len(pending) if length < 0 else min(len(pending), length)
                    self._throttle(take)
                    conn.sendall(pending[:take])
                    sent += take
                if length < 0 or sent < length:
                    self._relay(up, conn, length, sent)
        except OSError:
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    def stop(self) -> None:
        self._stop = True
        self.sock.close()


def s3_env(endpoint: str) -> dict[str, str]:
    """The environment that points ferrofeed (and boto3) at `endpoint`."""
    env = dict(os.environ)
    env.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ALLOW_HTTP="true",
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_REGION="us-east-1",
    )
    return env
