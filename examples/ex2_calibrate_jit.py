"""README example 2: example 1's scores -> SC fitted with sc_jax.calibrate inside a
jitted function, and the test sentences' calibrated probabilities (Algorithm 2 for
one context size). Run: python examples/ex2_calibrate_jit.py (it runs example 1 first)."""
from ex1_scores import ctx, demos, logp, pairs, sc_jax, test_logp, tests  # example 1's names

import jax
import jax.numpy as jnp

features = jnp.asarray(sc_jax.log_odds(logp))       # m_c = log p_c - log p_0, [24, n-1]
labels = jnp.asarray([y for _, y in demos])[pairs[:, 1]]    # the held-out demo's label
query_ids = jnp.asarray(pairs[:, 1])                # rows sharing a query (invariance term)
test_logodds = sc_jax.log_odds(test_logp)           # [12 * 2, n-1], context by context
test_features = jnp.asarray(test_logodds).reshape(len(ctx), len(tests), -1)  # [m, T, n-1]

@jax.jit
def sc_proba(features, labels, query_ids, test_features):
    cal = sc_jax.calibrate(features, labels, query_ids, num_queries=len(demos))
    proba = sc_jax.ensemble_proba(cal.b[None], cal.w[None], [test_features])  # [T, n]
    return proba, cal.status

proba, status = sc_proba(features, labels, query_ids, test_features)
print(sc_jax.Status(int(status)).name, proba)       # check CONVERGED before using a fit
