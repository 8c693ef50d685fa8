"""Run several `tupe` command lines in one process (torch imported once), each under a time limit and the whole
under an address-space limit, and print one JSON result per command line: exit code (or "timeout", "memory",
"crash ..."), stderr, seconds. Used by test_outside.py for inputs that would hang or exhaust memory if mishandled.

python tests/reliability/outside_driver.py CASES.json LIMIT_GB SECONDS_PER_CASE
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import signal
import sys
import time


class _TimedOut(BaseException):
    """Not an Exception (so the CLI's handlers cannot turn it into an ordinary error line)."""


def _on_alarm(signum, frame):  # noqa: ANN001, ANN202, ARG001
    raise _TimedOut()


def main() -> None:
    cases = json.loads(open(sys.argv[1]).read())  # noqa: SIM115, PTH123
    limit = int(float(sys.argv[2]) * 2**30)
    seconds = int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from tupe.cli import main as cli

    results = []
    signal.signal(signal.SIGALRM, _on_alarm)
    for argv in cases:
        err = io.StringIO()
        t0 = time.monotonic()
        signal.alarm(seconds)
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                code: object = cli([str(a) for a in argv])
        except _TimedOut:
            code = "timeout"
        except MemoryError:
            code = "memory"
        except BaseException as e:  # noqa: BLE001 - reported, the test fails on it
            code = f"crash {type(e).__name__}: {e}"
        finally:
            signal.alarm(0)
        results.append({"argv": argv, "code": code, "err": err.getvalue(), "seconds": time.monotonic() - t0})
    print(json.dumps(results))


if __name__ == "__main__":
    main()
