"""Executables: trace once and replay, eager mode (release plan, numerics check),
input binding, capture binding from dicts and weights files, stats, ``mp.run``."""

from __future__ import annotations

import ml_dtypes
import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import mlxprog as mp
from helpers import assert_close

W = mx.array([[1.0, 2.0], [3.0, 4.0]])
X = mx.array([[0.0, 0.5], [-1.0, 2.0]])


def affine() -> mp.Program:
    """``exp(x) * w + s`` with x: float32[2, 2], s: float32[], capture w: float32[2, 2]."""
    b = mp.ProgramBuilder("affine")
    x = b.input("x", (2, 2), "float32")
    s = b.input("s", (), "float32")
    w = b.capture("w", (2, 2), "float32")
    return b.build([b.exp(x) * w + s])


def affine_reference(x, s, w=W) -> mx.array:
    return mx.exp(mx.array(x)) * w + s


@pytest.fixture(scope="module")
def exe() -> mp.Executable:
    return mp.compile(affine(), captures={"w": W})


# -- trace once, replay ------------------------------------------------------------

def test_trace_once_and_replay():
    exe = mp.compile(affine(), captures={"w": W})
    assert (exe.stats.calls, exe.stats.traces) == (0, 0)
    for k in range(100):
        (out,) = exe(X + k / 100, mx.array(float(k)))
    assert_close(out, affine_reference(X + 0.99, 99.0))
    stats = exe.stats
    assert (stats.calls, stats.traces, stats.instructions, stats.eager) == (100, 1, 3, False)
    assert [(s.traces, s.calls, s.instructions) for s in stats.segments] == [(1, 100, 3)]
    assert stats.trace_seconds > 0
    snapshot = stats.as_dict()
    assert snapshot["calls"] == 100 and snapshot["segment_traces"] == [1]
    assert "calls=100" in str(stats) and "traces=1" in str(stats)


def test_executables_of_one_program_have_independent_stats():
    prog = affine()
    first, second = (mp.compile(prog, captures={"w": W}) for _ in range(2))
    for _ in range(3):
        first(X, 1.0)
    second(X, 1.0)
    assert (first.stats.calls, first.stats.traces) == (3, 1)
    assert (second.stats.calls, second.stats.traces) == (1, 1)


def test_compile_accepts_a_validated_program():
    validated = mp.validate(affine())
    (out,) = mp.compile(validated, captures={"w": W})(X, 2.0)
    assert_close(out, affine_reference(X, 2.0))


def test_run():
    (out,) = mp.run(affine(), X, 0.5, captures={"w": W})
    assert_close(out, affine_reference(X, 0.5))
    (out,) = mp.run(affine(), X, 0.5, captures={"w": W}, eager=True)
    assert_close(out, affine_reference(X, 0.5))


# -- eager mode --------------------------------------------------------------------

def test_eager_and_compiled_agree():
    compiled = mp.compile(affine(), captures={"w": W})
    eager = mp.compile(affine(), captures={"w": W}, eager=True)
    for s in (0.0, -3.5):
        (a,), (b,) = compiled(X, s), eager(X, s)
        assert_close(a, np.array(b))
    assert eager.stats.eager and eager.stats.calls == 2 and eager.stats.traces == 0


UNARY = {"sin": mx.sin, "cos": mx.cos, "tanh": mx.tanh, "sigmoid": mx.sigmoid,
         "abs": mx.abs, "negate": mx.negative}
BINARY = {"add": mx.add, "subtract": mx.subtract, "multiply": mx.multiply,
          "max": mx.maximum, "min": mx.minimum}


@st.composite
def chains(draw):
    """Up to 6 elementwise steps, each reading any earlier value (inputs x, y first)."""
    steps = []
    for k in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(sorted(UNARY) + sorted(BINARY)))
        arity = 1 if op in UNARY else 2
        steps.append((op, [draw(st.integers(0, k + 1)) for _ in range(arity)]))
    return steps


VALUES = arrays(np.float32, (3, 4), elements=st.floats(-2, 2, width=32))


@settings(max_examples=10, deadline=None, derandomize=True)
@given(chains(), VALUES, VALUES)
def test_random_chains_compiled_eager_and_direct_agree(steps, x, y):
    b = mp.ProgramBuilder("chain")
    values = [b.input("x", (3, 4), "float32"), b.input("y", (3, 4), "float32")]
    direct = [mx.array(x), mx.array(y)]
    for op, args in steps:
        values.append(b.op(op, *(values[i] for i in args)))
        fn = UNARY.get(op) or BINARY[op]
        direct.append(fn(*(direct[i] for i in args)))
    prog = b.build([values[-1], values[len(values) // 2]])
    expected = [direct[-1], direct[len(direct) // 2]]
    eager = mp.run(prog, x, y, eager=True)
    compiled = mp.run(prog, x, y)
    for e, c, d in zip(eager, compiled, expected):
        np.testing.assert_array_equal(np.array(e), np.array(d))
        assert_close(c, np.array(d))


def big_chain(n: int, unused: int = 0) -> mp.Program:
    """``n`` sines of a 4 MB input, plus ``unused`` cosines of it nobody reads."""
    b = mp.ProgramBuilder("big")
    x = b.input("x", (1024, 1024), "float32")
    for _ in range(unused):
        b.cos(x)
    v = x
    for _ in range(n):
        v = b.sin(v)
    return b.build([v])


@pytest.mark.parametrize("n, unused", [(12, 0), (1, 10)])
def test_eager_releases_values_after_last_use(n, unused):
    exe = mp.compile(big_chain(n, unused), eager=True)
    x = mx.ones((1024, 1024))
    mx.eval(x)
    array_bytes = x.nbytes
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    (out,) = exe(x)
    peak = mx.get_peak_memory() - base
    assert peak <= 3 * array_bytes, f"peak {peak / array_bytes:.1f} arrays"
    expected = x
    for _ in range(n):
        expected = mx.sin(expected)
    assert_close(out, expected)


def test_eager_keeps_outputs_that_are_also_read_later():
    b = mp.ProgramBuilder("kept")
    x = b.input("x", (3,), "float32")
    first = b.exp(x)
    second = b.sin(first)
    third = b.cos(second)
    prog = b.build([first, third, second])
    xs = mx.array([0.0, 1.0, -1.0])
    outs = mp.run(prog, xs, eager=True)
    for out, ref in zip(outs, (mx.exp(xs), mx.cos(mx.sin(mx.exp(xs))), mx.sin(mx.exp(xs)))):
        assert_close(out, ref)


def nan_program() -> mp.Program:
    b = mp.ProgramBuilder("nan")
    x = b.input("x", (2, 2), "float32")
    negative = b.negate(b.exp(x))  # instructions 0, 1: finite
    bad = b.log(negative)  # instruction 2: NaN everywhere
    # 3: NaN again; 5: log(abs(x)) is -inf where x is 0
    return b.build([b.add(bad, 1.0), b.log(b.abs(x))])


def test_check_numerics_names_the_first_bad_instruction():
    exe = mp.compile(nan_program(), eager=True, check_numerics=True)
    with pytest.raises(mp.NumericError) as info:
        exe(X)
    assert str(info.value) == ("instruction 2 (log) produced 4 NaN and 0 Inf value(s) "
                               "in an array of shape [2, 2]")


def test_check_numerics_reports_inf():
    b = mp.ProgramBuilder("inf")
    x = b.input("x", (2, 2), "float32")
    prog = b.build([b.divide(b.exp(x), x)])
    with pytest.raises(mp.NumericError) as info:
        mp.run(prog, X, eager=True, check_numerics=True)  # X[0, 0] is 0: exp(0) / 0
    assert str(info.value).startswith("instruction 1 (divide) produced 0 NaN and 1 Inf")


def test_check_numerics_passes_finite_programs_and_needs_eager():
    (out,) = mp.run(affine(), X, 1.0, captures={"w": W}, eager=True, check_numerics=True)
    assert_close(out, affine_reference(X, 1.0))
    with pytest.raises(mp.ProgramError, match="needs eager=True"):
        mp.compile(affine(), captures={"w": W}, check_numerics=True)


# -- input binding -----------------------------------------------------------------

@pytest.mark.parametrize("args, kwargs", [
    ((X, 2.0), {}),
    ((), {"x": X, "s": 2.0}),
    ((X,), {"s": mx.array(2.0)}),
    ((np.array(X), np.float32(2.0)), {}),
    ((np.array(X), np.array(2.0, dtype=np.float32)), {}),
    ((X.tolist(), 2), {}),
])
def test_inputs_positional_by_name_numpy_scalars_lists(exe, args, kwargs):
    (out,) = exe(*args, **kwargs)
    assert out.dtype == mx.float32
    assert_close(out, affine_reference(X, 2.0))


def test_input_names(exe):
    assert exe.input_names == ["x", "s"]
    assert [str(a) for a in exe.out_avals] == ["float32[2, 2]"]


@pytest.mark.parametrize("args, kwargs, message", [
    ((X,), {}, r"program affine takes 2 input\(s\) \(x, s\), got 1"),
    ((X, 1.0, 2.0), {}, r"takes 2 input\(s\) \(x, s\), got 3"),
    ((X,), {"t": 1.0}, "missing input 's'"),
    ((X, 1.0), {"x": X}, r"unknown or repeated input\(s\) 'x'"),
    ((), {"x": X, "s": 1.0, "t": 2.0}, r"unknown or repeated input\(s\) 't'; inputs are"),
])
def test_wrong_input_count_or_names(exe, args, kwargs, message):
    with pytest.raises(mp.BindingError, match=message):
        exe(*args, **kwargs)


@pytest.mark.parametrize("x, found", [
    (mx.zeros((2, 3)), "float32[2, 3]"),
    (mx.zeros((2, 2), dtype=mx.float16), "float16[2, 2]"),
    (mx.zeros((2, 2), dtype=mx.int32), "int32[2, 2]"),
    (np.zeros((2, 2)), "float64[2, 2]"),
    (np.zeros((4,), dtype=np.float32), "float32[4]"),
    (np.zeros((2, 2), dtype=ml_dtypes.bfloat16), "bfloat16[2, 2]"),
    ([1.0, 2.0], "float32[2]"),
    (1.0, "float32[]"),
])
def test_wrong_input_shape_or_dtype(exe, x, found):
    with pytest.raises(mp.BindingError) as info:
        exe(x, 1.0)
    assert str(info.value) == f"input 'x' expects float32[2, 2], got {found}"


def test_unconvertible_input(exe):
    with pytest.raises(mp.BindingError, match="input 's': cannot convert str"):
        exe(X, "two")
    with pytest.raises(mp.BindingError, match="input 'x': value is a ragged nested list"):
        exe([[1.0, 2.0], [3.0]], 1.0)


def int_identity() -> mp.Executable:
    b = mp.ProgramBuilder("ints")
    n = b.input("n", (2,), "int32")
    return mp.compile(b.build([n]))


def test_python_floats_for_an_integer_input_are_rejected():
    # Bug: converted with truncation, [1.5, 2.7] silently becomes [1, 2].
    with pytest.raises(mp.BindingError, match="input 'n'"):
        int_identity()([1.5, 2.7])


def test_python_int_out_of_range_for_the_input_dtype():
    # Bug: mx.array(2**40, dtype=int32) raises RuntimeError std::bad_cast from MLX.
    with pytest.raises(mp.BindingError, match="input 'n'"):
        int_identity()([2**40, 1])


def test_numpy_bfloat16_arrays_bind_bit_for_bit():
    # Bug: ml_dtypes' bfloat16 (the numpy type onnx and JAX hand out) was refused
    # with "input 'x' expects bfloat16[2, 3], got bfloat16[2, 3]". Every bit
    # pattern (NaNs, infinities, subnormals, -0) must arrive unchanged, whether
    # bound as an input, a capture or a callback's result.
    bits = np.arange(2**16, dtype=np.uint16).reshape(256, 256)
    values = bits.view(ml_dtypes.bfloat16)
    b = mp.ProgramBuilder("bf16")
    x = b.input("x", (256, 256), "bfloat16")
    w = b.capture("w", (256, 256), "bfloat16")
    (y,) = b.runtime_call("give", outputs=[((256, 256), "bfloat16")])
    exe = mp.compile(b.build([x, w, y]), captures={"w": values[::-1]},
                     callbacks={"give": lambda: values.T})
    x_out, w_out, y_out = exe(values)
    for out, expected in ((x_out, bits), (w_out, bits[::-1]), (y_out, bits.T)):
        assert out.dtype == mx.bfloat16
        np.testing.assert_array_equal(np.array(out.view(mx.uint16)), expected)


def test_a_numpy_view_with_negative_strides_binds():
    # Bug: MLX's "Cannot convert DLPack arrays with negative strides" escaped.
    b = mp.ProgramBuilder("reversed")
    x = b.input("x", (4,), "float32")
    (out,) = mp.run(b.build([x]), np.arange(4, dtype=np.float32)[::-1])
    assert out.tolist() == [3.0, 2.0, 1.0, 0.0]


def test_zero_dimensional_numpy_arrays_bind_as_scalars():
    b = mp.ProgramBuilder("scalars")
    x = b.input("x", (), "float32")
    h = b.input("h", (), "bfloat16")
    out = mp.run(b.build([x, h]), np.array(0.5, np.float32), np.array(1.5, ml_dtypes.bfloat16))
    assert [(o.shape, o.item()) for o in out] == [((), 0.5), ((), 1.5)]


def test_float32_numpy_arrays_still_bind_to_bfloat16_rounded():
    b = mp.ProgramBuilder("bf16")
    x = b.input("x", (2,), "bfloat16")
    (out,) = mp.run(b.build([x]), np.array([1.0, 1 + 2**-8 + 2**-10], np.float32))
    assert out.dtype == mx.bfloat16 and out.tolist() == [1.0, 1 + 2**-7]


# -- captures ------------------------------------------------------------------------

@pytest.mark.parametrize("w", [W, np.array(W), W.tolist()])
def test_captures_from_a_dict(w):
    (out,) = mp.run(affine(), X, 0.0, captures={"w": w})
    assert_close(out, affine_reference(X, 0.0))


@pytest.mark.parametrize("suffix, save", [
    (".safetensors", mx.save_safetensors),
    (".npz", lambda path, arrays: mx.savez(path, **arrays)),
    (".gguf", mx.save_gguf),
])
def test_captures_from_a_weights_file(tmp_path, suffix, save):
    path = tmp_path / f"weights{suffix}"
    save(str(path), {"w": W, "unused": mx.zeros((3,))})
    (out,) = mp.run(affine(), X, 1.0, weights=path)
    assert_close(out, affine_reference(X, 1.0))
    (out,) = mp.run(affine(), X, 1.0, weights=[str(path)], captures={"w": 2 * W})
    assert_close(out, affine_reference(X, 1.0, 2 * W))  # captures= wins over the file


def test_missing_capture():
    with pytest.raises(mp.BindingError) as info:
        mp.compile(affine(), captures={"v": W})
    assert str(info.value) == ("capture 'w' (float32[2, 2]) is not bound: "
                               "pass it in captures= or a weights= file")


@pytest.mark.parametrize("w, message", [
    (mx.zeros((2, 3)), "capture 'w' expects float32[2, 2], got float32[2, 3]"),
    (mx.zeros((2, 2), dtype=mx.bfloat16), "capture 'w' expects float32[2, 2], got bfloat16[2, 2]"),
    (np.zeros((2, 2)), "capture 'w' expects float32[2, 2], got float64[2, 2]"),
    ([1.0, 2.0], "capture 'w' expects float32[2, 2], got float32[2]"),
])
def test_capture_mismatch(w, message):
    with pytest.raises(mp.BindingError) as info:
        mp.compile(affine(), captures={"w": w})
    assert str(info.value) == message


def test_capture_mismatch_from_a_weights_file(tmp_path):
    path = tmp_path / "w.safetensors"
    mx.save_safetensors(str(path), {"w": mx.zeros((2, 2), dtype=mx.float16)})
    with pytest.raises(mp.BindingError, match="capture 'w' expects float32.2, 2., got float16"):
        mp.compile(affine(), weights=path)


def test_unreadable_weights_file(tmp_path):
    with pytest.raises(mp.BindingError, match="cannot read weights file .*nothing.safetensors"):
        mp.compile(affine(), weights=tmp_path / "nothing.safetensors")
    single = tmp_path / "single.npy"
    mx.save(str(single), W)
    with pytest.raises(mp.BindingError, match="holds one array, not named arrays"):
        mp.compile(affine(), weights=single)


# -- outputs and trivial programs -------------------------------------------------------

def test_outputs_can_be_inputs_captures_and_constants():
    b = mp.ProgramBuilder("direct")
    x = b.input("x", (2, 2), "float32")
    w = b.capture("w", (2, 2), "float32")
    c = b.constant([1, 2, 3], "int32")
    prog = b.build([c, w, x, x])
    assert prog.instructions == []
    for eager in (False, True):
        exe = mp.compile(prog, captures={"w": W}, eager=eager)
        outs = exe(X)
        assert [o.tolist() for o in outs] == [[1, 2, 3], W.tolist(), X.tolist(), X.tolist()]
        assert outs[0].dtype == mx.int32


def test_outputs_mix_results_and_declarations():
    b = mp.ProgramBuilder("mixed")
    x = b.input("x", (2, 2), "float32")
    w = b.capture("w", (2, 2), "float32")
    prog = b.build([w, b.exp(x), x])
    w_out, y, x_out = mp.run(prog, X, captures={"w": W})
    assert_close(w_out, W)
    assert_close(y, mx.exp(X))
    assert_close(x_out, X)


def test_program_without_instructions_or_outputs():
    exe = mp.compile(mp.Program(name="empty"))
    assert exe() == []
    assert exe() == []
    assert (exe.stats.calls, exe.stats.traces, exe.stats.instructions) == (2, 0, 0)
    with pytest.raises(mp.BindingError, match=r"takes 0 input\(s\) \(none\), got 1"):
        exe(X)


def test_eager_execution_names_the_instruction_mlx_fails_to_compute():
    @mp.register_op("test_raw_inverse")
    def raw_inverse(operands, attrs):
        """``mx.linalg.inv`` as MLX has it (it fails at evaluation on a singular matrix)."""
        return mx.linalg.inv(operands[0], stream=mx.cpu)

    try:
        b = mp.ProgramBuilder()
        x = b.input("x", (2, 2), "float32")
        exe = mp.compile(b.build([b.test_raw_inverse(b.exp(x))]), eager=True)
        with pytest.raises(mp.EvaluationError, match=r"instruction 1 \(test_raw_inverse\) "
                                                     r"failed while computing its results"):
            exe(np.full((2, 2), -np.inf, np.float32))
    finally:
        mp.unregister_op("test_raw_inverse")


@pytest.mark.parametrize("make", [lambda: np.zeros((2, 0), np.float32),
                                  lambda: mx.array(np.zeros((2, 0), np.float32)),
                                  lambda: [[], []]])
def test_empty_inputs_reduce_to_their_identities(make):
    b = mp.ProgramBuilder()
    x = b.input("x", (2, 0), "float32")
    exe = mp.compile(b.build([b.sum(x, axes=[1]), b.product(x), b.all(x)]))
    mx.eval(exe(np.ones((2, 0), np.float32)))  # a compiled reduction first, as in the bug
    total, prod, every = exe(make())
    assert np.array(total).tolist() == [0.0, 0.0]
    assert prod.item() == 1.0 and every.item() is True
