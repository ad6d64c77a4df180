"""The calibration methods, one module each, registered in the order the tables show
them (:mod:`sc_jax.calibration.methods.protocol` says what a method declares). Base, CC,
DC, BC, BC (code), SC*, SC* (no trust region), SC (guard), SC (paper), LOOC, LinC,
Surprise and Hidden Calibration; a method of your own is a module that calls
:func:`register` (docs/methods.md, "Adding a method")."""

from sc_jax.calibration.methods.protocol import (NEEDS, Method, PredictOptions, SCFit, View, get, markdown_table,
                                                 names, register, registered, unregister)

# The built-in methods, each registering itself: their import order is the tables'.
from sc_jax.calibration.methods import base, cc, dc, bc, bc_code, sc_star, sc, sc_paper  # noqa: E402, F401, I001
from sc_jax.calibration.methods import looc, linc, surprise, hidden  # noqa: E402, F401, I001

__all__ = ["NEEDS", "Method", "PredictOptions", "SCFit", "View", "get", "markdown_table", "names", "register",
           "registered", "unregister"]
