"""The ``ai.onnx.ml`` domain's tensor ops: Binarizer, ArrayFeatureExtractor,
TreeEnsemble (opset 5's regression trees, evaluated densely).

The older TreeEnsembleRegressor/Classifier, the other classifiers and the
string ops of the domain are not converted.
"""

from __future__ import annotations

import math

import numpy as np

from ...arrays import is_floating
from ..context import Context
from ..dtypes import dtype_name
from ..registry import converter


@converter("Binarizer", domain="ai.onnx.ml")
def binarizer(ctx: Context) -> list:
    """1 where ``X > threshold`` (default 0.0), else 0, in ``X``'s type."""
    x = ctx.input(0)
    b = ctx.b
    threshold = ctx.attr("threshold", 0.0)
    if not is_floating(x.dtype):
        # An integer exceeds t exactly when it exceeds floor(t).
        threshold = math.floor(threshold)
    above = b.greater(x, ctx.scalar(threshold, x))
    return [b.select(above, ctx.scalar(1, x), ctx.scalar(0, x))]


@converter("ArrayFeatureExtractor", domain="ai.onnx.ml")
def array_feature_extractor(ctx: Context) -> list:
    """The elements of ``X`` along its last axis at the indices ``Y`` (all of
    them, flattened): ``[..., len(Y)]``; a 1-d ``X`` gives ``[1, len(Y)]``
    (onnxruntime's and ONNX's reference's layout)."""
    shape = list(ctx.shape(0))
    if not shape:
        raise ctx.fail("X must have rank 1 or more")
    b = ctx.b
    index = b.reshape(ctx.input(1), shape=[-1])
    taken = b.take(ctx.input(0), index, axis=len(shape) - 1)
    if len(shape) == 1:
        taken = b.expand_dims(taken, axes=[0])
    return [taken]


#: TreeEnsemble's node comparisons, by ``nodes_modes`` value (6 is set membership).
_TREE_MODES = {0: "less_equal", 1: "less", 2: "greater_equal", 3: "greater", 4: "equal",
               5: "not_equal"}


def _tree_leaves(ctx: Context, trees: dict, members) -> list[tuple[list, int]]:
    """Every leaf of the ensemble with its path (``(node, took_true)`` pairs),
    tree by tree, true branch first; a set-membership node takes the next
    NaN-terminated run of ``members`` when it is first reached (the order
    ONNX's reference builds the trees in)."""
    sets: dict[int, list[float]] = {}
    leaves: list[tuple[list, int]] = []
    runs = iter(members)

    def visit(index: int, is_leaf: bool, path: list) -> None:
        if is_leaf:
            leaves.append((path, index))
            return
        if len(path) > len(trees["modes"]):
            raise ctx.fail("the trees' node ids form a cycle")
        if trees["modes"][index] == 6 and index not in sets:
            run = []
            for value in runs:
                if np.isnan(value):
                    break
                run.append(float(value))
            sets[index] = run
        visit(trees["true"][index], bool(trees["true_leaf"][index]), [*path, (index, True)])
        visit(trees["false"][index], bool(trees["false_leaf"][index]), [*path, (index, False)])

    for root in trees["roots"]:
        degenerate = (trees["true_leaf"][root] and trees["false_leaf"][root]
                      and trees["true"][root] == trees["false"][root])
        visit(root if not degenerate else trees["true"][root], bool(degenerate), [])
    trees["sets"] = sets
    return leaves


@converter("TreeEnsemble", domain="ai.onnx.ml")
def tree_ensemble(ctx: Context) -> list:
    """Tree ensemble regression of ``X`` (``[N, F]``), dense: every node's
    comparison is computed for every row, a leaf is reached where each
    comparison on its path went its way (counted with two matrix
    products), and the reached leaves' weights are aggregated per target
    (``aggregate_function`` SUM, AVERAGE, MIN, MAX). ``post_transform``
    must be NONE (ONNX's reference applies none)."""
    ctx.choice("post_transform", (0,), 0)
    aggregate = ctx.choice("aggregate_function", (0, 1, 2, 3), 1)
    shape = list(ctx.shape(0))
    if len(shape) != 2:
        raise ctx.fail(f"X must be [N, F]; its shape is {shape}")
    trees = {"modes": np.asarray(ctx.attr("nodes_modes")).reshape(-1).astype(np.int64),
             "true": list(ctx.attr("nodes_truenodeids")),
             "false": list(ctx.attr("nodes_falsenodeids")),
             "true_leaf": list(ctx.attr("nodes_trueleafs")),
             "false_leaf": list(ctx.attr("nodes_falseleafs")),
             "roots": list(ctx.attr("tree_roots"))}
    bad = sorted(set(trees["modes"].tolist()) - {*_TREE_MODES, 6})
    if bad:
        raise ctx.fail(f"attribute nodes_modes holds unknown modes {bad}")
    members = np.asarray(ctx.attr("membership_values", np.zeros(0))).reshape(-1)
    leaves = _tree_leaves(ctx, trees, members)
    dtype = np.dtype(ctx.dtype(0))
    splits = np.asarray(ctx.attr("nodes_splits")).reshape(-1).astype(dtype)
    features = list(ctx.attr("nodes_featureids"))
    nodes = len(features)
    missing = list(ctx.attr("nodes_missing_value_tracks_true", [0] * nodes))
    targets = list(ctx.attr("leaf_targetids"))
    weights = np.asarray(ctx.attr("leaf_weights")).reshape(-1).astype(dtype)
    n_targets = ctx.attr("n_targets")
    if any(not 0 <= t < n_targets for t in targets):
        raise ctx.fail(f"attribute leaf_targetids {targets} must be in [0, n_targets="
                       f"{n_targets})")
    b = ctx.b
    name = ctx.node.output[0]

    def constant(what: str, array: np.ndarray):
        return ctx.known_value(f"{name}.{what}", np.asarray(array))

    values = b.take(ctx.input(0), b.constant(features, "int32"), axis=1)  # [N, nodes]
    cond = b.full(shape=[shape[0], nodes], dtype="bool", value=False)
    for mode in sorted(set(trees["modes"].tolist())):
        mask = constant(f"mode{mode}", trees["modes"] == mode)
        if mode == 6:
            width = max([len(s) for s in trees["sets"].values()] + [1])
            table = np.full((nodes, width), np.nan, dtype)  # NaN equals nothing
            for index, run in trees["sets"].items():
                table[index, :len(run)] = run
            hit = b.any(b.equal(b.expand_dims(values, axes=[2]), constant("sets", table)),
                        axes=[2])
        else:
            hit = getattr(b, _TREE_MODES[mode])(values, constant("splits", splits))
        cond = b.logical_or(cond, b.logical_and(mask, hit))
    if any(missing):
        cond = b.logical_or(cond, b.logical_and(constant("missing", np.asarray(missing, bool)),
                                                b.is_nan(values)))
    # A leaf is reached where all of its path's comparisons went its way.
    went_true = np.zeros((nodes, len(leaves)), np.float32)
    went_false = np.zeros((nodes, len(leaves)), np.float32)
    for column, (path, _) in enumerate(leaves):
        for index, took_true in path:
            (went_true if took_true else went_false)[index, column] = 1
    c = b.astype(cond, dtype="float32")
    agree = b.add(b.matmul(c, constant("true_paths", went_true)),
                  b.matmul(b.subtract(b.constant(1.0, "float32"), c),
                           constant("false_paths", went_false)))
    lengths = np.array([len(path) for path, _ in leaves], np.float32)
    reached = b.equal(agree, constant("lengths", lengths))  # [N, leaves]
    onehot = np.zeros((len(leaves), n_targets), dtype)
    for row, (_, leaf) in enumerate(leaves):
        onehot[row, targets[leaf]] = weights[leaf]
    if aggregate in (0, 1):
        out = b.matmul(b.astype(reached, dtype=dtype_name(dtype)), constant("weights", onehot))
        if aggregate == 0:
            out = b.divide(out, ctx.scalar(len(trees["roots"]), out))
        return [out]
    # MIN/MAX: each target's extreme over the reached leaves that write it.
    writes = np.zeros((len(leaves), n_targets), bool)
    for row, (_, leaf) in enumerate(leaves):
        writes[row, targets[leaf]] = True
    leaf_values = np.array([weights[leaf] for _, leaf in leaves], dtype)[:, None]
    take = b.logical_and(b.expand_dims(reached, axes=[2]), constant("writes", writes))
    bound = float(np.finfo(dtype).max if aggregate == 2 else np.finfo(dtype).min)
    values_table = constant("leaf_values", np.broadcast_to(leaf_values, writes.shape).copy())
    candidates = b.select(take, values_table, b.constant(bound, dtype_name(dtype)))
    reduce = b.reduce_min if aggregate == 2 else b.reduce_max
    return [reduce(candidates, axes=[1])]
