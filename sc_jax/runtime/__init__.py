"""What every stage runs on: processes and hosts (:mod:`~sc_jax.runtime.multihost`,
:mod:`~sc_jax.runtime.launch`), device meshes and the logical-axis rules
(:mod:`~sc_jax.runtime.sharding`), files fetched from PyPI
(:mod:`~sc_jax.runtime.wheel_files`), an output directory's lock
(:mod:`~sc_jax.runtime.runlock`), compile/run clocks (:mod:`~sc_jax.runtime.timing`),
progress bars and lines on stderr (:mod:`~sc_jax.runtime.progress`),
the devices' peak FLOP/s and memory bandwidth (:mod:`~sc_jax.runtime.devices`) and every
option's accepted range (:mod:`~sc_jax.runtime.ranges`).

Nothing here knows about models, prompts or calibration; every other package may
import from here.
"""
