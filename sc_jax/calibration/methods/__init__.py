"""The calibration methods, one module each, registered in the order the tables show
them (:mod:`sc_jax.calibration.methods.protocol` says what a method declares). Base, CC,
DC, BC, BC (code), SC*, SC* (no trust region), SC (guard), SC (paper), LOOC, LinC,
Surprise and Hidden Calibration first, in that order; then every other module of this
package (its name not starting with ``_``), in the order of their names: a method added
to sc_jax is one module here that calls :func:`register`, and a method of your own is a
module of yours that does (docs/methods.md, "Adding a method")."""

import importlib
import pkgutil

from sc_jax.calibration.methods.protocol import (NEEDS, Method, PredictOptions, SCFit, View, get, markdown_table,
                                                 names, paired, paper_baselines, register, registered, subject,
                                                 unregister)

# The paper's methods and the first newer ones, in the tables' order; each module
# registers itself when imported.
_ORDERED = ("base", "cc", "dc", "bc", "bc_code", "sc_star", "sc", "sc_paper", "looc", "linc", "surprise",
            "hidden")
for _name in _ORDERED + tuple(sorted(
        info.name for info in pkgutil.iter_modules(__path__)
        if info.name not in _ORDERED and info.name != "protocol" and not info.name.startswith("_"))):
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["NEEDS", "Method", "PredictOptions", "SCFit", "View", "get", "markdown_table", "names", "paired",
           "paper_baselines", "register", "registered", "subject", "unregister"]
