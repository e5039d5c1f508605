"""Control flow: If, Loop, Scan as the builder's ``cond`` and ``while``.

A subgraph becomes a subprogram, converted by the importer in a child scope
(:meth:`~mlxprog.onnx.context.Context.subgraph`). A subprogram does not see
the results of the program around it, so the values a subgraph reads from
its enclosing graphs are passed in as extra carry
(:meth:`~mlxprog.onnx.context.Context.outer_values`) and passed through
unchanged by a loop's body.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ...arrays import name_of
from ...builder import Value
from ...errors import ProgramError
from ..context import Context, OnnxImportError
from ..registry import converter


def _build(ctx: Context, make: Callable[[], tuple]) -> tuple:
    """``make()``'s results; a builder error (branches that disagree, a loop
    body that changes a carried value's shape) names the node."""
    try:
        return make()
    except OnnxImportError:
        raise
    except ProgramError as e:
        raise ctx.fail(f"the subgraphs do not convert to a valid subprogram: {e}") from None


def _scalar(ctx: Context, b, value: Value, dtype: str) -> Value:
    """A one-element value (ONNX allows ``[]`` or ``[1]``) as a scalar of
    ``dtype``, in builder scope ``b``."""
    if value.shape != ():
        if int(np.prod(value.shape)) != 1:
            raise ctx.fail(f"expected a single element, got shape {list(value.shape)}")
        value = b.reshape(value, shape=[])
    if name_of(value.dtype) != dtype:
        value = b.astype(value, dtype=dtype)
    return value


@converter("If")
def if_(ctx: Context) -> list:
    """``cond`` over the two branches; a condition known at import converts
    only the branch it takes, in place."""
    known = ctx.constant(0)
    if known is not None:
        if known.dtype == object or known.size != 1:
            raise ctx.fail(f"the condition {known.tolist()} is not a single boolean")
        return ctx.inline("then_branch" if bool(known.reshape(-1)[0]) else "else_branch")
    pred = _scalar(ctx, ctx.b, ctx.input(0), "bool")
    outer = ctx.outer_values("then_branch", "else_branch")
    carried = [ctx.value(n) for n in outer]
    then_fn = ctx.subgraph("then_branch", outer)
    else_fn = ctx.subgraph("else_branch", outer)
    return list(_build(ctx, lambda: ctx.b.cond(pred, then_fn, else_fn, carried)))


def _trial_outputs(ctx: Context, body: Callable, carry: Sequence[Value]) -> list[Value]:
    """The outputs ``body`` gives for ``carry``, built in a scratch
    subprogram that is then dropped: how a loop learns the shapes of its scan
    outputs, which its carry (the buffers they fill) must hold before the
    real body is built."""
    return ctx.b.trial(body, [v.aval for v in carry])


def _buffers(ctx: Context, elements: Sequence[Value], names: Sequence[str],
             length: int | str) -> list[Value]:
    """Zeroed ``[length, *element shape]`` buffers for scan outputs."""
    buffers = []
    for element, name in zip(elements, names):
        shape = ctx.symbolic_shape(element, name)
        buffers.append(ctx.b.full(shape=[length, *shape], dtype=name_of(element.dtype),
                                  value=0))
    return buffers


def _write(sb, buffer: Value, element: Value, position: Value) -> Value:
    """``buffer`` with ``element`` at ``position`` of axis 0."""
    return sb.put_slice(buffer, sb.expand_dims(element, axes=[0]), position, dynamic_axes=[0])


@converter("Loop")
def loop(ctx: Context) -> list:
    """``while`` with the carry ``[i, M, cond, *v, *scan buffers, *outer]``.

    Scan outputs fill buffers of ``M`` rows preallocated before the loop, so
    they need ``M`` and the ``cond`` input (no rows when false) known at
    import, and a body whose condition output is True or its condition
    input passed through (a loop that cannot end early)."""
    graph = ctx.attr("body")
    carried = [ctx.input(i) for i in range(2, ctx.num_inputs)]
    n_scan = len(graph.output) - 1 - len(carried)
    b = ctx.b
    if n_scan and not ctx.has_input(0):
        raise ctx.fail("scan outputs need a trip count (input 0): they fill buffers of that "
                       "many rows allocated before the loop")
    # Scan outputs fill buffers of M rows allocated before the loop: M must
    # be known at import then.
    trip = (ctx.require_constant(0, "the trip count, which sizes the scan outputs") if n_scan
            else ctx.constant(0) if ctx.has_input(0) else None)
    if trip is not None and (trip.dtype == object or trip.size != 1):
        raise ctx.fail(f"trip count {trip.tolist()} is not one integer")
    trip_count = int(trip.reshape(-1)[0]) if trip is not None else None
    limit = (b.constant(trip_count, "int64") if trip is not None else
             _scalar(ctx, b, ctx.input(0), "int64") if ctx.has_input(0)
             else b.constant(0, "int64"))
    cond_given = ctx.has_input(1)
    if not cond_given:
        known_cond = np.array(True)
    elif n_scan:
        # The first condition decides the scan outputs' length (0 rows, or
        # M): like a shape input, it must be known at import then.
        known_cond = ctx.require_constant(1, "the condition, which decides the scan outputs' "
                                             "length")
    else:
        known_cond = ctx.constant(1)
    first = None if known_cond is None else bool(known_cond.reshape(-1)[0])
    start_cond = (b.constant(first, "bool") if first is not None
                  else _scalar(ctx, b, ctx.input(1), "bool"))
    n_rows = trip_count if n_scan and first else 0
    outer = ctx.outer_values("body")
    onnx_body = ctx.subgraph("body", outer)
    n_v = len(carried)

    def run_body(sb, i, cond, vs, outer_vals):
        outs = onnx_body(sb, i, cond, *vs, *outer_vals)
        new_cond = _scalar(ctx, sb, outs[0], "bool") if cond_given else cond
        if n_scan and cond_given and not (new_cond is cond or (
                new_cond.ref.kind == "const" and bool(np.array(new_cond.placeholder)))):
            raise ctx.fail("scan outputs need a loop that runs all its M iterations, and "
                           "this body's condition output is computed at run time")
        return new_cond, list(outs[1:1 + n_v]), list(outs[1 + n_v:])

    i0 = b.constant(0, "int64")
    if n_scan:
        elements = _trial_outputs(
            ctx, lambda sb, i, c, *rest: run_body(sb, i, c, rest[:n_v], rest[n_v:])[2],
            [i0, start_cond, *carried, *(ctx.value(n) for n in outer)])
        names = [out.name for out in graph.output[1 + n_v:]]
        buffers = _buffers(ctx, elements, names, n_rows)
        if not first:
            # It never runs (a body writing into the empty buffers would not
            # validate): the carried values as given, empty scan outputs.
            return [*carried, *buffers]
    else:
        buffers = []
    outer_vals = [ctx.value(n) for n in outer]
    has_limit = ctx.has_input(0)

    def cond_fn(sb, i, m, cond, *rest):
        return sb.logical_and(cond, sb.less(i, m)) if has_limit else cond

    def body_fn(sb, i, m, cond, *rest):
        vs, bufs, outs = rest[:n_v], rest[n_v:n_v + n_scan], rest[n_v + n_scan:]
        new_cond, new_vs, elements = run_body(sb, i, cond, vs, outs)
        new_bufs = [_write(sb, buf, e, i) for buf, e in zip(bufs, elements)]
        return [sb.add(i, sb.constant(1, "int64")), m, new_cond, *new_vs, *new_bufs, *outs]

    init = [i0, limit, start_cond, *carried, *buffers, *outer_vals]
    # A known M bounds the loop (beyond the compile default of a million).
    max_iterations = trip_count if trip_count is not None and 1 <= trip_count < 2**31 else None
    results = _build(ctx, lambda: b.while_loop(cond_fn, body_fn, init, max_iterations))
    return list(results[3:3 + n_v + n_scan])


def _axes(ctx: Context, name: str, count: int, ranks: Sequence[int]) -> list[int]:
    axes = ctx.attr(name, [0] * count)
    if len(axes) != count:
        raise ctx.fail(f"{name} has {len(axes)} entries for {count} values")
    return [a % r if r else a for a, r in zip(axes, ranks)]


@converter("Scan")
def scan(ctx: Context) -> list:
    """``while`` over the scan axis, with the carry ``[i, *state, *scan
    buffers, *scan inputs, *outer]``; the scan outputs fill buffers as long
    as the scan axis (a symbolic dim too) and are moved to their axes after."""
    graph = ctx.attr("body")
    n_in = ctx.attr("num_scan_inputs")
    n_state = ctx.num_inputs - n_in
    n_out = len(graph.output) - n_state
    states = [ctx.input(i) for i in range(n_state)]
    xs = [ctx.input(i) for i in range(n_state, ctx.num_inputs)]
    in_axes = _axes(ctx, "scan_input_axes", n_in, [x.ndim for x in xs])
    in_dirs = ctx.attr("scan_input_directions", [0] * n_in)
    out_dirs = ctx.attr("scan_output_directions", [0] * n_out)
    length = ctx.shape(n_state)[in_axes[0]]
    b = ctx.b
    # The trip count as a value: a symbolic length is only known at run time.
    count = b.sum(b.full(shape=[length], dtype="int64", value=1)) if isinstance(length, str) \
        else b.constant(length, "int64")
    outer = ctx.outer_values("body")
    onnx_body = ctx.subgraph("body", outer)

    def step(sb, i, n, ss, xs_, outs):
        last = sb.subtract(n, sb.constant(1, "int64"))
        elements = [sb.take(x, sb.subtract(last, i) if d else i, axis=a)
                    for x, a, d in zip(xs_, in_axes, in_dirs)]
        results = onnx_body(sb, *ss, *elements, *outs)
        return list(results[:n_state]), list(results[n_state:]), last

    i0 = b.constant(0, "int64")
    outer_vals = [ctx.value(n) for n in outer]
    elements = _trial_outputs(
        ctx, lambda sb, i, n, *r: step(sb, i, n, r[:n_state], r[n_state:n_state + n_in],
                                       r[n_state + n_in:])[1],
        [i0, count, *states, *xs, *outer_vals])
    buffers = _buffers(ctx, elements, [o.name for o in graph.output[n_state:]], length)

    def cond_fn(sb, i, n, *rest):
        return sb.less(i, n)

    def body_fn(sb, i, n, *rest):
        ss = rest[:n_state]
        bufs = rest[n_state:n_state + n_out]
        xs_ = rest[n_state + n_out:n_state + n_out + n_in]
        outs = rest[n_state + n_out + n_in:]
        new_ss, new_elements, last = step(sb, i, n, ss, xs_, outs)
        new_bufs = [_write(sb, buf, e, sb.subtract(last, i) if d else i)
                    for buf, e, d in zip(bufs, new_elements, out_dirs)]
        return [sb.add(i, sb.constant(1, "int64")), n, *new_ss, *new_bufs, *xs_, *outs]

    init = [i0, count, *states, *buffers, *xs, *outer_vals]
    results = _build(ctx, lambda: b.while_loop(cond_fn, body_fn, init))
    final_states = list(results[2:2 + n_state])
    stacked = list(results[2 + n_state:2 + n_state + n_out])
    out_axes = _axes(ctx, "scan_output_axes", n_out, [v.ndim for v in stacked])
    for k, axis in enumerate(out_axes):
        if axis:
            order = [*range(1, axis + 1), 0, *range(axis + 1, stacked[k].ndim)]
            stacked[k] = b.transpose(stacked[k], axes=order)
    return final_states + stacked
