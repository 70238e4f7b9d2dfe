"""A client that keeps asking the public endpoint while a test changes the cluster under it.

Example::

    >>> with Client("http://10.0.0.1:8000") as c:     # doctest: +SKIP
    ...     deploy(inventory)
    >>> c.failures                                    # doctest: +SKIP
    []
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request


class Client:
    """Chat completions through the endpoint, back to back from two threads, until stopped; every failure kept."""

    def __init__(self, endpoint: str, model: str = "moonshotai/Kimi-K3") -> None:
        self.url = endpoint.rstrip("/") + "/v1/chat/completions"
        self.body = json.dumps({"model": model, "max_tokens": 16,
                                "messages": [{"role": "user", "content": "Say hello."}]}).encode()
        self.ok = 0
        self.answered_by: set[str] = set()
        self.failures: list[str] = []
        self.failed_at: list[float] = []   # time.monotonic() of each failure
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        while not self._stop.is_set():
            req = urllib.request.Request(self.url, data=self.body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    data = json.loads(resp.read())
                text = data["choices"][0]["message"]["content"]
                self.ok += 1
                self.answered_by.add(text.split(":")[0])   # "Hello from <node>: ..."
            except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
                self.failed_at.append(time.monotonic())
                self.failures.append(f"{time.strftime('%H:%M:%S')} {exc!r}")

    def __enter__(self) -> Client:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
