"""Linalg ops: factorizations checked by reconstruction, solves and norms against
numpy, all in compiled one-op programs; the least-squares example end to end;
empty, non-finite, singular and 1x1 float64 matrices (which crashed or hung
the process, so they run in a subprocess)."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import mlxprog as mp
from helpers import assert_close, run_isolated, run_op

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
        ("solve", [(3, 3), (4,)], {}, "B (operand 1) must be a vector of size 3"),
        ("solve", [(2, 3, 3), (2, 3)], {}, "found shape [2, 3]"),
        ("solve", [(3, 3), ()], {}, "found shape []"),
        ("solve_triangular", [(3, 4), (3,)], {"upper": True}, "found shape [3, 4]"),
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


@pytest.mark.parametrize(
    ("op", "operands", "expected"),
    [
        ("inv", [(0, 0)], [(0, 0)]),
        ("inv", [(2, 0, 0)], [(2, 0, 0)]),
        ("solve", [(0, 0), (0,)], [(0,)]),
        ("solve", [(0, 0), (0, 2)], [(0, 2)]),
        ("solve", [(2, 0, 0), (0,)], [(2, 0)]),
        ("solve_triangular", [(0, 0), (0,)], [(0,)]),
        ("solve_triangular", [(2, 0, 0), (2, 0, 3)], [(2, 0, 3)]),
        ("lu", [(0, 0)], [(0,), (0, 0), (0, 0)]),
        ("lu", [(3, 0)], [(3,), (3, 0), (0, 0)]),
        ("lu", [(0, 3)], [(0,), (0, 0), (0, 3)]),
        ("lu", [(2, 0, 3)], [(2, 0), (2, 0, 0), (2, 0, 3)]),
    ],
)
def test_empty_matrices_give_empty_results(op, operands, expected):
    """LAPACK is never called on an empty matrix (MLX divided by its size:
    SIGFPE), compiled or eager; the results have numpy's shapes."""
    out = run_isolated(f"""
        arrays = [np.zeros(shape, np.float32) for shape in {operands!r}]
        for eager in (False, True):
            results = run_op({op!r}, *arrays, eager=eager)
            results = results if isinstance(results, list) else [results]
            print([tuple(r.shape) for r in results], [r.dtype for r in results])
    """)
    dtypes = "[mlx.core.uint32, " if op == "lu" else "["
    dtypes += ", ".join(["mlx.core.float32"] * (len(expected) - (op == "lu"))) + "]"
    assert out.splitlines() == [f"{expected!r} {dtypes}"] * 2


def test_lu_of_a_matrix_without_columns_keeps_the_rows_in_place():
    out = run_isolated("""
        pivots, lower, upper = run_op("lu", np.zeros((2, 3, 0), np.float32))
        print(np.array(pivots).tolist())
    """)
    assert out.strip() == "[[0, 1, 2], [0, 1, 2]]"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(1, 1), (1, 3), (3, 1), (2, 2), (2, 1, 1)])
def test_lu_solve_inv_repeated_on_single_row_or_column_matrices(shape, dtype):
    """MLX's LU result over-states its element count; for a 1x1 matrix the
    extraction of L and U wrote past the buffer (compiled float64 solve on
    [1, 1] five times: "free(): invalid next size", then SIGSEGV)."""
    out = run_isolated(f"""
        dtype = getattr(mx, {dtype!r})
        a = mx.array(np.full({shape!r}, 0.5) + 2 * np.eye(*{shape[-2:]!r}), dtype=dtype)
        runs = [("lu", [a])]
        if a.shape[-1] == a.shape[-2]:
            runs += [("solve", [a, mx.ones(a.shape[-1:], dtype=dtype)]), ("inv", [a])]
        for op, operands in runs:
            prog = one_op_program(op, *operands)
            exe = mp.compile(prog)
            for _ in range(20):
                mx.eval(exe(*operands), mp.run(prog, *operands, eager=True))
        print("ok")
    """)
    assert out.strip() == "ok"


def test_float64_solve_and_inverse_match_numpy():
    a = RNG.standard_normal((2, 3, 3)) + 3 * np.eye(3)
    b = RNG.standard_normal((2, 3, 2))
    a64, b64 = mx.array(a, dtype=mx.float64), mx.array(b, dtype=mx.float64)
    assert_close(run_op("solve", a64, b64), np.linalg.solve(a, b), rtol=1e-10, atol=1e-12,
                 dtype=mx.float64)
    assert_close(run_op("inv", a64), np.linalg.inv(a), rtol=1e-10, atol=1e-12,
                 dtype=mx.float64)


def test_inverse_of_a_permuting_matrix():
    """inv is built from the LU factors: the pivot order must come back out."""
    a = np.array([[0, 2, 1], [1, 0, 0], [3, 1, 4]], np.float32)
    assert_close(run_op("inv", a), np.linalg.inv(a), **TOL)
    assert_close(run_op("solve", a, np.eye(3, dtype=np.float32)), np.linalg.inv(a), **TOL)


INF, NAN = np.inf, np.nan


def test_svd_and_pinv_of_an_infinite_matrix_return_nan():
    """[[inf, 1, 1], [1, 1, 1], [1, 1, 1]] made LAPACK's SVD loop forever."""
    out = run_isolated("""
        a = np.array([[np.inf, 1, 1], [1, 1, 1], [1, 1, 1]], np.float32)
        for op in ("svd", "pinv"):
            for eager in (False, True):
                results = run_op(op, a, eager=eager)
                results = results if isinstance(results, list) else [results]
                print(op, all(bool(np.isnan(np.array(r)).all()) for r in results))
    """, timeout=60)
    assert out.split() == ["svd", "True"] * 2 + ["pinv", "True"] * 2


NON_FINITE_CASES = [
    (op, attrs, bad)
    for op, attrs in [("svd", {}), ("pinv", {}), ("eigh", {}), ("qr", {}), ("lu", {}),
                      ("inv", {}), ("cholesky", {}), ("norm", {"ord": 2, "axis": [1, 2]}),
                      ("norm", {"ord": "nuc", "axis": [2, 1], "keepdims": True})]
    for bad in ("nan", "inf", "-inf")
]


@pytest.fixture(scope="module")
def non_finite_outcomes() -> list[str]:
    """For each of NON_FINITE_CASES, run in one subprocess (LAPACK could hang
    on these): a batch of two SPD matrices, the second with one non-finite
    entry; "ok" when every result of the second is NaN (lu's pivots: the
    identity permutation) and the first matches the op on it alone."""
    out = run_isolated(f"""
        rng = np.random.default_rng(0)
        a = rng.standard_normal((3, 3)).astype(np.float32)
        good = a @ a.T + 3 * np.eye(3, dtype=np.float32)
        for op, attrs, bad in {NON_FINITE_CASES!r}:
            batch = np.stack([good, good])
            batch[1, 0, 0] = float(bad)
            results, alone = (run_op(op, x, **attrs) for x in (batch, good[None]))
            outcome = "ok"
            for r, ref in zip(*(x if isinstance(x, list) else [x] for x in (results, alone))):
                r, ref = np.array(r), np.array(ref)
                nan = r[1].tolist() == [0, 1, 2] if r.dtype.kind == "u" else np.isnan(r[1]).all()
                if not nan or not np.allclose(r[0], ref[0], rtol=1e-4, atol=1e-4):
                    outcome = f"{{r[1].tolist()}}; {{r[0].tolist()}} vs {{ref[0].tolist()}}"
            print(outcome)
    """, timeout=300)
    return out.splitlines()


@pytest.mark.parametrize("case", range(len(NON_FINITE_CASES)),
                         ids=[f"{op}-{bad}" for op, _, bad in NON_FINITE_CASES])
def test_non_finite_matrix_gives_nan_for_that_matrix_only(non_finite_outcomes, case):
    """One NaN/inf entry makes every result of its matrix NaN (svd, pinv and
    eigh raised RuntimeError or never returned, eigh returned eigenvalues of
    a NaN matrix); the other matrix of the batch is computed as usual."""
    assert non_finite_outcomes[case] == "ok", NON_FINITE_CASES[case]


def test_solve_gives_nan_for_a_non_finite_or_singular_matrix():
    b = np.ones((3, 3, 2), np.float32)
    a = np.stack([_spd(3), _spd(3), np.ones((3, 3), np.float32)])
    a[1, 2, 1] = INF
    x = _np(run_op("solve", a, b))
    np.testing.assert_allclose(x[0], np.linalg.solve(a[0], b[0]), **TOL)
    assert np.isnan(x[1:]).all()


def test_non_finite_right_hand_sides_propagate_by_arithmetic():
    a, b = _spd(3), np.ones((3, 2), np.float32)
    b[0, 1] = NAN
    for op in ("solve", "solve_triangular"):
        x = _np(run_op(op, a, b))
        reference = np.linalg.solve(np.tril(a) if op == "solve_triangular" else a, b[:, 0])
        np.testing.assert_allclose(x[:, 0], reference, **TOL)
        assert np.isnan(x[:, 1]).all()


@pytest.mark.parametrize(
    ("op", "matrix", "attrs"),
    [
        ("inv", np.zeros((3, 3)), {}),
        ("inv", [[1, 2], [2, 4]], {}),
        ("solve", [[1, 2], [2, 4]], {}),
        ("solve_triangular", [[1, 0], [2, 0]], {}),
        ("solve_triangular", [[0, 1], [0, 1]], {"upper": True}),
        ("cholesky", [[1, 2], [2, 1]], {}),
        ("cholesky", [[-1, 0], [0, 1]], {"upper": True}),
    ],
)
def test_matrices_lapack_cannot_factor_give_nan(op, matrix, attrs):
    """A singular matrix (inv of zeros and singular solves raised
    RuntimeError at evaluation) or one that is not positive definite
    (cholesky returned a partial factor) gives NaN."""
    a = np.asarray(matrix, np.float32)
    operands = [a] if op in ("inv", "cholesky") else [a, np.ones(a.shape[0], np.float32)]
    for eager in (False, True):
        assert np.isnan(_np(run_op(op, *operands, eager=eager, **attrs))).all()


def test_lu_of_a_singular_matrix_is_still_a_factorization():
    a = np.array([[1, 2], [2, 4]], np.float32)
    pivots, lower, upper = (_np(x) for x in run_op("lu", a))
    np.testing.assert_allclose(lower[pivots] @ upper, a, **TOL)


@pytest.mark.parametrize(
    ("op", "attrs"),
    [("cholesky", {}), ("cholesky", {"upper": True}), ("eigh", {"UPLO": "L"}),
     ("eigh", {"UPLO": "U"}), ("solve_triangular", {}), ("solve_triangular", {"upper": True})],
)
def test_non_finite_entries_in_the_triangle_not_read_are_ignored(op, attrs):
    a = _spd(3)
    upper = attrs.get("upper", attrs.get("UPLO") == "U")
    noisy = a + np.where(np.tril(np.ones_like(a), -1) if upper else np.triu(np.ones_like(a), 1),
                         NAN, 0)
    operands = [[noisy], [a]] if op != "solve_triangular" else [[noisy, a[0]], [a, a[0]]]
    got, want = (run_op(op, *ops, **attrs) for ops in operands)
    for g, w in zip(*(r if isinstance(r, list) else [r] for r in (got, want))):
        np.testing.assert_allclose(_np(g), _np(w), **TOL)


@pytest.mark.parametrize(("a_shape", "b_shape"), [((2, 3, 3), (3,)), ((2, 3, 3), (4, 1, 3, 2)),
                                                  ((3, 3), (2, 3, 1))])
def test_solve_broadcasts_batch_axes(a_shape, b_shape):
    a = _matrix(*a_shape) + 3 * np.eye(3, dtype=np.float32)
    b = _matrix(*b_shape)
    expected = np.linalg.solve(a, b[..., None] if b.ndim == 1 else b)
    expected = expected[..., 0] if b.ndim == 1 else expected
    assert_close(run_op("solve", a, b), expected, **TOL)
    assert_close(run_op("solve_triangular", a, b),
                 np.linalg.solve(np.tril(a), b[..., None])[..., 0] if b.ndim == 1
                 else np.linalg.solve(np.tril(a), b), **TOL)


def test_singular_value_norm_of_a_non_finite_matrix_is_nan():
    a = np.array([[INF, 1], [1, 1]], np.float32)
    for ord_ in (2, -2, "nuc"):
        assert np.isnan(_np(run_op("norm", a, ord=ord_)))
    # The norms computed by plain arithmetic propagate the infinity.
    for ord_ in (None, 1, "inf", "fro"):
        assert _np(run_op("norm", a, ord=ord_)) == np.inf


@pytest.mark.parametrize("ord_", [2, 2.5, -1, 0, "inf", "-inf", None])
def test_norm_ord_accepts_numbers_infinities_and_null(ord_):
    x = _matrix(5)
    expected = np.linalg.norm(x, ord={"inf": np.inf, "-inf": -np.inf}.get(ord_, ord_))
    assert_close(run_op("norm", x, ord=ord_), expected, **TOL)


@pytest.mark.parametrize("ord_", [True, "2", "Infinity", [2]])
def test_norm_ord_rejects_other_types(ord_):
    with pytest.raises(mp.ValidationError, match="instruction 0 \\(norm\\): attribute 'ord'"):
        run_op("norm", _matrix(5), ord=ord_)
