"""``python -m sc_jax.cli ARGS``: the ``sc-jax`` command (:func:`sc_jax.entry.main`: the
same handling of Ctrl-C, from the first import to the last compile)."""

import sys

from sc_jax.entry import main

sys.exit(main())
