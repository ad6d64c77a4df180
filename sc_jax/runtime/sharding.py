"""Device meshes and shardings (``jax.jit`` + ``NamedSharding``; pjit is deprecated).

A mesh has two axes, ``data`` and ``model``. One table, :data:`RULES`, maps each
logical axis of a parameter, activation or KV cache to a mesh axis (the style of
jax-llm-examples): batch on ``data``; query heads, key/value heads, MLP width and
vocabulary on ``model``; everything else replicated. :data:`PARAM_AXES` names the
logical axes of every parameter. A dimension that the ``model`` axis does not divide
stays replicated (sharding it would need padding), so any model runs on any mesh.
With ``model = 1`` (the default) the weights are replicated and batches are split
over ``data``; a larger ``model`` axis holds a model too large for one device. XLA's
SPMD partitioner propagates these shardings through the forward pass and inserts the
collectives (all-reduces after the attention output and MLP down projections).

Several processes (hosts, or several on one machine): :mod:`sc_jax.runtime.multihost`.
After :func:`sc_jax.runtime.multihost.initialize_distributed` the mesh spans every
process's devices, host arrays become global arrays with
:func:`sc_jax.runtime.multihost.put_global` (each process transfers its own shards) and
results come back whole with :func:`sc_jax.runtime.multihost.to_host`.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


DATA = "data"
MODEL = "model"

#: Logical axis -> mesh axis (None: replicated).
RULES: dict[str, str | None] = {
    "batch": DATA,
    "vocab": MODEL,
    "heads": MODEL,
    "kv_heads": MODEL,
    "mlp": MODEL,
    "embed": None,
    "head_dim": None,
    "layers": None,
    "seq": None,
}

#: Logical axes of every parameter of :class:`sc_jax.models.model.Decoder` (and its constants).
PARAM_AXES: dict[str, tuple[str | None, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("vocab", "embed"),
    "final_norm": ("embed",),
    "attn_norm": ("layers", "embed"),
    "mlp_norm": ("layers", "embed"),
    "wq": ("layers", "embed", "heads", "head_dim"),
    "wk": ("layers", "embed", "kv_heads", "head_dim"),
    "wv": ("layers", "embed", "kv_heads", "head_dim"),
    "bq": ("layers", "heads", "head_dim"),
    "bk": ("layers", "kv_heads", "head_dim"),
    "bv": ("layers", "kv_heads", "head_dim"),
    "wo": ("layers", "heads", "head_dim", "embed"),
    "bo": ("layers", "embed"),
    "w_gate": ("layers", "embed", "mlp"),
    "w_up": ("layers", "embed", "mlp"),
    "w_down": ("layers", "mlp", "embed"),
    "q_norm": ("layers", "head_dim"),
    "k_norm": ("layers", "head_dim"),
    "post_attn_norm": ("layers", "embed"),
    "post_mlp_norm": ("layers", "embed"),
    "inv_freq": ("layers", "head_dim"),
    "windows": ("layers",),
}

#: Logical axes of a KV cache's keys and values ``[L, Bc, S, K, Dh]``.
KV_AXES = ("layers", "batch", "seq", "kv_heads", "head_dim")


def parse_mesh(text: str | int | None) -> tuple[int, int] | None:
    """``"data=2,model=4"``, ``"model=8"``, ``"8"`` (data only) or None ->
    ``(data, model)``; an axis left out is 1 (data: all devices / model)."""
    if text is None:
        return None
    if isinstance(text, int) or str(text).strip().isdigit():
        return int(text), 1
    sizes = {}
    for part in str(text).split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in (DATA, MODEL) or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--mesh takes data=D,model=M (positive integers), got {text!r}")
        sizes[name] = int(value)
    return sizes.get(DATA, 0), sizes.get(MODEL, 1)


def make_mesh(data: int | None = None, devices=None, *, model: int = 1):
    """A 2-D mesh ``(data, model)`` over ``data x model`` devices. ``data`` None or 0:
    all devices divided by ``model``.

    Built with ``AxisType.Auto``: the newer default (Explicit) breaks the embedding
    gather (FIELD_NOTES)."""
    devs = list(devices if devices is not None else jax.devices())
    for name, value in (("data", data), ("model", model)):
        # int(2.5) planned a mesh of 2 without a word.
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                  or value < 0):
            raise ValueError(f"{name} must be a whole number of devices, got {value!r}")
    model = int(model)
    if model < 1:
        raise ValueError(f"the model axis must be positive, got {model}")
    d = len(devs) // model if not data else int(data)
    if model > len(devs):
        # "data 0 x model 3" named a data axis nobody asked for.
        raise ValueError(f"a model axis of {model} needs {model} devices; {len(devs)} "
                         f"{'is' if len(devs) == 1 else 'are'} available: use --mesh model="
                         f"{len(devs)} or fewer")
    if d < 1 or d * model > len(devs):
        raise ValueError(f"a mesh of data {d} x model {model} needs {max(d, 1) * model} devices; "
                         f"{len(devs)} are available")
    return Mesh(np.array(devs[:d * model]).reshape(d, model), (DATA, MODEL),
                axis_types=(AxisType.Auto, AxisType.Auto))


def axis_size(mesh, axis: str) -> int:
    return 1 if mesh is None else int(mesh.shape[axis])


def mesh_size(mesh) -> int:
    """Devices on the ``data`` axis (batches are rounded to a multiple of it)."""
    return axis_size(mesh, DATA)


def spec(mesh, axes, shape):
    """PartitionSpec of an array with these logical ``axes``: each mapped by
    :data:`RULES`, kept only where the mesh axis divides the dimension and the
    mesh axis is not already used."""
    out, used = [], set()
    for ax, dim in zip(axes, shape):
        m = RULES.get(ax) if ax else None
        if m is None or m in used or axis_size(mesh, m) == 1 or dim % axis_size(mesh, m):
            out.append(None)
        else:
            out.append(m)
            used.add(m)
    return P(*out)


def named(mesh, axes, shape):
    return NamedSharding(mesh, spec(mesh, axes, shape))


def param_sharding(mesh, name: str, shape):
    """The sharding of parameter ``name`` (a key of :data:`PARAM_AXES`)."""
    return named(mesh, PARAM_AXES[name], shape)


def replicated(mesh):
    return NamedSharding(mesh, P())


def batch_sharded(mesh):
    """Leading (batch) axis split over ``data``; other axes replicated."""
    return NamedSharding(mesh, P(DATA))


def kv_sharding(mesh, shape):
    """Keys/values ``[L, Bc, S, K, Dh]``: cache rows on ``data`` (when more than one),
    key/value heads on ``model``."""
    return named(mesh, KV_AXES if shape[1] > 1 else ("layers", None, "seq", "kv_heads", "head_dim"),
                 shape)


def state_shardings(mesh, state):
    """A pytree of shardings for a Decoder's ``nnx.State`` (leaves named by their
    path's last key), for ``jax.jit(..., out_shardings=...)``."""

    def one(path, leaf):
        # The parameter's name is the last dictionary key of its path (the path
        # ends in the Variable's ``.value`` attribute).
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return param_sharding(mesh, str(keys[-1]), leaf.shape)

    return jax.tree_util.tree_map_with_path(one, state)
