"""Where the batched solvers run (``fit_batch(device=...)``,
:func:`sc_jax.calibration.solvers.batching.fit_device`): the choice, on a default backend made to
read "gpu", and that the solve is placed where it was chosen. CPU only: an accelerator
is simulated by patching ``jax.default_backend``, which is all the choice reads."""

import math

import jax
import numpy as np
import pytest

from sc_jax.calibration import synthetic
from sc_jax.calibration.buckets import pack_buckets
from sc_jax.calibration.numpy_fit import fit, fit_batch
from sc_jax.calibration.objective import Problem
from sc_jax.calibration.solvers import batching
from sc_jax.calibration.solvers.batching import DEVICES, HOST_CELLS, fit_device


# jaxlib 0.12's crash in the persistent cache's write (conftest.no_persistent_cache_writes).
pytestmark = pytest.mark.usefixtures("no_persistent_cache_writes")


@pytest.fixture
def gpu(monkeypatch):
    """The default backend reads "gpu" (for the code that asks jax.default_backend)."""
    monkeypatch.setattr(batching.jax, "default_backend", lambda: "gpu")


def _host():
    return jax.local_devices(backend="cpu")[0]


def _seed_problems(sizes=(1, 2, 3, 4, 5)):
    """One seed's surrogate data at k = 8, n = 3 (56 to 20,160 rows per size)."""
    world = synthetic.World(3, (1.0, 0.8), seed=0)
    return list(world.surrogate(8, sizes).values())


def _shapes(*shapes):
    """Batched problems of the given feature shapes ``[B, N, n-1]`` (shapes only)."""
    def one(b, n, n1):
        s = jax.ShapeDtypeStruct
        return Problem(s((b, n, n1), np.float32), s((b, n), np.int32), s((b, n), np.int32),
                       s((b, n), np.float32), 8)
    return [one(*shape) for shape in shapes]


# ---------------------------------------------------------------------------------
# The choice.


def test_auto_on_an_accelerator_solves_small_batches_on_the_host(gpu):
    _, packed, _ = pack_buckets(_seed_problems())
    cells = sum(math.prod(p.features.shape) for p in packed)
    assert cells < HOST_CELLS
    assert fit_device("auto", packed) == _host()
    assert fit_device("auto", packed[0]) == _host()  # one Problem as well as a list
    # Over the threshold: several buckets together, or the multi-start's starts.
    assert fit_device("auto", packed, num_starts=96) is None
    assert fit_device("auto", _shapes((4, 200_000, 3), (8, 512, 3))) is None
    # The threshold itself (cells summed over the buckets).
    half = HOST_CELLS // 2
    assert fit_device("auto", _shapes((1, half, 1), (1, half - 1, 1))) == _host()
    assert fit_device("auto", _shapes((1, half, 1), (1, half, 1))) is None


def test_cpu_default_and_a_device_on_an_accelerator(gpu):
    small, large = _shapes((2, 64, 2)), _shapes((4, 400_000, 3))
    for problems in (small, large):
        assert fit_device("cpu", problems) == _host()
        assert fit_device("default", problems) is None
        other = jax.devices()[-1]
        assert fit_device(other, problems) is other


def test_on_a_cpu_backend_nothing_changes():
    assert jax.default_backend() == "cpu"
    large = _shapes((4, 400_000, 3))
    for device in ("auto", "cpu", "default", jax.devices()[0]):
        assert fit_device(device, _shapes((2, 64, 2))) is None
        assert fit_device(device, large) is None
    if len(jax.devices()) > 1:  # conftest asks for 8 host devices
        assert fit_device(jax.devices()[1]) is jax.devices()[1]


@pytest.mark.parametrize("bad", ["gpu", "CPU", "", None, 0, ("cpu",)])
def test_bad_device_values_raise_naming_the_accepted_ones(bad):
    for call in (lambda: fit_device(bad),
                 lambda: fit_batch(_seed_problems((1,)), device=bad),
                 lambda: fit(*_seed_problems((1,))[0], device=bad)):
        with pytest.raises(ValueError, match="device must be one of") as err:
            call()
        assert all(repr(name) in str(err.value) for name in DEVICES)


def test_batch_size_and_threads_follow_the_backend_given():
    assert batching.resolve_batch_size(None, "cpu") == 1
    assert batching.resolve_batch_size(None, "gpu") is None
    assert batching.resolve_threads(None, "gpu") == 1
    assert batching.resolve_threads(None, "cpu") >= 1
    assert batching.resolve_batch_size(3, "gpu") == 3 and batching.resolve_threads(2, "cpu") == 2


# ---------------------------------------------------------------------------------
# The choice honoured: where the compiled solver's inputs and outputs live, the
# default device it ran under, and the policy it was built with.


@pytest.fixture
def calls(monkeypatch):
    """Every call of a batched solver: its batch size and backend, the devices of its
    inputs and outputs, and the thread's default device when it ran."""
    record = []
    real = batching.batched

    def devices(tree):
        return {d for a in jax.tree.leaves(tree) if hasattr(a, "devices") for d in a.devices()}

    def batched(method, sc_star, options, batch_size=None, backend="cpu"):
        fn = real(method, sc_star, options, batch_size, backend)

        def run(problems, lambda_invs, taus, *take):
            out = fn(problems, lambda_invs, taus, *take)
            record.append(dict(batch_size=batch_size, backend=backend,
                               inputs=devices((problems, lambda_invs, taus)),
                               outputs=devices(out), context=jax.config.jax_default_device))
            return out
        return run

    monkeypatch.setattr(batching, "batched", batched)
    return record


def _assert_same(fits, ref):
    # Bit-identical here (the same program on the same CPU); 1e-6 absolute on b and w
    # allows for the float32 rounding of another device's arithmetic.
    for f, r in zip(fits, ref, strict=True):
        np.testing.assert_allclose(f.b, r.b, rtol=0, atol=1e-6)
        np.testing.assert_allclose(f.w, r.w, rtol=0, atol=1e-6)
        assert (f.status, f.iterations) == (r.status, r.iterations)
        assert isinstance(f.b, np.ndarray) and f.b.dtype == np.float64


@pytest.mark.parametrize("solver", ["augmented_lagrangian", "projected"])
def test_auto_on_an_accelerator_solves_on_the_host(solver, monkeypatch, calls):
    problems = _seed_problems((1, 2))  # 56 and 336 rows: one bucket
    ref = fit_batch(problems, solver=solver, device="default")
    assert calls and all(c["context"] is None for c in calls)  # no context on CPU
    calls.clear()
    monkeypatch.setattr(batching.jax, "default_backend", lambda: "gpu")
    fits = fit_batch(problems, solver=solver)
    host = _host()
    assert calls
    for c in calls:  # the CPU's policy, not the "gpu" default's (vmap, one thread)
        assert (c["backend"], c["batch_size"]) == ("cpu", 1)
        assert c["inputs"] == c["outputs"] == {host} and c["context"] == host
    _assert_same(fits, ref)


def test_an_explicit_device_is_where_the_solve_runs(calls):
    if len(jax.devices()) < 2:
        pytest.skip("needs two CPU devices (conftest asks for 8)")
    problems = _seed_problems((1, 2))
    other = jax.devices()[1]  # not the default device
    fits = fit_batch(problems, solver="projected", device=other)
    assert calls
    for c in calls:
        assert c["inputs"] == c["outputs"] == {other} and c["context"] == other
    _assert_same(fits, fit_batch(problems, solver="projected"))
