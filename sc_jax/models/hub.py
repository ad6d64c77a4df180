"""Models by Hugging Face id (``org/name``, ``org/name@revision``), read from the local
Hugging Face hub cache, or downloaded into it where the hub is reachable.

huggingface_hub owns the cache: its layout (``models--org--name/snapshots/<commit>``,
``refs/``, ``blobs/``), the download and the offline fallback. It reads HF_HOME,
HF_HUB_CACHE and HF_HUB_OFFLINE once, when it is imported; :func:`hub_cache_dir` and
:func:`hub_offline` read them by its rules at every call instead, so that a process
that sets them after importing sc_jax (a notebook, a test) is obeyed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import huggingface_hub  # its heavy parts load on first use of snapshot_download / scan_cache_dir
from huggingface_hub.constants import ENV_VARS_TRUE_VALUES
from huggingface_hub.errors import (
    CacheNotFound,
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

log = logging.getLogger(__name__)

#: What a model needs from its repository: configuration and tokenizer...
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json")
#: ... and its weights (safetensors only: sc_jax reads no PyTorch .bin files).
WEIGHT_FILES = ("*.safetensors", "model.safetensors.index.json")


class HubModelNotCachedError(FileNotFoundError):
    """A model named by Hugging Face id that is neither in the local hub cache nor
    downloadable now (offline, the hub unreachable, no such repository or revision)."""


@dataclasses.dataclass(frozen=True)
class HubId:
    """A model repository on the hub and a revision (branch, tag or commit hash; None
    is the hub's default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


def parse_hub_id(source: str, revision: str | None = None) -> HubId | None:
    """``"org/name"`` or ``"org/name@revision"`` (and ``revision``) -> :class:`HubId`;
    None when ``source`` is not spelled like a model id (``org/name``, checked by
    huggingface_hub's own validator). Raises ValueError for an empty revision after
    ``@`` or one that contradicts ``revision``."""
    repo_id, at, rev = source.partition("@")
    if repo_id.count("/") != 1:
        return None
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return None
    if at and not rev:
        raise ValueError(f"{source!r} has no revision after '@' (org/name@REVISION: a branch, "
                         "tag or commit hash)")
    if rev and revision is not None and rev != revision:
        raise ValueError(f"{source!r} names revision {rev!r} but revision={revision!r} was given")
    return HubId(repo_id, rev or revision)


def hub_cache_dir() -> Path:
    """The hub cache in use, by huggingface_hub's rules, from the environment as it is
    now: HF_HUB_CACHE (or its old name HUGGINGFACE_HUB_CACHE), else HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    env = os.environ
    home = env.get("HF_HOME", os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
    cache = env.get("HF_HUB_CACHE", env.get("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub")))
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set now, by huggingface_hub's
    rules: then only the local cache is read."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    return value is not None and value.upper() in ENV_VARS_TRUE_VALUES


def hub_snapshot(hub_id: HubId, *, weights: bool = True) -> Path:
    """The snapshot directory of ``hub_id`` in the local hub cache, holding its
    configuration and tokenizer and (``weights``) its safetensors weights. Where the hub
    is reachable (and HF_HUB_OFFLINE unset) missing files are downloaded first, as
    huggingface_hub does; otherwise the cached snapshot of the revision is used.
    Raises :class:`HubModelNotCachedError` (one line: what is missing and how to fetch
    it) when neither gives the files."""
    cache, offline = hub_cache_dir(), hub_offline()
    patterns = list(CONFIG_FILES + (WEIGHT_FILES if weights else ()))
    try:
        path = Path(huggingface_hub.snapshot_download(
            hub_id.repo_id, revision=hub_id.revision, cache_dir=cache, local_files_only=offline,
            allow_patterns=patterns))
    except LocalEntryNotFoundError as e:  # not cached (or only in part), and no download
        held = "only partly" if isinstance(e, IncompleteSnapshotError) else "not"
        reason = "HF_HUB_OFFLINE is set" if offline else "the hub could not be reached"
        raise HubModelNotCachedError(
            f"model {str(hub_id)!r} is not a local directory, and as a Hugging Face id it is "
            f"{held} in the local hub cache {cache}; {reason}: {_fetch_hint(hub_id, offline)}") from e
    except HfHubHTTPError as e:
        raise HubModelNotCachedError(
            f"model {str(hub_id)!r} is not a local directory, nor in the local hub cache {cache}, "
            f"and the Hugging Face hub {_hub_refusal(hub_id, e)}") from e
    missing = _missing_files(path, weights)
    if missing:
        raise HubModelNotCachedError(
            f"the snapshot of {str(hub_id)!r} in the local hub cache ({path}) has no {missing} "
            f"(sc_jax reads config.json, tokenizer.json and safetensors weights); if the "
            f"repository has them: {_fetch_hint(hub_id, offline)}")
    log.info("%s: snapshot %s", hub_id, path)
    return path


def _fetch_hint(hub_id: HubId, offline: bool) -> str:
    rev = "" if hub_id.revision is None else f" --revision {hub_id.revision}"
    hint = (f"fetch it with `hf download {hub_id.repo_id}{rev}` (huggingface_hub's command; it "
            "fills the same cache)")
    return hint + (", or unset HF_HUB_OFFLINE to let sc_jax download it" if offline else "")


def _hub_refusal(hub_id: HubId, error: HfHubHTTPError) -> str:
    """What the hub said, in words (its own messages span several lines)."""
    if isinstance(error, RevisionNotFoundError):
        return f"has no revision {hub_id.revision!r} of {hub_id.repo_id}"
    if isinstance(error, GatedRepoError):
        return f"keeps {hub_id.repo_id} gated: accept its terms on the hub, then `hf auth login`"
    if isinstance(error, RepositoryNotFoundError):
        return (f"has no model repository {hub_id.repo_id} (or it is private: `hf auth login` "
                "with a token that may read it)")
    first = str(error).strip().splitlines()
    return f"answered: {first[0] if first else type(error).__name__}"


def _missing_files(path: Path, weights: bool) -> str:
    """What a snapshot lacks of config.json, tokenizer.json and (``weights``) the
    safetensors weights, in words ("" when complete)."""
    missing = [f for f in ("config.json", "tokenizer.json") if not (path / f).is_file()]
    if weights and not ((path / "model.safetensors").is_file()
                        or (path / "model.safetensors.index.json").is_file()):
        missing.append("model.safetensors (or model.safetensors.index.json)")
    return ", ".join(missing)


def cached_models_lines() -> list[str]:
    """The model repositories in the local hub cache, for ``sc-jax info``: id, size on
    disk and each cached revision (short commit hash and the refs naming it). Reads
    the cache's directory tree only; no model is loaded."""
    cache = hub_cache_dir()
    try:
        info = huggingface_hub.scan_cache_dir(cache)
    except CacheNotFound:
        return [(f"the local Hugging Face hub cache {cache} does not exist (HF_HUB_CACHE or "
                 "HF_HOME move it)")]
    repos = sorted((r for r in info.repos if r.repo_type == "model"), key=lambda r: r.repo_id)
    if not repos:
        return [f"the local Hugging Face hub cache {cache} holds no models"]
    lines = [f"models in the local Hugging Face hub cache {cache} (--model ORG/NAME[@REVISION]):"]
    for repo in repos:
        revisions = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
        revs = ", ".join(r.commit_hash[:12] + (f" ({', '.join(sorted(r.refs))})" if r.refs else "")
                         for r in revisions)
        lines.append(f"  {repo.repo_id}: {repo.size_on_disk_str}, revisions {revs}")
    if info.warnings:
        lines.append(f"  ({len(info.warnings)} damaged cache entries skipped)")
    return lines
