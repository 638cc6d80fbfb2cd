"""The CUDA C++ chapters' exercise checkers agree with the chapters: the code the
chapters ship passes the checkers' models of the hardware, and the C++ expressions the
checkers evaluate are read as C++ reads them."""

import re

import pytest

from kernels.chapters import ch05_tensor_cores, ch06_mma_attention, ch07_hopper_attention
from kernels.chapters import ch08_in_a_real_model
from kernels.exercises import ch05, ch06, ch07, ch08
from kernels.exercises.cexpr import ExpressionError, parse


def test_expressions_are_read_as_cpp_reads_them():
    assert parse("-7 / 2")() == -3 and parse("-7 % 2")() == -1  # towards zero, as in C++
    assert parse("a & 1 < 2")(a=2) == 0  # & binds more loosely than < in C++
    assert parse("1 + 2 << 3")() == 24 and parse("x ? 4 : 5 + 1")(x=0) == 6
    assert parse("(u32)-1")() == 2**32 - 1 and parse("(int)(unsigned)-1")() == -1
    assert parse("1ull << 62 | 0x10")() == (1 << 62) + 16
    assert parse("threadIdx.x / 32")(**{"threadIdx.x": 70}) == 2
    for text in ("lane +", "f(1)", "a = 1", "(int)"):
        with pytest.raises(ExpressionError):
            parse(text)
    with pytest.raises(ExpressionError, match="not defined"):
        parse("lanes")(lane=1)


def test_the_chapters_k_addresses_pass_the_ldmatrix_model():
    row, col = re.search(ch06.K_ADDRESS, ch06_mma_attention.SOURCE, re.S).group(2, 3)
    assert ch06.check_k_addresses(row, col).passed


def test_the_chapters_descriptor_has_the_fields_the_ptx_manual_gives():
    describe = ch07.chapter_descriptor()
    fields = {name: (first, bits) for name, first, bits in ch07.FIELDS}
    for _, address, leading in ch07.descriptor_calls():
        d = describe(address, leading)
        value = {name: d >> first & ((1 << bits) - 1) for name, (first, bits) in fields.items()}
        assert value["start address >> 4"] == address >> 4
        assert value["leading byte offset >> 4"] == leading >> 4
        assert value["stride byte offset >> 4"] == 1024 >> 4
        assert value["swizzle mode"] == 1  # the 128-byte swizzle
        assert d == sum(v << fields[n][0] for n, v in value.items())


def test_the_chapters_ring_parities_pass_the_ring_model():
    lap = parse(re.search(r"u32 lap\(int t\) \{ return (.*?); \}",
                          ch07_hopper_attention.KERNEL_SOURCE).group(1))

    def full(t, stages):
        return lap(t=t, STAGES=stages)

    def free(t, stages):
        return lap(t=t, STAGES=stages) ^ 1  # the producer's wait, as the kernel has it

    assert ch07.check_ring_parities(full, free).passed


def test_the_chapters_key_loop_passes_the_warp_model():
    condition = re.search(ch08.KEY_LOOP, ch08_in_a_real_model.SOURCE, re.S).group(2)
    assert ch08.loop_problem(parse(condition)) is None


def test_the_shared_memory_parts_add_up_to_the_launchers_count():
    for cfg in ch05_tensor_cores.STEPS.values():
        for D in ch05_tensor_cores.HEAD_DIMS:
            assert sum(ch05.shared_parts(cfg, D).values()) == ch05_tensor_cores.shared_bytes(cfg, D)


def test_the_split_partials_are_what_the_split_kernel_writes():
    """Exercise 8.1's partial results, combined as combine_splits_kernel does, give the
    float64 reference: the checker's cases test the combine, not their own making."""
    import numpy as np

    from kernels.reference import reference_attention

    for _, q, k, v, causal, bounds in ch08.combine_cases():
        partials = ch08.split_partials(q, k, v, causal, bounds)
        o_split, lse_split = (x.astype(np.float64) for x in partials)
        top = lse_split.max(axis=0)
        seen = top > -np.inf
        w = np.exp2(lse_split - np.where(seen, top, 0))
        o = (w[..., None] * o_split).sum(0) / np.where(seen, w.sum(0), 1)[:, None]
        ref, _ = reference_attention(q, k, v, causal)
        assert np.allclose(o, ref.reshape(o.shape), atol=1e-5)
