"""``python -m sc_jax.cli ARGS``: the ``sc-jax`` command."""

import sys

from sc_jax.cli.process import main

sys.exit(main())
