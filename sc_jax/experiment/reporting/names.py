"""What the tables and plots call datasets and methods, and the colour of each method.

A name that is not listed (a user's task, a method added later) stands as it is, and
an unlisted method gets a colour of its own from :data:`SPARE_COLOURS`, so a report
never fails on a new name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from sc_jax.calibration import methods as calibration_methods
from sc_jax.experiment.evaluation.results import METHOD_NAMES

__all__ = ["DATASET_NAMES", "METHOD_COLOURS", "dataset_name", "method_colour", "method_name",
           "order_methods"]

DATASET_NAMES = {"sst2": "SST-2", "rotten_tomatoes": "Rotten Tomatoes", "ag_news": "AG News",
                 "trec": "TREC", "subj": "SUBJ", "sst5": "SST-5",
                 "tweet_eval_emotion": "TweetEval emotion", "tweet_eval_hate": "TweetEval hate",
                 "financial_phrasebank": "Financial PhraseBank"}


#: One colour per method, each method's own (matplotlib's tab10 and tab20 hues, no two
#: alike), live from the registry; SC is also drawn with a heavy edge (figures.SC_STYLE)
#: so that it reads without colour.
METHOD_COLOURS: Mapping[str, str] = calibration_methods.View("colour")
#: Colours for methods not in :data:`METHOD_COLOURS`, chosen by a hash of the name.
SPARE_COLOURS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d",
                 "#31a354")



def dataset_name(dataset: str) -> str:
    """The display name of a dataset id ("rotten_tomatoes" -> "Rotten Tomatoes"); an
    unlisted id as it is."""
    return DATASET_NAMES.get(dataset, dataset)


def method_name(method: str) -> str:
    """The display name of a method id ("sc_star" -> "SC*"); an unlisted id as it is."""
    return METHOD_NAMES.get(method, method)


def method_colour(method: str) -> str:
    """The method's colour (hex): its own from :data:`METHOD_COLOURS`, else one of
    :data:`SPARE_COLOURS` fixed by the name (the same in every plot and run)."""
    if method in METHOD_COLOURS:
        return METHOD_COLOURS[method]
    digest = hashlib.sha256(method.encode()).digest()
    return SPARE_COLOURS[digest[0] % len(SPARE_COLOURS)]


def order_methods(methods: Iterable[str], *, sc_first: bool = False) -> list[str]:
    """``methods`` (each once) in report order: the known methods in their fixed order
    (SC first with ``sc_first``, as in the plots' legends), then unknown names
    alphabetically."""
    known = {m: i for i, m in enumerate(METHOD_NAMES)}  # the registry's order
    if sc_first:
        known[calibration_methods.subject()] = -1
    return sorted(set(methods), key=lambda m: (known.get(m, len(known)), m))
