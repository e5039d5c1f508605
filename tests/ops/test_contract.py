"""Contractions (dot, matmul, tensordot, einsum) against numpy references, run
through compiled one-op programs (and a sample eagerly).

Integer cases are a few fixed ones rather than generated: each dtype's exact
path is several float64 products. One large integer product runs in a
subprocess under a memory limit (it used to build an M x K x N intermediate).
"""

from __future__ import annotations

import string
import subprocess
import sys
import textwrap
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlxprog as mp
from helpers import assert_close, assert_invalid, one_op_program, run_op

FAST = settings(max_examples=25, deadline=None)

RNG = np.random.default_rng(5)


def normal(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def np_dot_general(lhs, rhs, lhs_contracting, rhs_contracting, lhs_batch=(), rhs_batch=()):
    """dot_general by definition, as a numpy einsum over labelled axes."""
    letters = iter(string.ascii_letters)
    lhs_labels = [next(letters) for _ in range(lhs.ndim)]
    rhs_labels = [next(letters) for _ in range(rhs.ndim)]
    for a, b in [*zip(lhs_batch, rhs_batch), *zip(lhs_contracting, rhs_contracting)]:
        rhs_labels[b] = lhs_labels[a]
    out = [lhs_labels[a] for a in lhs_batch]
    out += [lhs_labels[a] for a in range(lhs.ndim) if a not in (*lhs_batch, *lhs_contracting)]
    out += [rhs_labels[a] for a in range(rhs.ndim) if a not in (*rhs_batch, *rhs_contracting)]
    subscripts = f"{''.join(lhs_labels)},{''.join(rhs_labels)}->{''.join(out)}"
    return np.einsum(subscripts, lhs, rhs)


# --- dot -----------------------------------------------------------------------------

DOT_CASES = [
    # lhs shape, rhs shape, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch
    ((3, 4), (4, 5), [1], [0], [], []),
    ((3, 4), (5, 4), [1], [1], [], []),
    ((2, 3, 4), (2, 4, 5), [2], [1], [0], [0]),
    ((3, 2, 4), (4, 5, 2), [2], [0], [1], [2]),  # batch axes in different places
    ((2, 3, 4, 6), (6, 4, 2, 7), [-2, 3], [-3, 0], [], []),  # two, negative axes
    ((2, 3), (4,), [], [], [], []),  # outer product
    ((4,), (4,), [0], [0], [], []),  # scalar result
    ((), (), [], [], [], []),
    ((5, 2, 3), (3, 5), [2], [0], [0], [1]),  # batch without free lhs axes after it
    ((2, 0, 3), (2, 3, 4), [2], [1], [0], [0]),  # empty free axis
    ((2, 3, 0), (2, 0, 4), [2], [1], [0], [0]),  # empty contraction: zeros
]


@pytest.mark.parametrize("case", DOT_CASES)
def test_dot(case):
    lhs_shape, rhs_shape, lc, rc, lb, rb = case
    lhs, rhs = normal(*lhs_shape), normal(*rhs_shape)
    got = run_op("dot", lhs, rhs, lhs_contracting_axes=lc, rhs_contracting_axes=rc,
                 lhs_batch_axes=lb, rhs_batch_axes=rb)
    lc, rc = [a % lhs.ndim for a in lc], [a % rhs.ndim for a in rc]
    expected = np_dot_general(lhs.astype(np.float64), rhs, lc, rc, lb, rb)
    assert_close(got, expected, rtol=1e-5, atol=1e-5, dtype=mx.float32)


@FAST
@given(st.data())
def test_dot_general_layouts(data):
    sizes = st.integers(1, 3)
    batch = data.draw(st.lists(sizes, max_size=2))
    contracting = data.draw(st.lists(sizes, max_size=2))
    lhs_free = data.draw(st.lists(sizes, max_size=2))
    rhs_free = data.draw(st.lists(sizes, max_size=2))
    # Each operand axis is a (role, index) pair: batch "b", contracting "c" or
    # free "f"; a drawn permutation of the pairs places them.
    shared = [("b", i) for i in range(len(batch))] + [("c", i) for i in range(len(contracting))]
    lhs_perm = data.draw(st.permutations(shared + [("f", i) for i in range(len(lhs_free))]))
    rhs_perm = data.draw(st.permutations(shared + [("f", i) for i in range(len(rhs_free))]))
    size_of = {"b": batch, "c": contracting}
    lhs_shape = [(size_of | {"f": lhs_free})[role][i] for role, i in lhs_perm]
    rhs_shape = [(size_of | {"f": rhs_free})[role][i] for role, i in rhs_perm]

    def axes(perm, role):
        return [perm.index((role, i)) for i in range(len(size_of[role]))]

    lc, rc = axes(lhs_perm, "c"), axes(rhs_perm, "c")
    lb, rb = axes(lhs_perm, "b"), axes(rhs_perm, "b")
    lhs, rhs = normal(*lhs_shape), normal(*rhs_shape)
    got = run_op("dot", lhs, rhs, lhs_contracting_axes=lc, rhs_contracting_axes=rc,
                 lhs_batch_axes=lb, rhs_batch_axes=rb)
    expected = np_dot_general(lhs.astype(np.float64), rhs, lc, rc, lb, rb)
    assert_close(got, expected, rtol=1e-5, atol=1e-5, dtype=mx.float32)


def test_dot_integers_are_exact_and_wrap():
    lhs = RNG.integers(-100, 100, (2, 3, 4)).astype(np.int32)
    rhs = RNG.integers(-100, 100, (2, 4, 5)).astype(np.int32)
    attrs = dict(lhs_contracting_axes=[2], rhs_contracting_axes=[1], lhs_batch_axes=[0],
                 rhs_batch_axes=[0])
    assert_close(run_op("dot", lhs, rhs, **attrs), np_dot_general(lhs, rhs, [2], [1], [0], [0]),
                 dtype=mx.int32)
    small = np.full((2, 3, 4), 100, np.int8)
    got = run_op("dot", small, small.transpose(0, 2, 1).copy(), **attrs)
    wide = np_dot_general(small.astype(np.int64), small.transpose(0, 2, 1), [2], [1], [0], [0])
    assert_close(got, wide.astype(np.int8), dtype=mx.int8)  # 40000 wraps as in int8


def test_dot_bool_is_or_of_ands():
    lhs = np.array([[True, False], [False, False]])
    rhs = np.array([[True, True], [True, False]])
    got = run_op("dot", lhs, rhs, lhs_contracting_axes=[1], rhs_contracting_axes=[0])
    assert_close(got, np_dot_general(lhs.astype(int), rhs.astype(int), [1], [0]) > 0,
                 dtype=mx.bool_)


def test_dot_promotes_mixed_floats():
    lhs, rhs = normal(3, 4, dtype=np.float16), normal(4, 2)
    got = run_op("dot", lhs, rhs, lhs_contracting_axes=[1], rhs_contracting_axes=[0])
    assert_close(got, lhs.astype(np.float64) @ rhs, rtol=1e-3, atol=1e-3, dtype=mx.float32)


def test_dot_normalises_axes():
    prog = one_op_program("dot", normal(2, 3, 4), normal(2, 4, 5), lhs_contracting_axes=[-1],
                          rhs_contracting_axes=[-2], lhs_batch_axes=[-3], rhs_batch_axes=[0])
    attrs = mp.validate(prog).block.steps[0].attrs
    assert (attrs.lhs_contracting_axes, attrs.rhs_contracting_axes) == ((2,), (1,))
    assert (attrs.lhs_batch_axes, attrs.rhs_batch_axes) == ((0,), (0,))


def test_dot_invalid():
    lhs, rhs = normal(2, 3, 4), normal(2, 4, 5)
    assert_invalid(
        "contracting axes pair lhs axis 2 (size 4) with rhs axis 2 (size 5)", "dot", lhs, rhs,
        lhs_contracting_axes=[2], rhs_contracting_axes=[2])
    assert_invalid(
        "batch axes pair lhs axis 1 (size 3) with rhs axis 0 (size 2)", "dot", lhs, rhs,
        lhs_contracting_axes=[2], rhs_contracting_axes=[1], lhs_batch_axes=[1],
        rhs_batch_axes=[0])
    assert_invalid("lhs has 1 contracting axes [2] but rhs has 2 [1, 2]", "dot", lhs, rhs,
                   lhs_contracting_axes=[2], rhs_contracting_axes=[1, 2])
    assert_invalid("lhs has 1 batch axes [0] but rhs has 0 []", "dot", lhs, rhs,
                   lhs_contracting_axes=[2], rhs_contracting_axes=[1], lhs_batch_axes=[0])
    assert_invalid("lhs axes [2] are both batch and contracting axes", "dot", lhs, rhs,
                   lhs_contracting_axes=[2], rhs_contracting_axes=[1], lhs_batch_axes=[2],
                   rhs_batch_axes=[0])
    assert_invalid("lhs axis 3 is out of range for an operand of rank 3", "dot", lhs, rhs,
                   lhs_contracting_axes=[3], rhs_contracting_axes=[1])
    assert_invalid("rhs axes [1, -2] name an axis twice", "dot", lhs, rhs,
                   lhs_contracting_axes=[1, 2], rhs_contracting_axes=[1, -2])


# --- matmul, tensordot, einsum -----------------------------------------------------------


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((3, 4), (4, 2)), ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4, 2)), ((3, 4), (4,)), ((4,), (4,))],
)
def test_matmul(a_shape, b_shape):
    a, b = normal(*a_shape), normal(*b_shape)
    assert_close(run_op("matmul", a, b), np.matmul(a.astype(np.float64), b), rtol=1e-5,
                 atol=1e-5, dtype=mx.float32)


def test_matmul_integers():
    a = RNG.integers(-9, 9, (2, 3, 4)).astype(np.int32)
    b = RNG.integers(-9, 9, (4, 5)).astype(np.int32)
    assert_close(run_op("matmul", a, b), np.matmul(a, b), dtype=mx.int32)
    v = np.array([1, 2, 3, 4], np.int32)
    assert_close(run_op("matmul", v, b), np.matmul(v, b), dtype=mx.int32)
    assert_close(run_op("matmul", v, v), np.matmul(v, v), dtype=mx.int32)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                   np.uint32, np.int64, np.uint64])
def test_matmul_integers_wrap_over_the_full_range(dtype):
    """Values across the whole range, so every piece of the operands and
    every carry between them counts; numpy's uint64 product wraps modulo
    2**64, and its low bits are the result's."""
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (2, 3, 40), dtype=dtype, endpoint=True)
    b = RNG.integers(info.min, info.max, (40, 5), dtype=dtype, endpoint=True)
    expected = (a.astype(np.uint64) @ b.astype(np.uint64)).astype(dtype)
    assert_close(run_op("matmul", a, b), expected, dtype=mx.array(a).dtype)
    assert_close(run_op("matmul", a[0, 0], b, eager=True), expected[0, 0])


def test_matmul_mixed_integer_dtypes_promote():
    a = RNG.integers(-128, 127, (3, 4)).astype(np.int8)
    b = RNG.integers(0, 65535, (4, 2)).astype(np.uint16)
    assert_close(run_op("matmul", a, b), (a.astype(np.int64) @ b).astype(np.int32),
                 dtype=mx.int32)
    flags = np.array([[True, False], [False, True], [True, True]])
    assert_close(run_op("matmul", flags, a[:2]), (flags.astype(np.int64) @ a[:2]).astype(np.int8),
                 dtype=mx.int8)


def test_integer_matmul_is_shapeless_over_the_contracted_axis():
    """One shapeless trace serves every length of the summed axis: the exact
    integer path has no structure that depends on shapes."""
    b = mp.ProgramBuilder("int_matmul")
    b.dim("T", max=64)
    x = b.input("x", (3, "T"), "int32")
    y = b.input("y", ("T", 2), "int32")
    exe = mp.compile(b.build([b.matmul(x, y)]))
    for length in (2, 7, 50):
        lhs = RNG.integers(-2**31, 2**31, (3, length), dtype=np.int64).astype(np.int32)
        rhs = RNG.integers(-2**31, 2**31, (length, 2), dtype=np.int64).astype(np.int32)
        expected = (lhs.astype(np.uint64) @ rhs.astype(np.uint64)).astype(np.int32)
        assert_close(exe(lhs, rhs)[0], expected, dtype=mx.int32)
    assert exe.stats.traces == 1
    assert exe.stats.as_dict()["shapeless_segments"] == 1


def test_large_integer_matmul_stays_within_memory():
    """int8 [1200, 1200] @ [1200, 1200] with 1 GiB of address space to spare:
    the broadcast product needed 1.7 GB (int32 [1500, 1500]: 13.5 GB) and
    the process died of SIGSEGV when the allocation failed."""
    if sys.platform != "linux":
        pytest.skip("RLIMIT_AS is enforced on Linux")
    code = f"""
        import resource, sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        import numpy as np, mlx.core as mx
        from helpers import run_op
        status = open("/proc/self/status").read()
        in_use = int(status.split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (in_use + 2**30, resource.RLIM_INFINITY))
        a = np.ones((1200, 1200), np.int8)
        got = np.array(run_op("matmul", a, a))
        print(got.dtype, np.unique(got).tolist())
    """
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stderr[-3000:]}"
    assert done.stdout.split() == ["int8", "[-80]"]  # 1200 wraps to -80 in int8


def test_matmul_invalid():
    assert_invalid("must match second to last dimension", "matmul", normal(2, 3), normal(2, 3))
    ints = np.ones((2, 3), np.int32)
    assert_invalid("must match second to last dimension", "matmul", ints, ints)
    assert_invalid("Got 0 dimension input", "matmul", np.int32(2), ints)


@pytest.mark.parametrize(
    "axes, a_shape, b_shape",
    [(2, (2, 3, 4), (3, 4, 5)), (1, (2, 3), (3, 4)), (0, (2,), (3,)),
     ([[0, 2], [1, 0]], (4, 3, 2), (2, 4, 5)), ([[-1, 0], [-3, -1]], (4, 3, 2), (2, 5, 4))],
)
def test_tensordot(axes, a_shape, b_shape):
    a, b = normal(*a_shape), normal(*b_shape)
    expected = np.tensordot(a.astype(np.float64), b, axes=axes)
    assert_close(run_op("tensordot", a, b, axes=axes), expected, rtol=1e-5, atol=1e-5,
                 dtype=mx.float32)


def test_tensordot_default_and_integers():
    a = RNG.integers(-5, 5, (2, 3, 4)).astype(np.int32)
    b = RNG.integers(-5, 5, (3, 4, 2)).astype(np.int32)
    assert_close(run_op("tensordot", a, b), np.tensordot(a, b, axes=2), dtype=mx.int32)


def test_tensordot_invalid():
    a, b = normal(2, 3, 4), normal(3, 4, 5)
    assert_invalid("contracting axes pair lhs axis 2 (size 4) with rhs axis 0 (size 3)",
                   "tensordot", a, b, axes=1)
    assert_invalid("cannot contract 4 axes of operands of rank 3 and 3", "tensordot", a, b, axes=4)
    assert_invalid("negative number", "tensordot", a, b, axes=-1)
    assert_invalid("lhs has 2 contracting axes [1, 2] but rhs has 1 [0]", "tensordot", a, b,
                   axes=[[1, 2], [0]])
    assert_invalid("attribute 'axes': lhs axis 3 is out of range for an operand of rank 3",
                   "tensordot", a, b, axes=[[3], [0]])
    assert_invalid("attribute 'axes': rhs axes [0, -3] name an axis twice", "tensordot", a, b,
                   axes=[[1, 2], [0, -3]])
    assert_invalid("attribute 'axes': contracting axes pair lhs axis 1 (size 3) with rhs axis 2",
                   "tensordot", a, b, axes=[[-2], [-1]])


@pytest.mark.parametrize(
    "subscripts, shapes",
    [
        ("ij,jk->ik", [(3, 4), (4, 2)]),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("ii->i", [(3, 3)]),
        ("ij->", [(3, 4)]),
        ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]),
        ("ij,kj", [(2, 3), (4, 3)]),  # implicit output
    ],
)
def test_einsum(subscripts, shapes):
    operands = [normal(*s) for s in shapes]
    expected = np.einsum(subscripts, *(o.astype(np.float64) for o in operands))
    assert_close(run_op("einsum", *operands, subscripts=subscripts), expected, rtol=1e-5,
                 atol=1e-5, dtype=mx.float32)


def test_einsum_invalid():
    assert_invalid("Cannot broadcast dimension 0 of input 1", "einsum", normal(2, 3), normal(4, 5),
                   subscripts="ij,jk->ik")
    assert_invalid("attribute 'subscripts'", "einsum", normal(2, 3), subscripts="")


# --- eager ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op, operands, attrs",
    [
        ("dot", (normal(3, 2, 4), normal(4, 5, 2)), {"lhs_contracting_axes": [2],
         "rhs_contracting_axes": [0], "lhs_batch_axes": [1], "rhs_batch_axes": [2]}),
        ("matmul", (normal(2, 1, 3, 4), normal(5, 4, 2)), {}),
        ("tensordot", (normal(4, 3, 2), normal(2, 4, 5)), {"axes": [[0, 2], [1, 0]]}),
        ("einsum", (normal(2, 3), normal(3, 4)), {"subscripts": "ij,jk->ki"}),
    ],
)
def test_eager_agrees_with_compiled(op, operands, attrs):
    compiled = run_op(op, *operands, **attrs)
    eager = run_op(op, *operands, eager=True, **attrs)
    np.testing.assert_allclose(np.array(eager), np.array(compiled), rtol=1e-6, atol=1e-6)
