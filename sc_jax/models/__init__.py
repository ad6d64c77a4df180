"""Stage 1, from files to logits: a checkpoint (Hugging Face directory, ``.gguf``,
hub id, named model or random preset) becomes a :class:`~sc_jax.models.loading.LoadedModel`.

:mod:`~sc_jax.models.config` (the frozen configuration), :mod:`~sc_jax.models.model`
(the NNX decoder) and :mod:`~sc_jax.models.attention` (its packed attention),
:mod:`~sc_jax.models.tokenizer`, :mod:`~sc_jax.models.checkpoint` (the key map),
:mod:`~sc_jax.models.gguf`, :mod:`~sc_jax.models.hub`, :mod:`~sc_jax.models.named_models`
and :mod:`~sc_jax.models.loading` (``load_model``: where a model comes from, resolved once).

Imports only :mod:`sc_jax.runtime`.
"""
