"""README example 3: the paper's protocol end to end (SC and the baselines on Rotten
Tomatoes with the default model), as `sc-jax run` does it, at toy settings so that it
runs in well under a minute on a CPU. Run: python examples/ex3_run_experiment.py
(it writes runs/example)."""
import sc_jax

cfg = sc_jax.RunConfig(datasets=("rotten_tomatoes",), shots=(4,), seeds=(0,), test_size=8,
                       max_size=2, m_cap=2, methods=("base", "bc", "sc"),
                       max_tokens_per_batch=512)  # toys: `sc-jax run --help` has the paper's
res = sc_jax.run_experiment(cfg, "runs/example", progress=False)
for row in res.rows:                      # also in runs/example: table.md, results.json, plots
    print(row.method, row.dataset, f"k={row.shots}", f"macro-F1 {row.macro_f1:.3f}")
