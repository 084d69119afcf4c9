"""A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe), for tests.

``Chromium.find()`` is the browser binary or None. ``Chromium(url)`` starts it on `url` and attaches to the
page; ``evaluate(js)`` returns the expression's JSON value, ``screenshot()`` PNG bytes, ``close()`` ends it.
Every call waits at most ``timeout`` seconds (TimeoutError), and a browser that exits raises RuntimeError.
Threading: one thread per Chromium object.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

_BINARIES = ("chromium", "chromium-browser", "google-chrome", "headless_shell")


def _high_fd(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Chromium:
    @staticmethod
    def find() -> str | None:
        return next((p for p in map(shutil.which, _BINARIES) if p), None)

    def __init__(self, url: str, timeout: float = 60.0, size: tuple = (1280, 900)) -> None:
        binary = self.find()
        if binary is None:
            raise FileNotFoundError("no chromium binary on PATH (Debian package: chromium)")
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="mc-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # The child's ends move to fds >= 10 first, so the shell's 3</4> redirections never overwrite them.
        to_browser_r, from_browser_w = (_high_fd(to_browser_r), _high_fd(from_browser_w))
        args = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--remote-debugging-pipe",
                f"--user-data-dir={self._profile}", f"--window-size={size[0]},{size[1]}", url]
        # Chromium reads commands on fd 3 and writes replies on fd 4: bash moves the pipe ends there
        # (dash cannot redirect fds >= 10).
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}', *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            pass_fds=(to_browser_r, from_browser_w), env={**os.environ, "HOME": self._profile})
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._next_id = 0
        try:
            deadline = time.monotonic() + timeout
            target = None
            while target is None:
                pages = [t for t in self._call("Target.getTargets")["targetInfos"] if t["type"] == "page"]
                target = next((t for t in pages if t["url"].startswith(url.split("?")[0])), None)
                if target is None:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no page for {url} within {timeout} s: {pages}")
                    time.sleep(0.1)
            self._session = self._call("Target.attachToTarget", targetId=target["targetId"],
                                       flatten=True)["sessionId"]
        except BaseException:
            self.close()
            raise

    def _send(self, method: str, session: str | None, params: dict) -> int:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        return self._next_id

    def _call(self, method: str, _session: str | None = None, **params) -> dict:
        want = self._send(method, _session, params)
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                msg = json.loads(raw)
                if msg.get("id") == want:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg["result"]
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{method}: no reply within {self.timeout} s")
            ready, _, _ = select.select([self._from_browser], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"chromium exited (rc {self.proc.poll()}): "
                                       f"{self.proc.stderr.read()[-2000:] if self.proc.stderr else ''}")
                self._buf += chunk

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression in the page (promises are awaited)."""
        out = self._call("Runtime.evaluate", self._session, expression=expression, returnByValue=True,
                         awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"{expression}: {out['exceptionDetails'].get('text')}")
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, interval: float = 0.2):
        """Polls until `expression` is truthy; returns its value, or raises TimeoutError. An expression that
        throws (the page is still loading) counts as falsy."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError as e:
                value, error = None, e
            else:
                error = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression} stayed falsy for {timeout} s (last error: {error})")
            time.sleep(interval)

    def screenshot(self) -> bytes:
        return base64.b64decode(self._call("Page.captureScreenshot", self._session, format="png")["data"])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send("Browser.close", None, {})
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stderr:
            self.proc.stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)
