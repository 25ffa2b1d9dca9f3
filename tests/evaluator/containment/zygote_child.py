"""A child for test_zygote: says whether it was forked warm, then waits (``main(REQUEST)``, as the
judge's children are run)."""

from __future__ import annotations

import json
import os
import time

from evaluator.containment.sandbox import Reporter


def main(request_path: str) -> int:
    with open(request_path) as fh:
        request = json.load(fh)
    reporter = Reporter()
    with open(f"/proc/{os.getppid()}/cmdline", "rb") as fh:
        warm = b"evaluator.containment.zygote" in fh.read()
    reporter.send(event="stage", stage="work")
    time.sleep(request["sleep"])
    reporter.send(event="stage_ok", stage="work", data={"warm": warm})
    reporter.send(event="done")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1]))
