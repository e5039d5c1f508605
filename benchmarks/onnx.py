"""ONNX models in mlxprog (``mlxprog.onnx.backend``, CPU) against
onnxruntime (CPUExecutionProvider), on the models the onnx wheel ships:
the nine light architectures (``backend/test/data/light``: AlexNet,
DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512, fed ``arange(n)/n`` as the backend tests do) and the
``pytorch-converted`` models (fed their first test data set).

Per model: import + compile time (mlxprog's ``prepare``: import, validate,
JSON round-trip, compile) and onnxruntime's session creation; one warm-up
call each (tracing, kernel compilation), then ``--rounds`` rounds of a
block of calls per runtime (an untimed one, which waits out the other
runtime's spinning thread pool, then ``--runs`` timed ones), the median
time per call (the best call of each is printed too:
on a loaded machine a sub-millisecond call sometimes waits a scheduler tick,
about 4 ms); the outputs are compared (max abs diff) and the ratio is
mlxprog / onnxruntime medians (above 1: mlxprog is slower). A
model mlxprog cannot import is listed with the reason. onnxruntime gets the
model as it is, or where it no longer implements its opset, the model as
mlxprog imports it (converted to opset 13).

    python benchmarks/onnx.py [--runs 5] [--rounds 3] [--only REGEX] [--threads N]
                              [--markdown]
"""

from __future__ import annotations

import sys
import os

# This file is named onnx.py: keep its folder off the path so `import onnx`
# finds the package.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import argparse  # noqa: E402
import glob  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def light_models():
    """(name, model path, inputs) of the light models: ``arange(n)/n`` inputs."""
    for path in sorted(glob.glob(os.path.join(DATA, "light", "light_*.onnx"))):
        name = os.path.basename(path)[len("light_"):-len(".onnx")]
        model = onnx.load(path)
        inits = {i.name for i in model.graph.initializer}
        inputs = []
        for spec in model.graph.input:
            if spec.name in inits:
                continue
            shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                          for d in spec.type.tensor_type.shape.dim)
            n = int(np.prod(shape))
            inputs.append((np.arange(n).reshape(shape) / n).astype(np.float32))
        yield f"light/{name}", model, inputs


def pytorch_converted_models():
    """(name, model, inputs) of the pytorch-converted models, first data set."""
    for case_dir in sorted(glob.glob(os.path.join(DATA, "pytorch-converted", "test_*"))):
        model = onnx.load(os.path.join(case_dir, "model.onnx"))
        files = sorted(glob.glob(os.path.join(case_dir, "test_data_set_0", "input_*.pb")),
                       key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[0]))
        inputs = []
        for f in files:
            t = onnx.TensorProto()
            with open(f, "rb") as fh:
                t.ParseFromString(fh.read())
            inputs.append(numpy_helper.to_array(t))
        yield f"pytorch-converted/{os.path.basename(case_dir)[len('test_'):]}", model, inputs


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(name, model, inputs, runs, rounds, threads):
    import onnxruntime as ort

    from mlxprog.onnx.backend import MlxprogBackend

    ort.set_default_logger_severity(3)
    row = {"model": name}
    start = time.perf_counter()
    try:
        rep = MlxprogBackend.prepare(model, "CPU")
    except Exception as e:  # noqa: BLE001 - reported
        row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        return row
    row["prepare_s"] = time.perf_counter() - start

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    start = time.perf_counter()
    try:
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - old opsets it no longer implements
        # The model as mlxprog imports it (converted to opset 13) instead.
        from mlxprog.onnx.importer import load_model

        try:
            session = ort.InferenceSession(load_model(model).SerializeToString(), options,
                                           providers=["CPUExecutionProvider"])
            row["ort_converted"] = True
        except Exception as e:  # noqa: BLE001 - reported
            row["error"] = f"onnxruntime: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
            return row
    row["ort_session_s"] = time.perf_counter() - start
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}

    try:
        ours = rep.run(inputs)  # warm-up: tracing, kernel compilation
    except Exception as e:  # noqa: BLE001 - reported
        row["error"] = f"run: {type(e).__name__}: {' '.join(str(e).split())[:200]}"
        return row
    theirs = session.run(None, feed)
    row["max_abs_diff"] = max(float(np.max(np.abs(np.asarray(a, np.float64)
                                                   - np.asarray(b, np.float64))))
                              if np.asarray(a).size else 0.0
                              for a, b in zip(ours, theirs))
    ours_t, theirs_t = [], []
    # Blocks of calls, the runtimes alternating block by block (so drift in the
    # machine's load hits both). Call by call, each runtime's thread pool,
    # still spinning after its call, took the cores from the other's next one
    # (AlexNet: mlxprog 37.8 ms against 17.5 alone); each block's first call
    # takes that, untimed.
    calls = ((lambda: rep.run(inputs), ours_t), (lambda: session.run(None, feed), theirs_t))
    for _ in range(rounds):
        for call, times in calls:
            call()
            times += [median_time(call, 1) for _ in range(runs)]
    row["mlxprog_ms"] = 1e3 * statistics.median(ours_t)
    row["ort_ms"] = 1e3 * statistics.median(theirs_t)
    row["mlxprog_min_ms"] = 1e3 * min(ours_t)
    row["ort_min_ms"] = 1e3 * min(theirs_t)
    row["ratio"] = row["mlxprog_ms"] / row["ort_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5,
                        help="timed calls per model, runtime and round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of one block of calls per runtime")
    parser.add_argument("--only", default="", help="regex on the model name (light/resnet50, "
                        "pytorch-converted/Conv2d, ...)")
    parser.add_argument("--threads", type=int, default=0,
                        help="onnxruntime intra-op threads (0: its default)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")

    rows = []
    for source in (light_models(), pytorch_converted_models()):
        for name, model, inputs in source:
            if args.only and not re.search(args.only, name):
                continue
            row = bench(name, model, inputs, args.runs, args.rounds, args.threads)
            rows.append(row)
            if "error" in row:
                print(f"{name:45s} skipped: {row['error']}", flush=True)
            else:
                print(f"{name:45s} mlxprog {row['mlxprog_ms']:9.3f} ms  onnxruntime "
                      f"{row['ort_ms']:9.3f} ms  ratio {row['ratio']:6.2f}  max|diff| "
                      f"{row['max_abs_diff']:.2e}  prepare {row['prepare_s']:.2f} s", flush=True)

    timed = [r for r in rows if "error" not in r]
    if timed:
        for group in ("light/", "pytorch-converted/"):
            ratios = [r["ratio"] for r in timed if r["model"].startswith(group)]
            if ratios:
                print(f"{group:20s} {len(ratios)} models, ratio median "
                      f"{statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})")
    skipped = [r for r in rows if "error" in r]
    print(f"{len(timed)} timed, {len(skipped)} skipped")
    converted = [r["model"] for r in timed if r.get("ort_converted")]
    if converted:
        print(f"onnxruntime ran {len(converted)} models converted to opset 13 (it does not "
              f"implement their original opset): {', '.join(converted)}")
    if args.markdown:
        print("\n| model | mlxprog (ms) | onnxruntime (ms) | ratio | best of each (ms) "
              "| max abs diff | prepare (s) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in timed:
            print(f"| {r['model']} | {r['mlxprog_ms']:.3f} | {r['ort_ms']:.3f} | "
                  f"{r['ratio']:.2f} | {r['mlxprog_min_ms']:.3f} / {r['ort_min_ms']:.3f} | "
                  f"{r['max_abs_diff']:.1e} | {r['prepare_s']:.2f} |")
        for r in skipped:
            print(f"| {r['model']} | — | — | — | — | not imported: {r['error']} | — |")


if __name__ == "__main__":
    main()
