"""``sc-jax``: the command line, a thin layer over the Python API.

  sc-jax run --model default --dataset rotten_tomatoes --shots 4 8 --seeds 5 --out DIR
      The paper's experiment (sc_jax.experiment.execution.run.run_experiment): writes results.json,
      results.csv, table.md and plots into DIR; resumes from DIR/cache if interrupted.
  sc-jax plan --model random:llama-2-7b --dtype bfloat16 --shots 8 --device-memory 80GiB ...
      Dry run of `run` (same options): pairs, unique, executed and flat tokens, FLOPs,
      chunks, calls and their shape, distinct programs and their compile seconds on this
      machine, planned and XLA peak memory, a forward-time estimate. No weights are
      read and nothing is scored (sc_jax.experiment.execution.plan.plan_run).
  sc-jax report DIR
      Rebuild the tables and plots from DIR/results.json without a model.
  sc-jax demo [--model default] [--k 4] [--seed 0]
      Real scoring end to end on a small built-in set of labelled movie-review
      sentences: the baselines (Base, CC, DC, BC) and SC, fitted on the surrogate data
      of Algorithm 1, each with its accuracy and macro-F1 on the held-out sentences.
  sc-jax info [MODEL]
      Without MODEL: list the models loadable by name and those in the local Hugging
      Face hub cache. With one: load it and print its configuration.

MODEL (--model) is a named model, a Hugging Face model directory, a .gguf file,
random:<preset>, random:PATH (random weights of the config.json in directory PATH, with
its tokenizer.json; weights there are never read), or a Hugging Face id, org/name or org/name@REVISION (a branch, tag or
commit hash), read from the local hub cache (sc_jax.models.loading.load_model).

The parts: :mod:`sc_jax.cli.parser` (the options), :mod:`sc_jax.cli.commands` (what
each subcommand does), :mod:`sc_jax.cli.process` (:func:`main`: logging, the
compilation cache, signals, one-line errors).
"""

from sc_jax.cli.process import main

__all__ = ["main"]
