"""The engine's model program lowered for a GPU on this CPU host (``jax.export``): at the
call shape of ``random:qwen2-7b`` in bfloat16 on an 80 GiB device (B = 16 rows of W = 512
tokens after 2048 cached keys, 1024 readouts, 8 label rows), with abstract weights,
every attention the engine may pick on an accelerator lowers (for a GPU and for a TPU,
the Pallas kernel as Triton and as Mosaic), and none leaves a loop whose trip count is
data: XLA's GPU runtime reads such a loop's predicate back to the host on every
iteration (28 layers, hundreds of round trips per call).

This host lowers a Pallas TPU kernel to its Mosaic module (every Pallas primitive and
block shape checked by Pallas' Mosaic lowering); Mosaic's own layout passes and
compilation run in the TPU runtime, which a CPU host has not.

A ``stablehlo.while`` is data-dependent unless its condition compares the induction
variable with a constant; the CPU lowering of ``"blocked"``, which keeps its traced trip
counts, shows that the count sees them.
"""

import base64
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import export

from sc_jax.models import pallas_attention, pallas_tpu_attention
from sc_jax.models.config import preset
from sc_jax.models.model import Decoder, KVCache
from sc_jax.scoring.programs import PackedInputs, packed_call, packed_step

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
    """0 on a GPU and a TPU for each attention (the Pallas kernels' loops are inside
    their Triton and Mosaic calls); 2 (the blocked path's cache and packed-key loops,
    inside the layer scan) where the CPU keeps traced trip counts."""
    exported = _export(packed_call, qwen2_7b_call, dict(sequence=False, attention=attention), platform)
    mlir = exported.mlir_module()
    assert mlir.count("stablehlo.while") >= 1  # the layer scan, at least: the count looked
    assert data_dependent_whiles(mlir) == loops
    assert ("xla.gpu.triton" in mlir) == (attention == "pallas" and platform == "cuda")
    assert ("tpu_custom_call" in mlir) == (attention == "pallas" and platform == "tpu")


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_engine_call_lowers_with_its_pool_donated(qwen2_7b_call, platform):
    """The program every engine call runs (``packed_step``: the slot gather, the 7B model
    with the Pallas kernel, the pool's write) lowers for the accelerator with no
    data-dependent loop, and the token pool's four arrays are its donated arguments, so
    the device writes them in place (the CPU's optimised program was checked to copy no
    part of the pool: tests/scoring/test_compiles.py runs the same program)."""
    graphdef, state, cache, _, inputs, labels = qwen2_7b_call
    config = preset("qwen2-7b")
    L, Kh, Dh, P = config.num_layers, config.num_kv_heads, config.head_dim, 1 << 16
    a = lambda shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    kv = a((L, 1, P, Kh, Dh), jnp.bfloat16)
    pool = KVCache(kv, kv, a((1, P)), a((1, P), bool))
    args = (graphdef, state, pool, a((B, C)), a((C,)), inputs, labels, a((B * W,)))
    exported = _export(packed_step, args, dict(sequence=False, attention="pallas"), platform)
    mlir = exported.mlir_module()
    assert data_dependent_whiles(mlir) == 0
    assert mlir.count("jax.buffer_donor = true") + mlir.count("tf.aliasing_output") == 4


def _export_kernel(packed_attention, Dh: int, platform: str):
    """One packed-attention kernel alone at the 7B call (bfloat16, Qwen2-7B's 28 query and
    4 key/value heads, head size ``Dh``, the 7B call's blocks), exported for
    ``platform``: (the export, (bq, bk))."""
    H, Kh = 28, 4
    bq, bk = pallas_attention.blocks(W, C)
    a = lambda shape, dtype=jnp.int32: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    meta = dict(q_pos=a((B, W)), q_slot=a((B, W)), q_seg=a((B, W)), k_id=a((B, W)), c_pos=a((B, C)),
                c_id=a((B, C)), c_lo=a((B, W // bq)), c_n=a((B, W // bq)), n_lo=a((B, W // bq)))

    def kernel(q, k, v, ck, cv, window, meta):
        return packed_attention(q, k, v, ck, cv, window, **meta, bq=bq, bk=bk, windows=True)

    bf = jnp.bfloat16
    exported = _export(jax.jit(kernel), (a((B, W, H, Dh), bf), a((B, W, Kh, Dh), bf),
                                         a((B, W, Kh, Dh), bf), a((B, C, Kh, Dh), bf),
                                         a((B, C, Kh, Dh), bf), a(()), meta), {}, platform)
    assert exported.out_avals[0].shape == (B, W, H, Dh) and exported.out_avals[0].dtype == bf
    return exported, (bq, bk)


@pytest.mark.parametrize("Dh", [128, 80])
def test_kernel_lowers_for_a_gpu_at_the_7b_shape(Dh):
    """The kernel alone, bfloat16, Qwen2-7B's heads (28 query, 4 key/value, Dh = 128;
    80, not a power of two, is padded for Triton) and the 7B call's blocks: one Triton
    call, no loop outside it."""
    exported, (bq, bk) = _export_kernel(pallas_attention.packed_attention, Dh, "cuda")
    mlir = exported.mlir_module()
    assert mlir.count("xla.gpu.triton") >= 1 and "stablehlo.while" not in mlir
    assert (bq, bk) == (64, 64) and np.gcd(W, C) % bq == 0


def mosaic_modules(mlir: str) -> list[str]:
    """The Mosaic kernels of a module lowered for a TPU, as MLIR text (each
    ``tpu_custom_call`` carries its kernel as base64 Mosaic bytecode)."""
    try:
        from jax._src.interpreters import mlir as jax_mlir
        from jax._src.lib import tpu
        from jax._src.lib.mlir import ir, passmanager
    except ImportError as e:  # private modules: a jax without them cannot be read here
        pytest.skip(f"cannot read Mosaic bytecode with this jax ({e})")
    out = []
    for body in re.findall(r"\\22body\\22: \\22([A-Za-z0-9+/=]+)\\22", mlir):
        ctx = jax_mlir.make_ir_context()
        tpu.register_dialect(ctx)
        with ctx, ir.Location.unknown():
            ctx.allow_unregistered_dialects = True
            module = ir.Module.parse(base64.b64decode(body))
            passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(
                module.operation)
            out.append(str(module))
    return out


@pytest.mark.parametrize("Dh", [128, 80, 256])
def test_tpu_kernel_lowers_to_mosaic_at_the_7b_shape(Dh):
    """The TPU kernel alone at the 7B call (bfloat16, 28 query and 4 key/value heads; Dh
    = 80 is padded to the lanes, 256 spans two): one Mosaic call and no XLA loop; inside it the grid
    (rows, key/value heads, query blocks), the three bounds and the window prefetched
    into SMEM, and the cache and packed-key loops as ``scf.for`` whose bounds are
    loaded from there. At Dh = 128 its VMEM fits the smallest default limit."""
    H, Kh = 28, 4  # as _export_kernel lowers it
    exported, (bq, bk) = _export_kernel(pallas_tpu_attention.packed_attention, Dh, "tpu")
    mlir = exported.mlir_module()
    assert mlir.count("tpu_custom_call") == 1 and "stablehlo.while" not in mlir
    kernel_mlir, = mosaic_modules(mlir)
    assert f"iteration_bounds = array<i64: {B}, {Kh}, {W // bq}>" in kernel_mlir
    assert "scalar_prefetch = 4" in kernel_mlir and "scratch_operands = 3" in kernel_mlir
    smem = re.findall(r"(%\w+) = memref.load %arg[3-5]\[.*?smem", kernel_mlir)
    loops = re.findall(r"scf\.for %\w+ = (%\w+) to", kernel_mlir)
    assert len(smem) == 3 and {smem[0], smem[2]} <= set(loops)  # c_lo and n_lo start loops
    need = pallas_tpu_attention.vmem_bytes(W, C, H // Kh, 128, bq, bk, 2)
    assert need <= pallas_tpu_attention.DEFAULT_VMEM
