"""Stage 1, from files to logits: a checkpoint (Hugging Face directory, ``.gguf``,
hub id, named model or random preset) becomes a :class:`~sc_jax.models.loading.LoadedModel`.

:mod:`~sc_jax.models.config` (the frozen configuration) and
:mod:`~sc_jax.models.hf_config` (reading a ``config.json``), :mod:`~sc_jax.models.model`
(the NNX decoder) and :mod:`~sc_jax.models.attention` (its packed attention),
:mod:`~sc_jax.models.tokenizer` and :mod:`~sc_jax.models.vocabulary` (its check against
the embedding), :mod:`~sc_jax.models.checkpoint` (the key map), :mod:`~sc_jax.models.gguf`,
:mod:`~sc_jax.models.hub`, :mod:`~sc_jax.models.named_models`,
:mod:`~sc_jax.models.sources` (where a model comes from, resolved once),
:mod:`~sc_jax.models.identity` (the score-cache key of its files) and
:mod:`~sc_jax.models.loading` (``load_model``, ``LoadedModel``).

Imports only :mod:`sc_jax.runtime`.
"""
