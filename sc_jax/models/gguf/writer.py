"""A :class:`~sc_jax.models.gguf.checkpoint.GGUFCheckpoint` saved as a Hugging Face model
directory (`config.json`, float32 safetensors, `tokenizer.json`,
`tokenizer_config.json`) that transformers, and our own safetensors loader, read like
any other; written atomically, one shard's tensors dequantised at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from sc_jax.models.gguf.checkpoint import GGUFCheckpoint


def _write_synced(path: Path, write) -> None:
    write(path)
    os.chmod(path, 0o644)  # some writers create private files; a model dir is shared
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _write_weights(tensors: Mapping[str, np.ndarray], out: Path, shard_bytes: int, save_file) -> None:
    """`tensors` as float32 safetensors in `out`, reading one shard's tensors at a time."""
    groups: list[dict[str, np.ndarray]] = [{}]
    files: list[Path] = []
    total = 0

    def flush():
        files.append(out / f".shard{len(files)}")
        _write_synced(files[-1], lambda p: save_file(groups[-1], str(p), metadata={"format": "pt"}))
        groups[-1] = dict.fromkeys(groups[-1])  # keep the names, drop the arrays

    for name in tensors:
        w = np.ascontiguousarray(tensors[name], dtype=np.float32)
        if groups[-1] and sum(map(np.size, groups[-1].values())) * 4 + w.nbytes > shard_bytes:
            flush()
            groups.append({})
        groups[-1][name] = w
        total += w.nbytes
    flush()
    if len(files) == 1:
        os.replace(files[0], out / "model.safetensors")
        return
    weight_map = {}
    for i, (file, names) in enumerate(zip(files, groups, strict=True), 1):
        final = f"model-{i:05d}-of-{len(files):05d}.safetensors"
        os.replace(file, out / final)
        weight_map |= dict.fromkeys(names, final)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    _write_synced(out / "model.safetensors.index.json", lambda p: p.write_text(json.dumps(index, indent=2) + "\n"))


def write_hf_dir(
    checkpoint: GGUFCheckpoint,
    out_dir: str | os.PathLike,
    *,
    overwrite: bool = False,
    shard_bytes: int = 1 << 30,
) -> Path:
    """Writes `checkpoint` as a Hugging Face model directory, atomically.

    Files: `config.json`, the float32 weights (with `format: pt` metadata so
    transformers accepts them) as `model.safetensors`, or, past `shard_bytes`, as
    `model-0000i-of-0000n.safetensors` shards with `model.safetensors.index.json`;
    `tokenizer.json`, `tokenizer_config.json`. Tensors are read (dequantised) one shard at
    a time, so peak memory is about two shards, not the whole model. Everything is
    written into a hidden temporary directory beside `out_dir` and moved into place with
    one rename, so `out_dir` either does not exist or is complete, even if the process dies.

    Args:
      checkpoint: from `read_gguf`.
      out_dir: the directory to create. Its parent is created if needed.
      overwrite: replace an existing `out_dir`; otherwise an existing one is an error.
      shard_bytes: largest shard; 1 GiB keeps SmolLM2 (540 MB) in one file and splits
        Qwen2.5-Coder-0.5B-Instruct (2.5 GB) in three.
    Returns:
      `out_dir` as a Path.
    """
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(
            f"{out_dir} already exists; pass overwrite=True to replace it, or choose another path."
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        _write_weights(checkpoint.tensors, tmp, shard_bytes, save_file)
        tokenizer_config = dict(checkpoint.tokenizer_config)
        tokenizer_config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        _write_synced(
            tmp / "config.json", lambda p: p.write_text(json.dumps(checkpoint.config, indent=2) + "\n")
        )
        _write_synced(tmp / "tokenizer.json", lambda p: checkpoint.tokenizer.save(str(p)))
        _write_synced(
            tmp / "tokenizer_config.json",
            lambda p: p.write_text(json.dumps(tokenizer_config, indent=2) + "\n"),
        )
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model dir is normally shared
        if out_dir.exists():
            if not overwrite:
                raise FileExistsError(f"{out_dir} appeared while it was being written; not replacing it.")
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "dir")
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
        dir_fd = os.open(out_dir.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
