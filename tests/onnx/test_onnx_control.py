"""If, Loop and Scan against ONNX's reference evaluator."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_cases import OPSET, check_model, run_mlxprog

from mlxprog.onnx import OnnxImportError, import_model


def tensor(name, dtype=TensorProto.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name, array):
    value = numpy_helper.from_array(np.asarray(array))
    return helper.make_node("Constant", [], [name], value=value)


def model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "control", inputs, [tensor(o, 0) for o in outputs],
                              list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def branches(outer="x"):
    """then: outer + 1; else: outer * 2 (both read ``outer`` of the enclosing graph)."""
    then = helper.make_graph([const("one", np.float32(1)),
                              helper.make_node("Add", [outer, "one"], ["t"])],
                             "then", [], [tensor("t", 0)])
    other = helper.make_graph([const("two", np.float32(2)),
                               helper.make_node("Mul", [outer, "two"], ["e"])],
                              "else", [], [tensor("e", 0)])
    return then, other


X = np.array([[1.0, -2.0, 3.0]], np.float32)


@pytest.mark.parametrize("flag", [True, False])
def test_if_on_a_condition_known_at_import_converts_one_branch(flag):
    then, other = branches()
    m = model([const("c", np.array(flag)),
               helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [tensor("x", shape=[1, 3])], ["y"])
    program, _ = import_model(m)
    assert [i.op for i in program.instructions] == ["add" if flag else "multiply"]
    check_model(m, {"x": X})


@pytest.mark.parametrize("value", [1.0, -1.0])
def test_if_on_a_run_time_condition_reads_outer_results_as_carry(value):
    # The branches read 'h', a result of the enclosing program: it has to be
    # carried into the subprograms.
    then, other = branches("h")
    m = model([helper.make_node("Relu", ["x"], ["h"]),
               helper.make_node("ReduceSum", ["s"], ["total"], keepdims=0),
               helper.make_node("Greater", ["total", "zero"], ["c"]),
               helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [tensor("x", shape=[1, 3]), tensor("s", shape=[2])], ["y"],
              [numpy_helper.from_array(np.float32(0), "zero")])
    program, _ = import_model(m)
    assert "cond" in [i.op for i in program.instructions]
    check_model(m, {"x": X, "s": np.array([value, 0.5], np.float32)})


def test_if_branch_returning_an_outer_value_as_it_is():
    then = helper.make_graph([], "then", [], [tensor("h", 0)])
    other = helper.make_graph([helper.make_node("Neg", ["h"], ["e"])], "else", [],
                              [tensor("e", 0)])
    m = model([helper.make_node("Relu", ["x"], ["h"]),
               helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [tensor("x", shape=[1, 3]), tensor("c", TensorProto.BOOL, [])], ["y"])
    for flag in (True, False):
        check_model(m, {"x": X, "c": np.array(flag)})


def test_if_branches_of_different_shapes_name_the_node():
    then = helper.make_graph([const("t", np.zeros(2, np.float32))], "then", [], [tensor("t", 0)])
    other = helper.make_graph([const("e", np.zeros(3, np.float32))], "else", [], [tensor("e", 0)])
    m = model([helper.make_node("If", ["c"], ["y"], name="branchy", then_branch=then,
                                else_branch=other)],
              [tensor("c", TensorProto.BOOL, [])], ["y"])
    with pytest.raises(OnnxImportError, match="branchy.*If"):
        import_model(m)


def loop_body(with_scan=True):
    """Carried: acc (float [3]); acc = acc + h * i (h of the enclosing graph);
    scan output: acc at each iteration. (1-d rows: ONNX's reference evaluator
    concatenates scan outputs with ``np.vstack``, which stacks 1-d rows as
    the specification and onnxruntime do, but not scalars or n-d rows.)"""
    nodes = [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
             helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["h", "fi"], ["step"]),
             helper.make_node("Add", ["acc", "step"], ["acc_out"])]
    outputs = [tensor("cond_out", 0), tensor("acc_out", 0)]
    if with_scan:
        nodes.append(helper.make_node("Identity", ["acc_out"], ["row"]))
        outputs.append(tensor("row", 0))
    return helper.make_graph(nodes, "body", [tensor("i", TensorProto.INT64, []),
                                             tensor("cond_in", TensorProto.BOOL, []),
                                             tensor("acc", shape=[3])], outputs)


def test_loop_with_carried_values_and_scan_outputs():
    m = model([helper.make_node("Relu", ["x"], ["h"]),
               const("M", np.int64(4)), const("cond", np.array(True)),
               helper.make_node("Loop", ["M", "cond", "x"], ["acc", "rows"], body=loop_body())],
              [tensor("x", shape=[3])], ["acc", "rows"])
    acc, rows = check_model(m, {"x": X[0]})
    assert rows.shape == (4, 3)


def test_loop_with_a_run_time_trip_count_and_no_scan_outputs():
    def loop(cond):
        return model([helper.make_node("Relu", ["x"], ["h"]), const("true", np.array(True)),
                      helper.make_node("Loop", ["M", cond, "x"], ["acc"], body=loop_body(False))],
                     [tensor("x", shape=[3]), tensor("M", TensorProto.INT64, [])], ["acc"])

    for trips in (0, 3):
        inputs = {"x": X[0], "M": np.array(trips, np.int64)}
        (want,) = check_model(loop("true"), inputs)
        # Without a condition input (a for loop; ONNX's reference evaluator
        # runs no iteration then, against the specification).
        np.testing.assert_array_equal(run_mlxprog(loop(""), inputs)[0], want)


def test_a_loop_in_a_branch_reads_a_value_two_graphs_out():
    # 'h' (a result of the main program) is read by the Loop's body inside
    # the If's then-branch: carried into the branch, then into the loop.
    loop_node = helper.make_node("Loop", ["M", "true", "x"], ["acc"], body=loop_body(False))
    then = helper.make_graph([const("M", np.int64(3)), const("true", np.array(True)), loop_node],
                             "then", [], [tensor("acc", 0)])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["e"])], "else", [],
                              [tensor("e", 0)])
    m = model([helper.make_node("Relu", ["x"], ["h"]),
               helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
              [tensor("x", shape=[3]), tensor("c", TensorProto.BOOL, [])], ["y"])
    for flag in (True, False):
        check_model(m, {"x": X[0], "c": np.array(flag)})


def test_loop_ending_on_its_condition():
    # while (acc[0] < 10) acc = acc * 2: no trip count, the body's condition decides.
    body = helper.make_graph(
        [const("two", np.float32(2)), const("ten", np.float32(10)),
         helper.make_node("Mul", ["v", "two"], ["v_out"]),
         helper.make_node("Less", ["v_out", "ten"], ["cond_out"])],
        "body", [tensor("i", TensorProto.INT64, []), tensor("c", TensorProto.BOOL, []),
                 tensor("v", shape=[])], [tensor("cond_out", 0), tensor("v_out", 0)])
    m = model([const("go", np.array(True)),
               helper.make_node("Loop", ["", "go", "v0"], ["v"], body=body)],
              [tensor("v0", shape=[])], ["v"])
    (v,) = check_model(m, {"v0": np.array(0.3, np.float32)})
    assert v == np.float32(19.2)


def test_loop_scan_outputs_need_a_known_trip_count():
    m = model([helper.make_node("Relu", ["x"], ["h"]),
               helper.make_node("Loop", ["M", "", "x"], ["acc", "rows"], name="scanloop",
                                body=loop_body())],
              [tensor("x", shape=[3]), tensor("M", TensorProto.INT64, [])], ["acc", "rows"])
    with pytest.raises(OnnxImportError, match=r"'scanloop' \(Loop\): input 0 \(the trip count, "
                                              r"which sizes the scan outputs, 'M'\) must be known"):
        import_model(m)


def scan_model(in_axis=0, in_dir=0, out_axis=0, out_dir=0):
    """Scan with state s (float [2]): s = s + x_t, output s * w (w of the
    enclosing graph) per step; x is [T, 2] (scan axis 0) or [2, T] (axis 1)."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "xt"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "w"], ["y_t"])],
        "body", [tensor("s", shape=[2]), tensor("xt", shape=[2])],
        [tensor("s_out", 0), tensor("y_t", 0)])
    return model([helper.make_node("Relu", ["wx"], ["w"]),
                  helper.make_node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1,
                                   scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                                   scan_output_axes=[out_axis], scan_output_directions=[out_dir])],
                 [tensor("s0", shape=[2]),
                  tensor("x", shape=["T", 2] if in_axis == 0 else [2, "T"]),
                  tensor("wx", shape=[2])], ["s", "ys"])


W = np.array([1.0, 2.0], np.float32)


@pytest.mark.parametrize("steps", [1, 5])
def test_scan_over_a_symbolic_axis(steps):
    x = np.arange(2 * steps, dtype=np.float32).reshape(steps, 2)
    check_model(scan_model(), {"s0": np.ones(2, np.float32), "x": x, "wx": W})


@pytest.mark.parametrize("in_dir,out_dir", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_scan_axes_and_directions(in_dir, out_dir):
    # ONNX's reference evaluator scans axis 0 forwards only: numpy here.
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    s, ys = run_mlxprog(scan_model(1, in_dir, 1, out_dir),
                        {"s0": np.zeros(2, np.float32), "x": x, "wx": W})
    steps = x.T[::-1] if in_dir else x.T
    rows = np.cumsum(steps, axis=0) * W
    np.testing.assert_allclose(s, steps.sum(axis=0))
    np.testing.assert_allclose(ys, (rows[::-1] if out_dir else rows).T)


def test_loop_scan_outputs_with_a_run_time_condition():
    """With scan outputs the first condition decides their length (0 or M
    rows): a run-time one is a shape-deciding input, an error naming it;
    the backend's specialize_inputs binds it at import and runs the loop."""
    from onnx import TensorProto as T

    from mlxprog.onnx import OnnxImportError, import_model
    from mlxprog.onnx.backend import MlxprogBackend

    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
         helper.make_node("Mul", ["fi", "x"], ["row"])], "body",
        [helper.make_tensor_value_info("i", T.INT64, []),
         helper.make_tensor_value_info("c", T.BOOL, [])],
        [helper.make_tensor_value_info("c_out", T.BOOL, []),
         helper.make_tensor_value_info("row", T.FLOAT, [])])
    node = helper.make_node("Loop", ["m", "cond"], ["rows"], body=body)
    graph = helper.make_graph(
        [node], "loop", [helper.make_tensor_value_info("cond", T.BOOL, []),
                         helper.make_tensor_value_info("x", T.FLOAT, [])],
        [helper.make_value_info("rows", onnx.TypeProto())],
        [onnx.numpy_helper.from_array(np.array(3, np.int64), "m")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(OnnxImportError, match="the condition, which decides the scan outputs"):
        import_model(model)
    rep = MlxprogBackend.prepare(model, specialize_inputs=True)
    x = np.array(2.0, np.float32)
    assert rep.run([np.array(True), x])[0].tolist() == [0.0, 2.0, 4.0]
    assert rep.run([np.array(False), x])[0].shape == (0,)
