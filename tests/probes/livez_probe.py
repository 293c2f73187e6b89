"""Watch nodes answer /livez: the longest time each went without an answer.

Usage: livez_probe.py STOP_FILE URL [URL ...]

One thread per node asks ``URL/livez`` every 10 ms (each request waits at most 5 s) until
STOP_FILE exists (at most 600 s), then prints one JSON line: per URL, the longest gap in
seconds between two answers (or between the start and the first), how many answers and how
many failures. A separate process, so the test's own work does not delay the asking.
"""
from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
import urllib.parse

MAX_SECONDS = 600.0


def watch(url: str, stop_file: str, out: dict[str, dict[str, float]]) -> None:
    parts = urllib.parse.urlsplit(url)
    last = started = time.monotonic()
    gap, answers, failures = 0.0, 0, 0
    conn: http.client.HTTPConnection | None = None
    while not os.path.exists(stop_file) and time.monotonic() - started < MAX_SECONDS:
        try:
            if conn is None:
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
            conn.request("GET", "/livez")
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                now = time.monotonic()
                gap, last, answers = max(gap, now - last), now, answers + 1
            else:
                failures += 1
        except (OSError, http.client.HTTPException):
            failures += 1
            if conn is not None:
                conn.close()
            conn = None
        time.sleep(0.01)
    gap = max(gap, time.monotonic() - last)
    out[url] = {"max_gap": round(gap, 4), "answers": answers, "failures": failures}


def main() -> None:
    stop_file, urls = sys.argv[1], sys.argv[2:]
    out: dict[str, dict[str, float]] = {}
    threads = [threading.Thread(target=watch, args=(url, stop_file, out)) for url in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
