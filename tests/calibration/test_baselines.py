"""CC, DC, BC and the DC string builder (paper Appendix D table, Appendix A)."""

import numpy as np
import pytest

from sc_jax.calibration import baselines
from sc_jax.calibration.baselines import (
    BC_BATCH_SIZE,
    CONTENT_FREE_INPUTS,
    base,
    batch_calibration,
    batch_calibration_reference,
    contextual_calibration,
    domain_context_calibration,
    random_domain_strings,
)


def _probs(rng, shape):
    p = rng.dirichlet(np.ones(shape[-1]), size=shape[:-1])
    return p


def test_constants():
    assert CONTENT_FREE_INPUTS == ("N/A", "", "[MASK]")
    assert baselines.NUM_DOMAIN_STRINGS == 20
    assert BC_BATCH_SIZE == 128


def test_base_renormalises():
    p = np.array([[0.2, 0.2], [0.1, 0.3]])
    np.testing.assert_allclose(base(p), [[0.5, 0.5], [0.25, 0.75]])


def test_contextual_calibration_formula():
    rng = np.random.default_rng(0)
    p = _probs(rng, (2, 50, 4))  # two contexts
    cf = _probs(rng, (2, 3, 4))  # three content-free inputs per context
    out = contextual_calibration(p, cf)
    for c in range(2):
        q = p[c] / cf[c].mean(axis=0)
        np.testing.assert_allclose(out[c], q / q.sum(-1, keepdims=True), rtol=1e-12)
    # The argmax is that of p / mean(cf) (Appendix D), and rows are distributions.
    np.testing.assert_array_equal(out.argmax(-1), (p / cf.mean(-2, keepdims=True)).argmax(-1))
    np.testing.assert_allclose(out.sum(-1), 1.0)
    # A uniform content-free prior changes nothing.
    np.testing.assert_allclose(contextual_calibration(p, np.full((2, 3, 4), 0.25)), p)


def test_domain_context_calibration_formula():
    rng = np.random.default_rng(1)
    p = _probs(rng, (30, 3))
    dom = _probs(rng, (20, 3))
    q = p / dom.mean(axis=0)
    np.testing.assert_allclose(domain_context_calibration(p, dom),
                               q / q.sum(-1, keepdims=True), rtol=1e-12)


def test_batch_calibration_uses_consecutive_batches_of_128():
    rng = np.random.default_rng(2)
    t = 300  # batches [0, 128), [128, 256), [256, 300)
    p = _probs(rng, (t, 3))
    out = batch_calibration(p)
    for start, stop in ((0, 128), (128, 256), (256, 300)):
        q = p[start:stop] / p[start:stop].mean(axis=0)
        np.testing.assert_allclose(out[start:stop], q / q.sum(-1, keepdims=True), rtol=1e-12)
    # In order: moving one prediction to another batch changes the result.
    perm = np.arange(t)
    perm[[0, 200]] = perm[[200, 0]]
    assert not np.allclose(batch_calibration(p[perm])[perm], out)
    # batch_size >= T is one batch: the mean over all predictions.
    q = p / p.mean(axis=0)
    np.testing.assert_allclose(batch_calibration(p, batch_size=1000),
                               q / q.sum(-1, keepdims=True), rtol=1e-12)


def test_batch_calibration_of_a_constant_batch_is_uniform():
    # If the model says the same thing for every query, that is all prior: BC leaves
    # nothing (uniform), while a query that stands out keeps its lead.
    p = np.tile([0.7, 0.2, 0.1], (128, 1))
    np.testing.assert_allclose(batch_calibration(p), np.full((128, 3), 1 / 3))
    p[5] = [0.1, 0.2, 0.7]
    assert batch_calibration(p)[5].argmax() == 2


def _reference_bc(label_space_probs, batch_size=128):
    # The reference code's loop (gundemkorel/ICL calibration_methods.batch_calibration),
    # restated on plain lists: mean per batch, softmax of the differences.
    out = []
    for start in range(0, len(label_space_probs), batch_size):
        batch = label_space_probs[start:start + batch_size]
        mean = [sum(row[c] for row in batch) / len(batch) for c in range(len(batch[0]))]
        for row in batch:
            e = [np.exp(row[c] - mean[c]) for c in range(len(row))]
            out.append([v / sum(e) for v in e])
    return np.array(out)


def test_batch_calibration_reference_is_the_reference_codes_softmax_of_differences():
    rng = np.random.default_rng(3)
    p = _probs(rng, (300, 4))  # batches [0, 128), [128, 256), [256, 300)
    out = batch_calibration_reference(p)
    np.testing.assert_allclose(out, _reference_bc(p.tolist()), rtol=1e-12)
    np.testing.assert_allclose(batch_calibration_reference(p, batch_size=7),
                               _reference_bc(p.tolist(), 7), rtol=1e-12)
    # Leading axes broadcast, one set of batches per leading index.
    stacked = batch_calibration_reference(np.stack([p, p[::-1]]))
    np.testing.assert_allclose(stacked[1], _reference_bc(p[::-1].tolist()), rtol=1e-12)


def test_batch_calibration_reference_against_the_papers_ratio():
    rng = np.random.default_rng(4)
    # Two classes: the same predictions as the paper's ratio (p_1 against its batch mean).
    p2 = _probs(rng, (256, 2))
    np.testing.assert_array_equal(batch_calibration_reference(p2).argmax(-1),
                                  batch_calibration(p2).argmax(-1))
    # Three classes: a rare label the ratio boosts and the difference does not.
    # The batch mean of class 2 is about 0.012; the query below has p_2 = 0.05 (4x),
    # but class 0 leads by more in absolute terms.
    p = np.tile([0.6, 0.39, 0.01], (128, 1))
    p[0] = [0.8, 0.15, 0.05]
    assert batch_calibration(p)[0].argmax() == 2
    assert batch_calibration_reference(p)[0].argmax() == 0


def test_random_domain_strings():
    pool = ["the cat sat", "a dog ran far away", "birds fly"]  # mean length 3
    words = {w for s in pool for w in s.split()}
    strings = random_domain_strings(pool, seed=0)
    assert len(strings) == 20
    assert all(len(s.split()) == 3 for s in strings)
    assert all(set(s.split()) <= words for s in strings)
    assert strings == random_domain_strings(pool, seed=0)
    assert strings != random_domain_strings(pool, seed=1)
    assert len(random_domain_strings(pool, num_strings=5)) == 5
    # A bag of words: frequent words are drawn more often.
    heavy = ["x"] * 99 + ["y"]
    drawn = " ".join(random_domain_strings(heavy, num_strings=20, seed=0)).split()
    assert drawn.count("x") > 15


def test_bad_input():
    with pytest.raises(ValueError, match="no words"):
        random_domain_strings(["", "  "])
    with pytest.raises(ValueError, match="n >= 2"):
        base(np.ones((3, 1)))
    with pytest.raises(ValueError, match="finite"):
        contextual_calibration(np.array([[0.5, np.nan]]), np.ones((3, 2)))
    with pytest.raises(ValueError, match="batch_size"):
        batch_calibration(np.ones((4, 2)), batch_size=0)
    with pytest.raises(ValueError, match="batch_size"):
        batch_calibration_reference(np.ones((4, 2)), batch_size=0)
    with pytest.raises(ValueError, match="T, n"):
        batch_calibration_reference(np.ones(2))
