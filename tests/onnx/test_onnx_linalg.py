"""Linear algebra converters against ONNX's reference evaluator."""

import numpy as np
import pytest

from onnx_cases import check_node, node_model, normal_f32, run_mlxprog

from mlxprog.onnx import OnnxImportError, import_model

rng = np.random.default_rng(3)

f32 = normal_f32(rng)


# -- MatMul -------------------------------------------------------------------------------


@pytest.mark.parametrize("a,b", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                 ((4,), (4,)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2))])
def test_matmul(a, b):
    check_node("MatMul", {"a": f32(*a), "b": f32(*b)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_matmul_integer_dtypes_exact(dtype):
    a = rng.integers(-1000, 1000, (3, 5)).astype(dtype)
    b = rng.integers(-1000, 1000, (5, 2)).astype(dtype)
    check_node("MatMul", {"a": a, "b": b}, rtol=0, atol=0)


def test_matmul_large_int64_exact():
    # Beyond float64's 53-bit mantissa: an exact integer product is needed.
    a = np.array([[2 ** 40 + 1, 3]], np.int64)
    b = np.array([[2 ** 20 + 1], [5]], np.int64)
    check_node("MatMul", {"a": a, "b": b}, rtol=0, atol=0)


def test_matmul_with_initializer():
    check_node("MatMul", {"a": f32(2, 3)}, initializers={"w": f32(3, 4)}, rtol=1e-4, atol=1e-5)


# -- Gemm -------------------------------------------------------------------------------


@pytest.mark.parametrize("attrs", [{}, {"transA": 1}, {"transB": 1}, {"transA": 1, "transB": 1},
                                   {"alpha": 0.5, "beta": 2.0}, {"beta": 0.0}])
@pytest.mark.parametrize("c", [None, (5,), (3, 5), (1,), (3, 1)])
def test_gemm(attrs, c):
    a = f32(4, 3) if attrs.get("transA") else f32(3, 4)
    b = f32(5, 4) if attrs.get("transB") else f32(4, 5)
    inputs = {"a": a, "b": b}
    if c is not None:
        inputs["c"] = f32(*c)
    check_node("Gemm", inputs, rtol=1e-4, atol=1e-5, **attrs)


def test_gemm_int():
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    b = np.arange(12, dtype=np.int64).reshape(3, 4)
    check_node("Gemm", {"a": a, "b": b, "c": np.ones(4, np.int64)}, alpha=2.0, beta=3.0)


# -- Einsum -------------------------------------------------------------------------------


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij, bjk -> bik", [(2, 2, 3), (2, 3, 4)]),
    ("ii->i", [(3, 3)]),
    ("ij->ji", [(2, 3)]),
    ("ij,ij->", [(2, 3), (2, 3)]),
    ("i,j", [(2,), (3,)]),
    ("...ij,...jk->...ik", [(2, 1, 2, 3), (3, 3, 4)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
])
def test_einsum(equation, shapes):
    inputs = {f"x{i}": f32(*s) for i, s in enumerate(shapes)}
    check_node("Einsum", inputs, equation=equation, rtol=1e-4, atol=1e-5)


def test_einsum_integer_is_refused():
    model = node_model("Einsum", {"a": np.ones((2, 2), np.int64)}, equation="ij->i")
    with pytest.raises(OnnxImportError, match="floating operands only"):
        import_model(model)


# -- MatMulInteger ----------------------------------------------------------------------


def test_matmul_integer_no_zero_points():
    a = rng.integers(-128, 128, (3, 4)).astype(np.int8)
    b = rng.integers(-128, 128, (4, 2)).astype(np.int8)
    check_node("MatMulInteger", {"a": a, "b": b})


@pytest.mark.parametrize("a_zp,b_zp", [((), ()), ((), (2,)), ((1,), ())])
def test_matmul_integer_zero_points(a_zp, b_zp):
    a = rng.integers(0, 256, (3, 4)).astype(np.uint8)
    b = rng.integers(0, 256, (4, 2)).astype(np.uint8)
    check_node("MatMulInteger", {"a": a, "b": b,
                                 "az": rng.integers(0, 256, a_zp).astype(np.uint8),
                                 "bz": rng.integers(0, 256, b_zp).astype(np.uint8)})


def test_matmul_integer_batched():
    a = rng.integers(-128, 128, (2, 3, 4)).astype(np.int8)
    b = rng.integers(0, 256, (4, 5)).astype(np.uint8)
    check_node("MatMulInteger", {"a": a, "b": b, "az": np.array(3, np.int8)})


def test_matmul_integer_per_row_zero_point():
    # A per-row a_zero_point ([M]; the spec allows it, the reference evaluator
    # does not broadcast it): against numpy.
    a = rng.integers(0, 256, (3, 4)).astype(np.uint8)
    b = rng.integers(0, 256, (4, 2)).astype(np.uint8)
    az, bz = np.array([1, 200, 7], np.uint8), np.array([3, 250], np.uint8)
    inputs = {"a": a, "b": b, "az": az, "bz": bz}
    (got,) = run_mlxprog(node_model("MatMulInteger", inputs), inputs)
    want = (a.astype(np.int32) - az.astype(np.int32)[:, None]) @ (b.astype(np.int32) - bz)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)


# -- Det ------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (5, 5), (2, 3, 4, 4)])
def test_det(shape):
    check_node("Det", {"x": f32(*shape)}, rtol=1e-4, atol=1e-5)


def test_det_permuted_and_singular():
    x = np.array([[[0, 1, 0], [0, 0, 1], [1, 0, 0]],
                  [[0, 1, 0], [1, 0, 0], [0, 0, 1]],
                  [[1, 2, 3], [2, 4, 6], [0, 1, 1]]], np.float32)
    check_node("Det", {"x": x}, rtol=1e-4, atol=1e-5)


def test_qlinear_matmul_per_column_scale_and_bad_output_type():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 255, (3, 5), dtype=np.uint8)
    b = rng.integers(-128, 127, (5, 4), dtype=np.int8)
    params = {"a_scale": np.array(0.1, np.float32), "a_zp": np.array(7, np.uint8),
              "b": b, "b_scale": np.array([0.03, 0.01, 0.02, 0.04], np.float32),
              "b_zp": np.array(-2, np.int8),
              "y_scale": np.array(0.5, np.float32), "y_zp": np.array(3, np.int8)}
    check_node("QLinearMatMul", {"a": a}, initializers=params)
    params["y_zp"] = np.array(3, np.int32)
    with pytest.raises(OnnxImportError, match="y_zero_point is int32"):
        import_model(node_model("QLinearMatMul", {"a": a}, initializers=params))
