"""Solver programs served from ``jax.export`` serialisations (``solvers.set_export_dir``):
a later process deserialises them instead of tracing and lowering them, and gets the
plain path's fits."""

import jax
import numpy as np
import pytest

from sc_jax.calibration import solvers
from sc_jax.calibration.numpy_fit import fit_batch
from sc_jax.calibration.solvers import batching
from sc_jax.calibration.synthetic import World

pytest.importorskip("flatbuffers")

# Options of this test alone: its programs are not shared with other tests' (whose
# in-memory state this test resets).
OPTIONS = solvers.SolverOptions(max_iter=190)


def _fits(problems):
    fits = fit_batch(problems, options=OPTIONS, threads=1)
    return np.array([np.concatenate([f.b, f.w, [f.objective]]) for f in fits]), \
        [int(f.status) for f in fits]


def test_exported_programs_serve_a_later_process_without_tracing(tmp_path):
    problems = [World(2, (1.0,), beta=(0.3,), seed=s).surrogate(6, (1, 2))[i]
                for s in range(2) for i in (1, 2)]
    served = batching.batched("augmented_lagrangian", False, OPTIONS, 1, "cpu")
    plain, plain_status = _fits(problems)
    solvers.set_export_dir(tmp_path)
    try:
        first, first_status = _fits(problems)  # traced once more, exported, compiled
        files = sorted(tmp_path.glob("augmented_lagrangian-*.jaxexport"))
        assert files
        # A later process: nothing in memory but the files.
        served._served.clear()
        before = dict(solvers.trace_counts)
        again, again_status = _fits(problems)
        assert solvers.trace_counts == before  # deserialised, not traced
        # Another program's file under this one's name (checked against the inputs it
        # was exported for) and a torn file are each exported afresh (traced once),
        # never an error.
        foreign = jax.export.export(jax.jit(lambda a: a + 1))(jax.ShapeDtypeStruct((3,), "float32"))
        for k, content in enumerate((foreign.serialize(), b"torn"), 1):
            files[0].write_bytes(content)
            served._served.clear()
            torn, _ = _fits(problems)
            assert solvers.trace_counts["augmented_lagrangian"] == before["augmented_lagrangian"] + k
    finally:
        solvers.set_export_dir(None)
        served._served.clear()
    assert plain_status == first_status == again_status and set(plain_status) == {0}
    # A folder that cannot be written: the fit goes on (exported in memory), nothing kept.
    blocked = tmp_path / "file"
    blocked.write_text("")
    solvers.set_export_dir(blocked / "exports")
    try:
        served._served.clear()
        unkept, _ = _fits(problems)
    finally:
        solvers.set_export_dir(None)
        served._served.clear()
    np.testing.assert_allclose(unkept, plain, rtol=1e-6, atol=1e-7)
    # One program, exported or jitted: the same arithmetic (float32; a margin of a few
    # ulps for XLA's choices between two compiles of one module).
    for other in (first, again, torn):
        np.testing.assert_allclose(other, plain, rtol=1e-6, atol=1e-7)
