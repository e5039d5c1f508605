"""Linalg ops: factorizations checked by reconstruction, solves and norms against
numpy, all in compiled one-op programs; the least-squares example end to end."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import assert_close, run_op

RNG = np.random.default_rng(0)
TOL = {"rtol": 1e-4, "atol": 1e-4}
EXAMPLE = Path(__file__).parents[2] / "examples" / "least_squares.json"


def _matrix(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _spd(n: int, *batch: int) -> np.ndarray:
    a = _matrix(*batch, n, n)
    return a @ np.swapaxes(a, -1, -2) + n * np.eye(n, dtype=np.float32)


def _np(array: mx.array) -> np.ndarray:
    return np.array(array)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_reconstructs_from_one_triangle(upper):
    a = _spd(4, 2)
    ignored = np.tril(np.ones_like(a), -1) if upper else np.triu(np.ones_like(a), 1)
    factor = _np(run_op("cholesky", a + ignored, upper=upper))
    tri = np.triu(factor) if upper else np.tril(factor)
    np.testing.assert_array_equal(factor, tri)
    factor_t = np.swapaxes(factor, -1, -2)
    np.testing.assert_allclose(factor_t @ factor if upper else factor @ factor_t, a, **TOL)


def test_cholesky_eager():
    a = _spd(3)
    factor = _np(run_op("cholesky", a, eager=True))
    np.testing.assert_allclose(factor @ factor.T, a, **TOL)


@pytest.mark.parametrize("rhs_shape", [(4,), (4, 2)])
def test_solve_matches_numpy(rhs_shape):
    a, b = _spd(4), _matrix(*rhs_shape)
    assert_close(run_op("solve", a, b), np.linalg.solve(a, b), dtype=mx.float32, **TOL)


@pytest.mark.parametrize("upper", [False, True])
def test_solve_triangular_reads_one_triangle(upper):
    a = _spd(4)
    tri = np.triu(a) if upper else np.tril(a)
    b = _matrix(4, 3)
    assert_close(run_op("solve_triangular", a, b, upper=upper), np.linalg.solve(tri, b), **TOL)


def test_inv_and_pinv():
    a = _spd(4)
    assert_close(run_op("inv", a), np.linalg.inv(a), **TOL)
    wide = _matrix(3, 5)
    pinv = run_op("pinv", wide)
    assert_close(pinv, np.linalg.pinv(wide), **TOL)


@pytest.mark.parametrize(
    ("shape", "attrs", "np_kwargs"),
    [
        ((5,), {}, {}),
        ((3, 4), {}, {}),
        ((3, 4), {"ord": "fro"}, {"ord": "fro"}),
        ((3, 4), {"ord": "nuc"}, {"ord": "nuc"}),
        ((3, 4), {"ord": 2}, {"ord": 2}),
        ((3, 4), {"ord": -1}, {"ord": -1}),
        ((3, 4), {"ord": "inf", "axis": 1}, {"ord": np.inf, "axis": 1}),
        ((3, 4), {"ord": "-inf"}, {"ord": -np.inf}),
        ((2, 3, 4), {"ord": 3, "axis": -1, "keepdims": True},
         {"ord": 3, "axis": -1, "keepdims": True}),
        ((2, 3, 4), {"ord": "nuc", "axis": [0, 2]}, {"ord": "nuc", "axis": (0, 2)}),
        ((2, 3, 4), {"ord": 0.5, "axis": [1]}, {"ord": 0.5, "axis": 1}),
    ],
)
def test_norm_matches_numpy(shape, attrs, np_kwargs):
    x = _matrix(*shape)
    assert_close(run_op("norm", x, **attrs), np.linalg.norm(x, **np_kwargs), **TOL)


@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_qr_reconstructs(shape):
    a = _matrix(*shape)
    q, r = (_np(v) for v in run_op("qr", a))
    k = min(shape[-2:])
    assert q.shape == (*shape[:-1], k) and r.shape == (*shape[:-2], k, shape[-1])
    np.testing.assert_allclose(q @ r, a, **TOL)
    eye = np.broadcast_to(np.eye(k, dtype=np.float32), (*shape[:-2], k, k))
    np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, eye, **TOL)
    np.testing.assert_allclose(r, np.triu(r), **TOL)


@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh_reads_one_triangle(uplo):
    a = _spd(4)
    sym = np.triu(a) + np.triu(a, 1).T if uplo == "U" else np.tril(a) + np.tril(a, -1).T
    # Garbage in the triangle that UPLO says to ignore.
    noisy = a + (np.tril(np.ones_like(a), -1) if uplo == "U" else np.triu(np.ones_like(a), 1))
    w, v = (_np(x) for x in run_op("eigh", noisy, UPLO=uplo))
    np.testing.assert_allclose(sym @ v, v * w, **TOL)
    assert np.all(np.diff(w) >= 0)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(sym), **TOL)


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (2, 3, 3)])
def test_svd_reconstructs(shape):
    a = _matrix(*shape)
    u, s, vt = (_np(x) for x in run_op("svd", a))
    m, n = shape[-2:]
    k = min(m, n)
    assert u.shape[-2:] == (m, m) and s.shape[-1] == k and vt.shape[-2:] == (n, n)
    np.testing.assert_allclose((u[..., :k] * s[..., None, :]) @ vt[..., :k, :], a, **TOL)
    assert np.all(np.diff(s, axis=-1) <= 0)


@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 3)])
def test_lu_reconstructs(shape):
    a = _matrix(*shape)
    pivots, lower, upper = run_op("lu", a)
    assert pivots.dtype == mx.uint32
    p, l, u = _np(pivots), _np(lower), _np(upper)
    np.testing.assert_allclose(l[p] @ u, a, **TOL)
    np.testing.assert_allclose(l, np.tril(l), **TOL)
    np.testing.assert_allclose(np.diagonal(l), 1, **TOL)
    np.testing.assert_allclose(u, np.triu(u), **TOL)


def test_factorizations_compose_in_one_program():
    """Cholesky then two triangular solves (a CPU-only chain) inside one
    compiled segment, fed by and feeding default-device ops."""
    b = mp.ProgramBuilder("cholesky_solve")
    a = b.input("a", (4, 4))
    rhs = b.input("rhs", (4,))
    lower = b.cholesky(a)
    z = b.solve_triangular(lower, rhs)
    x = b.solve_triangular(b.transpose(lower), z, upper=True)
    prog = b.build([x * 2.0])
    spd, v = _spd(4), _matrix(4)
    exe = mp.compile(prog)
    for _ in range(2):
        (out,) = exe(spd, v)
        assert_close(out, 2 * np.linalg.solve(spd, v), **TOL)
    assert exe.stats.traces == 1


def test_least_squares_example_matches_numpy():
    prog = mp.Program.load(EXAMPLE)
    a, y = _matrix(8, 3), _matrix(8)
    x, residual = mp.run(prog, a, y)
    solution, residuals, *_ = np.linalg.lstsq(a, y, rcond=None)
    assert_close(x, solution, **TOL)
    assert_close(residual, np.sqrt(residuals[0]), **TOL)


@pytest.mark.parametrize(
    ("op", "operands", "attrs", "message"),
    [
        ("cholesky", [(3, 4)], {}, "square matrix"),
        ("inv", [(4,)], {}, "square matrix"),
        ("eigh", [(2, 3)], {}, "found shape [2, 3]"),
        ("eigh", [(3, 3)], {"UPLO": "X"}, "'UPLO'"),
        ("solve", [(3, 3), (4,)], {}, "must match"),
        ("solve_triangular", [(3, 4), (3,)], {"upper": True}, "(operands: float32[3, 4]"),
        ("norm", [(3, 4)], {"ord": "max"}, "ord is a number"),
        ("norm", [(3, 4)], {"ord": 3}, "Invalid ord 3"),
        ("norm", [(3, 4)], {"axis": 2}, "out of range"),
        ("norm", [(3, 4)], {"ord": "fro", "axis": 0}, "only supported for matrices"),
        ("qr", [(3,)], {}, "dimensions"),
    ],
)
def test_invalid_operands_and_attrs(op, operands, attrs, message):
    arrays = [_matrix(*shape) for shape in operands]
    with pytest.raises(mp.ValidationError, match="instruction 0") as err:
        run_op(op, *arrays, **attrs)
    assert message in str(err.value)


def test_integer_operand_is_rejected():
    with pytest.raises(mp.ValidationError, match="instruction 0.*float32 or float64"):
        run_op("cholesky", np.eye(3, dtype=np.int32))
