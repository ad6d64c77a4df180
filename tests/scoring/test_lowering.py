"""The engine's model program lowered for a GPU on this CPU host (``jax.export``): at the
call shape of ``random:qwen2-7b`` in bfloat16 on an 80 GiB device (B = 16 rows of W = 512
tokens after 2048 cached keys, 1024 readouts, 8 label rows), with abstract weights,
every attention the engine may pick on an accelerator lowers (for a GPU, and for a TPU
where the path is XLA), and none leaves a loop whose trip count is data: XLA's GPU
runtime reads such a loop's predicate back to the host on every iteration (28 layers,
hundreds of round trips per call).

A ``stablehlo.while`` is data-dependent unless its condition compares the induction
variable with a constant; the CPU lowering of ``"blocked"``, which keeps its traced trip
counts, shows that the count sees them.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import export

from sc_jax.models import pallas_attention
from sc_jax.models.config import preset
from sc_jax.models.model import Decoder, KVCache
from sc_jax.scoring.programs import PackedInputs, packed_call

B, W, C, R, LABELS = 16, 512, 2048, 1024, 8
# The Triton kernel's custom call has no compatibility guarantee across jaxlib versions,
# which export refuses unless told; the program is lowered here, not kept.
TRITON = export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
# jaxlib 0.11 and later ask the device for its compute capability when lowering a
# Triton kernel; on a host without one, an abstract H100 answers.
H100 = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=jax.sharding.AbstractDevice(
    device_kind="NVIDIA H100 80GB HBM3", num_cores=132, platform="gpu"))


def data_dependent_whiles(mlir: str) -> int:
    """The ``stablehlo.while`` loops of a module's text whose condition is not
    ``compare(induction variable, constant)``: a trip count known only at run time.
    A sharding constraint (under a mesh) passes its operand through."""
    constants = set(re.findall(r"(%[\w#]+) = stablehlo\.constant", mlir))
    count = 0
    for cond in re.findall(r"stablehlo\.while\(.*?\n\s*cond \{\n(.*?)\n\s*\} do \{", mlir, re.S):
        alias = dict(re.findall(r"(%[\w#]+) = sdy\.sharding_constraint (%[\w#]+)", cond))
        cmp = re.search(r"stablehlo\.compare\s+\w+,\s*(%[\w#]+),\s*(%[\w#]+)", cond)
        ops = [alias.get(op, op) for op in (cmp.groups() if cmp else ())]
        static = any(op in constants for op in ops) and any(op.startswith("%iterArg") for op in ops)
        count += not static
    return count


def test_the_count_tells_a_traced_trip_count_from_a_constant():
    def f(x, n):
        x = jax.lax.fori_loop(0, 5, lambda i, c: c + 1.0, x)
        return jax.lax.fori_loop(0, n, lambda i, c: c * 2.0, x)

    mlir = export.export(jax.jit(f), platforms=["cuda"])(
        jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32)).mlir_module()
    assert mlir.count("stablehlo.while") == 2 and data_dependent_whiles(mlir) == 1


def _export(fn, args, kwargs, platform):
    if platform != "cuda":
        return export.export(fn, platforms=[platform])(*args, **kwargs)
    with jax.sharding.use_abstract_mesh(H100):
        return export.export(fn, platforms=[platform], disabled_checks=[TRITON])(*args, **kwargs)


@pytest.fixture(scope="module")
def qwen2_7b_call():
    """``packed_call``'s arguments at the 7B call shape: abstract weights and inputs."""
    config = preset("qwen2-7b")
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Decoder(config, dtype=jnp.bfloat16,
                                                               rngs=nnx.Rngs(0))))
    L, Kh, Dh = config.num_layers, config.num_kv_heads, config.head_dim
    a = lambda shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    kv = a((L, B, C, Kh, Dh), jnp.bfloat16)
    cache = KVCache(kv, kv, a((B, C)), a((B, C), bool))
    inputs = PackedInputs(a((B, W)), a((B, W)), a((B, W), bool), a((B, W)), a((B, W)), a((R,)), a((R,)))
    args = (graphdef, state, cache, a((B, C)), inputs, a((LABELS,)))
    return args


@pytest.mark.parametrize("attention,platform,loops", [
    ("pallas", "cuda", 0), ("blocked", "cuda", 0), ("dense", "cuda", 0), ("pallas", "tpu", 0),
    ("blocked", "tpu", 0), ("blocked", "cpu", 2)])
def test_engine_program_has_no_data_dependent_loop_on_an_accelerator(qwen2_7b_call, attention,
                                                                     platform, loops):
    """0 on a GPU and a TPU for each attention ("pallas" on a TPU: the static-trip
    blocked path); 2 (the blocked path's cache and packed-key loops, inside the layer
    scan) where the CPU keeps traced trip counts."""
    exported = _export(packed_call, qwen2_7b_call, dict(sequence=False, attention=attention), platform)
    mlir = exported.mlir_module()
    assert mlir.count("stablehlo.while") >= 1  # the layer scan, at least: the count looked
    assert data_dependent_whiles(mlir) == loops
    assert ("xla.gpu.triton" in mlir) == (attention == "pallas" and platform == "cuda")


@pytest.mark.parametrize("Dh", [128, 80])
def test_kernel_lowers_for_a_gpu_at_the_7b_shape(Dh):
    """The kernel alone, bfloat16, Qwen2-7B's heads (28 query, 4 key/value, Dh = 128;
    80, not a power of two, is padded for Triton) and the 7B call's blocks: one Triton
    call, no loop outside it."""
    H, Kh = 28, 4
    bq, bk = pallas_attention.blocks(W, C)
    a = lambda shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    meta = dict(q_pos=a((B, W)), q_slot=a((B, W)), q_seg=a((B, W)), k_id=a((B, W)), c_pos=a((B, C)),
                c_id=a((B, C)), c_lo=a((B, W // bq)), c_n=a((B, W // bq)), n_lo=a((B, W // bq)))

    def kernel(q, k, v, ck, cv, window, meta):
        return pallas_attention.packed_attention(q, k, v, ck, cv, window, **meta, bq=bq, bk=bk,
                                                 windows=True)

    bf = jnp.bfloat16
    exported = _export(jax.jit(kernel), (a((B, W, H, Dh), bf), a((B, W, Kh, Dh), bf),
                                         a((B, W, Kh, Dh), bf), a((B, C, Kh, Dh), bf),
                                         a((B, C, Kh, Dh), bf), a(()), meta), {}, "cuda")
    mlir = exported.mlir_module()
    assert mlir.count("xla.gpu.triton") >= 1 and "stablehlo.while" not in mlir
    assert exported.out_avals[0].shape == (B, W, H, Dh) and exported.out_avals[0].dtype == bf
    assert (bq, bk) == (64, 64) and np.gcd(W, C) % bq == 0
