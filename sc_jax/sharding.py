"""Device meshes and shardings (``jax.jit`` + ``NamedSharding``; pjit is deprecated).

Parameters are replicated; batches are split over the ``data`` axis. On several
hosts, call ``jax.distributed.initialize()`` in every process before anything else:
:func:`make_mesh` then spans all global devices, every process passes the same full
batch (``jax.device_put`` to a global sharding requires identical inputs) and results
are gathered back with ``multihost_utils.process_allgather``. Multi-host runs are
supported by construction but have only been tested here with simulated CPU devices
on one host.
"""

from __future__ import annotations

import numpy as np

DATA = "data"


def make_mesh(data: int | None = None, devices=None):
    """A 1-D mesh with axis ``data`` over ``data`` devices (default: all).

    Built with ``AxisType.Auto``: the newer default (Explicit) breaks the embedding
    gather (FIELD_NOTES)."""
    import jax
    from jax.sharding import AxisType, Mesh

    devs = list(devices if devices is not None else jax.devices())
    n = len(devs) if data is None else int(data)
    if n < 1 or n > len(devs):
        raise ValueError(f"mesh size {n} must be between 1 and the {len(devs)} available devices")
    return Mesh(np.array(devs[:n]), (DATA,), axis_types=(AxisType.Auto,))


def replicated(mesh):
    from jax.sharding import NamedSharding, PartitionSpec as P

    return NamedSharding(mesh, P())


def batch_sharded(mesh):
    """Leading (batch) axis split over ``data``; other axes replicated."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    return NamedSharding(mesh, P(DATA))


def mesh_size(mesh) -> int:
    return 1 if mesh is None else int(mesh.shape[DATA])
