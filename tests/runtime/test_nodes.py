"""Node counts of compiled segments (``SegmentStats.nodes``, counted on the
compiled tape when a segment is traced) and captures joined from several
bound arrays (``"a+b"``)."""

from __future__ import annotations

import mlx.core as mx
import pytest

import mlxprog as mp
from mlxprog.runtime.graph import count_nodes


def test_count_nodes_counts_the_compiled_tape():
    x = mx.ones((2, 3))
    mx.eval(x)
    # exp, multiply and add fuse into one node; the transpose and reshape stay.
    f = mx.compile(lambda a: [(mx.exp(a) * 2 + 1).T.reshape(-1)])
    counts = count_nodes(f(x), [x])
    assert sum(counts.values()) == 3
    assert counts["Transpose"] == counts["Reshape"] == 1
    assert any(name.startswith("Compiled") for name in counts)


def test_count_nodes_stops_at_the_inputs():
    lazy = mx.exp(mx.ones((4,))) + 1  # computed by earlier graph nodes
    f = mx.compile(lambda a: [a * 3])
    assert sum(count_nodes(f(lazy), [lazy]).values()) == 1


def test_a_multi_output_node_counts_once_and_passed_through_values_not_at_all():
    x = mx.arange(6.0)
    mx.eval(x)
    f = mx.compile(lambda a: [*mx.split(a, 2), a])
    assert count_nodes(f(x), [x]) == {"Split": 1}


def _chain() -> mp.Program:
    b = mp.ProgramBuilder("chain")
    x = b.input("x", (2, 3), "float32")
    w = b.capture("w", (3, 2), "float32")
    y = b.matmul(b.exp(x) * 2.0, w)
    return b.build([b.reshape(b.transpose(y), shape=[4])])


def test_executable_stats_count_nodes_when_traced():
    # MLX's own ops (native kernels would name the matmul node MlxprogMatmul).
    exe = mp.compile(_chain(), captures={"w": mx.ones((3, 2))}, native=False)
    assert exe.stats.segments[0].nodes is None
    exe(mx.ones((2, 3)))
    segment = exe.stats.segments[0]
    # exp and multiply fused; matmul, transpose, reshape.
    assert segment.nodes == 4 and sum(segment.primitives.values()) == 4
    assert segment.primitives["Matmul"] == 1
    assert exe.stats.as_dict()["segment_nodes"] == [4]
    exe(mx.zeros((2, 3)))  # a replay counts nothing new
    assert exe.stats.segments[0].nodes == 4 and exe.stats.traces == 1


def test_eager_executables_count_no_nodes():
    exe = mp.compile(_chain(), captures={"w": mx.ones((3, 2))}, eager=True)
    exe(mx.ones((2, 3)))
    assert exe.stats.as_dict()["segment_nodes"] == []


def test_loop_bodies_are_counted():
    b = mp.ProgramBuilder("loop")
    x = b.input("x", (), "float32")
    (out,) = b.while_loop(lambda sb, v: sb.less(v, 10.0), lambda sb, v: [v * 2.0 + 1.0], [x])
    exe = mp.compile(b.build([out]))
    assert exe(mx.array(1.0))[0].item() == 15.0
    # The loop runs its body and condition as one fused segment.
    fused = [s for s in exe.stats.segments if s.location.endswith("body + cond")]
    assert [(s.traces, s.nodes) for s in fused] == [(1, 1)]
    assert all((s.nodes is None) == (s.traces == 0) for s in exe.stats.segments)


# -- joined captures -----------------------------------------------------------------

def _joined() -> mp.Program:
    b = mp.ProgramBuilder("joined")
    x = b.input("x", (1, 2), "float32")
    w = b.capture("a+b", (3, 2), "float32")
    return b.build([b.matmul(x, b.transpose(w))])


def test_a_joined_capture_stacks_its_parts():
    a, b = mx.array([[1.0, 2.0]]), mx.array([[3.0, 4.0], [5.0, 6.0]])
    exe = mp.compile(_joined(), captures={"a": a, "b": b})
    assert exe(mx.array([[1.0, 1.0]]))[0].tolist() == [[3.0, 7.0, 11.0]]
    # A capture of that very name wins over the parts.
    exe = mp.compile(_joined(), captures={"a+b": mx.zeros((3, 2)), "a": a, "b": b})
    assert exe(mx.array([[1.0, 1.0]]))[0].tolist() == [[0.0, 0.0, 0.0]]


def test_joined_capture_errors_name_the_capture():
    with pytest.raises(mp.BindingError, match="capture 'a\\+b' .* not bound"):
        mp.compile(_joined(), captures={"a": mx.ones((1, 2))})
    with pytest.raises(mp.BindingError, match="capture 'a\\+b': its parts cannot be joined"):
        mp.compile(_joined(), captures={"a": mx.ones((1, 2)), "b": mx.ones((2, 3))})
    with pytest.raises(mp.BindingError, match="capture 'a\\+b' expects float32\\[3, 2\\]"):
        mp.compile(_joined(), captures={"a": mx.ones((1, 2)), "b": mx.ones((1, 2))})
