"""The ``sc-jax`` command (``setup.cfg``'s console script): Ctrl-C in the first second,
while JAX and Flax import, is one line and exit 130, like Ctrl-C later on.

Without this the interrupt arrived as a KeyboardInterrupt traceback, an ImportError of a
half-imported module, or, raised inside a garbage-collection callback JAX registers,
printed as "Exception ignored" and lost: the run went on and ended with exit 0. The
handler here records the signal as well as raising it, so a lost one is still seen.
"""

from __future__ import annotations

import os
import signal
import sys

_STARTING = "error: interrupted while starting: nothing was done"


def main(argv=None) -> int:
    seen = []

    def on_sigint(signum, frame):
        seen.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        from sc_jax import cli  # here, not at the top: Ctrl-C during its imports is caught
    except KeyboardInterrupt:
        print(_STARTING, file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
    if seen:  # raised where it was swallowed (a gc callback): the import went on
        print(_STARTING, file=sys.stderr)
        return 130
    rc = cli.main(argv)
    if rc in (130, 143):
        # Interrupted, its line printed and every file closed: leave now. The
        # interpreter's teardown would run beside XLA's compiler threads, still
        # compiling the program the interrupt cut short, and crashed (SIGSEGV, exit
        # -11) in 3 of 3 tries at Ctrl-C 6-10 s into a run with an empty XLA cache.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
