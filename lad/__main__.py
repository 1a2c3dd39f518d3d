"""`python -m lad`: Ctrl-C is quiet from this module's first line on, while lad.cli imports."""

import signal
import sys


def _interrupted(signum: int, frame: object) -> None:
    print("Interrupted; what was written so far is kept.", file=sys.stderr)
    raise SystemExit(130)


_interrupted.lad_start_up = True  # lad.cli.main puts Python's own handler back
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where SIGINT is ignored
    signal.signal(signal.SIGINT, _interrupted)

from lad.cli import main  # noqa: E402

code = main()
if code == 130:
    # A KeyboardInterrupt raised inside a string exec (dataclasses and namedtuple build their
    # methods so, at import) sets CPython's "unhandled Ctrl-C" flag even though lad caught it,
    # and under `python -m` the interpreter then ends by SIGINT, not exit(130). A string exec
    # resets that flag at its start.
    exec("")
sys.exit(code)
