"""Jobs that misbehave the way C code can, run inside measurement workers by
tests/test_durability.py (a module of their own: workers import it by name)."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path


def noisy_run(req: dict) -> dict:
    """A candidate whose kernel writes to file descriptor 1 (as a C printf does), before
    and after the real check-and-time job: bytes that would read as a huge message header."""
    from tuner.measure import jobs
    os.write(1, b"\xff" * 64 + b"kernel says hello\n")
    out = jobs.run_job(req)
    os.write(1, b"\xff" * 64 + b"and goodbye\n")
    return out


def hang(req: dict) -> None:
    """Say that the job started (a marker file), then never return: sleeping (GIL released)
    or in a regex backtrack that holds the GIL, so no Python thread of the worker can run."""
    Path(req["marker"]).write_text(str(os.getpid()))
    if req["how"] == "gil":
        re.match(r"(a+)+$", "a" * 64 + "b")
    time.sleep(10**6)
