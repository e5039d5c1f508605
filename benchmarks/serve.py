"""The server on SmolLM2-135M-Instruct (Q4_1 GGUF): continuous batching
against one generation at a time, and the prompt cache on a chat's next turn.

- **Throughput.** The server (``mlxprog.llm.server.Server``, started in this
  process on a free loopback port) gets ``C`` concurrent clients (``C`` = 1,
  4, 8 by default), each an ``openai`` client in its own thread sending
  ``--requests`` chat requests one after another: distinct prompts that ask
  for long answers, greedy, ``--max-tokens`` tokens at most. Requests/s and
  generated tokens/s (counted from each answer's ``usage``) are taken over
  the wall time of the whole round. The same prompts then go through
  ``LLM.generate`` one after another (a second copy of the model, in this
  process, with the server idle): the sequential baseline of the same
  requests. Before each timed round an untimed one of the same shape traces
  the programs for its batch sizes and cache widths. The server's prompt
  cache is off here (``--prompt-cache-size 0``), so that every request
  prefills its whole prompt, as the baseline does; give a size to see both
  effects together.
- **Next chat turn.** A conversation of 1 and of ``--long-turns`` turns
  (each reply greedy, ``--max-tokens`` tokens), then one more user message:
  the time to first token of that turn with a prompt cache that holds the
  conversation so far (``cache = llm.prompt_cache()``, every turn generated
  with ``prompt_cache=cache``, as a chat does), against the same prompt from
  scratch; medians of ``--runs`` runs after one untimed run. The cached
  turn prefills only its new tokens, so its TTFT should not grow with the
  history.

    python benchmarks/serve.py [--clients 1,4,8] [--requests 2] [--max-tokens 64]
                               [--runs 3] [--long-turns 4] [--prompt-cache-size 0]

Two more modes run ``mlxprog serve`` as a subprocess (``python -m mlxprog
serve``, its stderr in a temporary log file), so that its memory can be read
from ``/proc/PID/status``:

- **Mixed load** (``--mixed SECONDS``). For a fixed time, against the
  server: ``--chat-clients`` clients sending short chat requests back to
  back (streamed, greedy, ``--chat-tokens`` tokens at most), ``--long-clients``
  clients sending ~``--long-prompt-tokens``-token prompts to
  ``/v1/completions`` (streamed, each prompt different, so that no prefix
  cache helps), and ``--drop-clients`` clients that close their stream after
  ``--drop-after`` chunks (deliberate disconnects, counted apart from the
  errors); together more clients than ``--mixed-max-batch``. A client starts
  no request after the deadline; the run ends when the last one has
  finished. Then the same against llama-cpp-python's server (``python -m
  llama_cpp.server --n_threads 2 --interrupt_requests False``, on the same
  GGUF) when ``--llama-python``'s interpreter (default: this one) can import
  ``llama_cpp.server.app``. Per server: requests completed by kind, errors,
  p50/p99 time to the first chunk with text of the short chats (and p50 of
  the long prompts), the longest gap between two chunks of a short chat,
  generated tokens/s over the whole run (the chunks with text received, a
  token each, the disconnected streams' included), the peak RSS
  (``VmHWM``), and ``VmRSS`` (sampled every second) at the end of the
  warm-up (the first ``--warmup`` seconds of the load) against at the end
  of the load.
- **Single stream** (``--single``). One client streams a greedy 128-token
  (``--single-tokens``) chat answer from the server; its tokens/s is taken
  from the first chunk to the last (chunks - 1 over that time). Between
  two streams, with the server idle, ``LLM.generate`` of the same prompt in
  this process gives ``stats.decode_tps`` (the same measure); medians of
  ``--runs`` such rounds after an untimed one, printed with the ratio
  (target: at least 0.9x). llama-cpp-python's server's stream is shown
  beside them when it is available.

    python benchmarks/serve.py --mixed 120 [--mixed-max-batch 4] [--chat-clients 6]
                               [--long-clients 2] [--drop-clients 2] [--warmup 30]
                               [--llama-python PATH]
    python benchmarks/serve.py --single [--runs 3] [--single-tokens 128]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from mlxprog.llm import LLM, PromptCache, load
from mlxprog.llm.gguf import load_gguf
from mlxprog.llm.model_files import default_model_path
from mlxprog.llm.server import Server

TOPICS = [
    "a robot who learns to paint", "the history of the Roman Empire", "how a bicycle works",
    "a journey across the Sahara", "the life cycle of a star", "a lighthouse keeper's year",
    "how bread is baked", "the first voyage to the Moon", "a city under the sea",
    "the invention of the printing press", "a dragon who is afraid of fire",
    "how rivers shape valleys", "a detective in Victorian London", "the migration of whales",
    "building a cathedral in the Middle Ages", "a chess match against a computer",
]

CHAT_TURNS = [
    "Tell me about the history of Rome.", "What about its emperors?",
    "Which one was the most famous?", "How did the empire end?", "What came after it?",
    "Summarise everything so far in one sentence.",
]


def prompt(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a long, detailed essay about {TOPICS[i]}."}]


def server_round(url: str, clients: int, requests: int, max_tokens: int,
                 offset: int = 0) -> tuple[float, int, int]:
    """``clients`` threads sending ``requests`` requests each; wall seconds,
    requests answered, tokens generated."""

    def client_work(c: int) -> int:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                               timeout=3600)
        tokens = 0
        for r in range(requests):
            messages = prompt((offset + c * requests + r) % len(TOPICS))
            reply = client.chat.completions.create(model="bench", messages=messages,
                                                   max_tokens=max_tokens, temperature=0)
            tokens += reply.usage.completion_tokens
        return tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        tokens = sum(pool.map(client_work, range(clients)))
    return time.perf_counter() - start, clients * requests, tokens


def sequential(llm: LLM, n: int, max_tokens: int) -> list[tuple[float, int]]:
    """``LLM.generate`` of the first ``n`` prompts one after another: seconds
    and generated tokens of each."""
    out = []
    for i in range(n):
        start = time.perf_counter()
        result = llm.generate(prompt(i % len(TOPICS)), max_tokens=max_tokens)
        out.append((time.perf_counter() - start, result.stats.generated_tokens))
    return out


def throughput(args: argparse.Namespace, server_llm: LLM, llm: LLM) -> list[str]:
    clients = [int(c) for c in args.clients.split(",")]
    n = max(clients) * args.requests
    print(f"sequential: {n} x LLM.generate ...", file=sys.stderr, flush=True)
    sequential(llm, 1, args.max_tokens)  # trace the programs
    each = sequential(llm, n, args.max_tokens)
    server = Server(server_llm, model_id="bench", max_batch=max(8, max(clients)),
                    prompt_cache_size=args.prompt_cache_size)
    url = server.start()
    rows = []
    try:
        for c in clients:
            print(f"server: {c} client(s) ...", file=sys.stderr, flush=True)
            # Untimed: the same shapes (batch sizes, cache widths), other prompts.
            server_round(url, c, 1, args.max_tokens, offset=len(TOPICS) // 2)
            server.scheduler.largest_batch = 0
            seconds, done, tokens = server_round(url, c, args.requests, args.max_tokens)
            seq_seconds = sum(s for s, _ in each[:done])
            seq_tokens = sum(t for _, t in each[:done])
            rows.append((c, done, tokens, seconds, seq_tokens, seq_seconds,
                         server.scheduler.largest_batch))
    finally:
        server.stop()
    base = rows[0][2] / rows[0][3]
    lines = [
        f"Throughput: greedy chat requests of at most {args.max_tokens} tokens, "
        f"{args.requests} per client, server prompt cache size {args.prompt_cache_size}",
        "",
        "| clients | requests | tokens | largest batch | server s | server req/s | server tok/s "
        "| sequential s | sequential tok/s | server / sequential | tok/s vs 1 client |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c, done, tokens, seconds, seq_tokens, seq_seconds, largest in rows:
        tps, seq_tps = tokens / seconds, seq_tokens / seq_seconds
        lines.append(f"| {c} | {done} | {tokens} | {largest} | {seconds:.1f} | "
                     f"{done / seconds:.2f} | {tps:.1f} | {seq_seconds:.1f} | {seq_tps:.1f} | "
                     f"{tps / seq_tps:.2f}x | {tps / base:.2f}x |")
    four = [r for r in rows if r[0] == 4]
    if four and rows[0][0] == 1:
        ratio = four[0][2] / four[0][3] / base
        lines += ["", f"target: 4 clients at least 2.5x one client's tokens/s: "
                  f"{'met' if ratio >= 2.5 else 'MISSED'} ({ratio:.2f}x)"]
    return lines


def ttft_rows(args: argparse.Namespace, llm: LLM) -> list[str]:
    lines = [
        "", f"Next chat turn: TTFT with the conversation in a prompt cache vs from scratch "
        f"(medians of {args.runs} runs; replies of at most {args.max_tokens} tokens)", "",
        "| turns before | prompt tokens | cached tokens | TTFT cached (s) | TTFT scratch (s) "
        "| scratch / cached |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for turns in (1, args.long_turns):
        print(f"chat: turn {turns + 1} ...", file=sys.stderr, flush=True)
        # The conversation, as a chat builds it: every turn through one cache.
        cache = llm.prompt_cache()
        messages: list[dict[str, str]] = []
        for text in CHAT_TURNS[:turns]:
            messages.append({"role": "user", "content": text})
            reply = llm.generate(messages, prompt_cache=cache, max_tokens=args.max_tokens)
            messages.append({"role": "assistant", "content": reply.text})
        history = (list(cache.tokens), cache.caches)
        messages.append({"role": "user", "content": CHAT_TURNS[turns]})
        cached, scratch, stats = [], [], None
        for run in range(args.runs + 1):  # the first run traces the programs
            copy = PromptCache(llm.cache_layout, *history)
            stats = llm.generate(messages, prompt_cache=copy, max_tokens=1).stats
            fresh = llm.generate(messages, max_tokens=1).stats
            if run:
                cached.append(stats.ttft)
                scratch.append(fresh.ttft)
        c, s = statistics.median(cached), statistics.median(scratch)
        lines.append(f"| {turns} | {stats.prompt_tokens} | {stats.cached_tokens} | {c:.3f} | "
                     f"{s:.3f} | {s / c:.1f}x |")
    return lines


# -- mlxprog serve and llama-cpp-python's server as subprocesses -------------

@dataclass
class Proc:
    """A server started as a subprocess: its name, process, URL and log."""

    name: str
    process: subprocess.Popen
    url: str
    log: Path
    command: list[str]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def llama_available(python: str) -> str | None:
    """None if ``python`` can run llama-cpp-python's server; else why not."""
    try:
        result = subprocess.run([python, "-c", "import llama_cpp.server.app"],
                                capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if result.returncode:
        lines = result.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit {result.returncode}"
    return None


def server_command(kind: str, model: str, port: int, max_batch: int | None,
                   llama_python: str) -> list[str]:
    if kind == "mlxprog":
        batch = [] if max_batch is None else ["--max-batch", str(max_batch)]
        return [sys.executable, "-m", "mlxprog", "serve", "-m", model, "--port", str(port),
                *batch]
    return [llama_python, "-m", "llama_cpp.server", "--model", model, "--n_threads", "2",
            "--n_threads_batch", "2", "--n_ctx", "2048", "--port", str(port),
            "--interrupt_requests", "False", "--verbose", "False"]


def start_server(kind: str, model: str, max_batch: int | None, llama_python: str,
                 timeout: float = 900.0) -> Proc:
    """Start a server and wait until it answers (mlxprog: ``/health`` ok,
    its programs built; llama-cpp-python: ``/v1/models``)."""
    port = free_port()
    command = server_command(kind, model, port, max_batch, llama_python)
    log = Path(tempfile.mkstemp(prefix=f"serve-{kind}-", suffix=".log")[1])
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    probe = url + ("/health" if kind == "mlxprog" else "/v1/models")
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{kind} server exited ({process.returncode}) while starting; "
                               f"log: {log}\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(probe, timeout=5) as answer:
                if answer.status == 200:
                    return Proc(kind, process, url, log, command)
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            stop_server(Proc(kind, process, url, log, command))
            raise RuntimeError(f"{kind} server not ready after {timeout:.0f} s; log: {log}")
        time.sleep(0.5)


def stop_server(proc: Proc) -> None:
    """SIGINT (both servers stop gracefully on it), then SIGKILL if needed."""
    if proc.process.poll() is None:
        proc.process.send_signal(signal.SIGINT)
        try:
            proc.process.wait(30)
        except subprocess.TimeoutExpired:
            proc.process.kill()
            proc.process.wait()


def memory_kb(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a process, in kB (empty once it has gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


class RSSSampler(threading.Thread):
    """``VmRSS`` of a process every ``period`` seconds: (seconds, kB)."""

    def __init__(self, pid: int, period: float = 1.0):
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.samples: list[tuple[float, int]] = []
        self.start_time = time.perf_counter()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            rss = memory_kb(self.pid).get("VmRSS")
            if rss is not None:
                self.samples.append((time.perf_counter() - self.start_time, rss))
            self.done.wait(self.period)

    def at(self, seconds: float) -> int:
        return self.at_samples(self.samples, seconds)

    @staticmethod
    def at_samples(samples: list[tuple[float, int]], seconds: float) -> int:
        """The last sample at or before ``seconds`` (the first if none)."""
        before = [rss for t, rss in samples if t <= seconds]
        return before[-1] if before else samples[0][1]


# -- the mixed load ------------------------------------------------------------

WORDS = ("river stone lantern harvest copper meadow signal orchard thunder village market "
         "winter garden bridge engine silver canyon harbor forest candle").split()

SHORT_CHATS = [
    "What is the capital of France?", "Name three primary colours.",
    "Give me a synonym for happy.", "How many legs does a spider have?",
    "What is 12 times 7?", "Say hello in Spanish.", "What colour is the sky on a clear day?",
    "Name a fruit that is yellow.", "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?", "What is the opposite of cold?",
    "Name a planet in our solar system.",
]


def long_prompt(index: int, tokens: int, tokenizer: Any) -> str:
    """A text of about ``tokens`` tokens, different for every ``index``:
    numbered records, then a question about them."""
    rng = random.Random(index)
    records, count, i = [f"Log book {index}."], 0, 0
    tail = "\n\nQuestion: which record mentions the most steps? Answer:"
    budget = tokens - len(tokenizer.encode(tail + records[0]))
    while True:
        record = (f"Record {i}: the {rng.choice(WORDS)} near the {rng.choice(WORDS)} was "
                  f"{rng.randint(1, 999)} steps from the {rng.choice(WORDS)}.")
        n = len(tokenizer.encode(" " + record, add_special_tokens=False))
        if count + n > budget:
            break
        records.append(record)
        count, i = count + n, i + 1
    return " ".join(records) + tail


@dataclass
class Outcome:
    """One request of the mixed load."""

    kind: str  # "chat", "long", "drop"
    start: float
    end: float = 0.0
    ttft: float | None = None  # first chunk with text
    chunks: int = 0  # chunks with text
    max_gap: float = 0.0  # the longest wait between two chunks with text
    error: str | None = None
    dropped: bool = False


def stream_request(client: openai.OpenAI, kind: str, body: dict[str, Any],
                   close_after: int | None, t0: float) -> Outcome:
    out = Outcome(kind, time.perf_counter() - t0)
    last = None
    try:
        if kind == "long":
            stream = client.completions.create(stream=True, **body)
        else:
            stream = client.chat.completions.create(stream=True, **body)
        try:
            for chunk in stream:
                if not chunk.choices:
                    continue
                choice = chunk.choices[0]
                text = choice.text if kind == "long" else choice.delta.content
                if not text:
                    continue
                now = time.perf_counter() - t0
                if last is None:
                    out.ttft = now - out.start
                else:
                    out.max_gap = max(out.max_gap, now - last)
                last = now
                out.chunks += 1
                if close_after is not None and out.chunks >= close_after:
                    out.dropped = True
                    break
        finally:
            stream.close()
        if close_after is not None and not out.dropped:
            out.error = f"stream ended after {out.chunks} chunks, before the disconnect"
        elif out.chunks == 0:
            out.error = "no text"
    except Exception as e:  # noqa: BLE001 - every failure is counted
        out.error = f"{type(e).__name__}: {e}"[:300]
    out.end = time.perf_counter() - t0
    return out


def mixed_load(proc: Proc, args: argparse.Namespace, prompts: list[str]) -> dict[str, Any]:
    """The mixed load against one server for ``args.mixed`` seconds."""
    load_before = os.getloadavg()[0]
    sampler = RSSSampler(proc.process.pid)
    sampler.start()
    t0 = sampler.start_time
    deadline = args.mixed
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    counter, long_counter = iter(range(10 ** 9)), iter(range(10 ** 9))

    def client_work(kind: str, c: int) -> None:
        client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0,
                               timeout=args.request_timeout)
        while time.perf_counter() - t0 < deadline:
            n = next(long_counter if kind == "long" else counter)
            if kind == "long":
                body = {"model": "bench", "prompt": prompts[n % len(prompts)],
                        "max_tokens": args.long_tokens, "temperature": 0}
            else:
                question = SHORT_CHATS[n % len(SHORT_CHATS)]
                body = {"model": "bench", "temperature": 0,
                        "max_tokens": args.drop_tokens if kind == "drop" else args.chat_tokens,
                        "messages": [{"role": "user", "content": f"({n}) {question}"}]}
            out = stream_request(client, kind, body,
                                 args.drop_after if kind == "drop" else None, t0)
            with lock:
                outcomes.append(out)
            if out.error is not None:
                time.sleep(0.5)  # no tight loop against a failing server

    kinds = (["chat"] * args.chat_clients + ["long"] * args.long_clients
             + ["drop"] * args.drop_clients)
    with ThreadPoolExecutor(len(kinds)) as pool:
        futures = [pool.submit(client_work, kind, c) for c, kind in enumerate(kinds)]
        warm_rss = None
        while not all(f.done() for f in futures):
            if warm_rss is None and time.perf_counter() - t0 >= args.warmup:
                warm_rss = memory_kb(proc.process.pid).get("VmRSS")
            time.sleep(0.2)
        for f in futures:
            f.result()
    wall = time.perf_counter() - t0
    end_mem = memory_kb(proc.process.pid)
    sampler.done.set()
    sampler.join()
    after = [rss for t, rss in sampler.samples if t >= args.warmup]
    return {"outcomes": outcomes, "wall": wall, "peak_kb": end_mem.get("VmHWM", 0),
            "warm_kb": warm_rss or sampler.at(args.warmup), "end_kb": end_mem.get("VmRSS", 0),
            "max_after_kb": max(after) if after else 0, "samples": sampler.samples,
            "alive": proc.process.poll() is None, "load": (load_before, os.getloadavg()[0])}


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; nan if none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(math.ceil(q / 100 * len(ordered))) - 1))]


def mixed(args: argparse.Namespace) -> list[str]:
    model = args.model or str(default_model_path())
    tokenizer = load_gguf(model).tokenizer
    # Enough for a long run; each long request takes the next one.
    prompts = [long_prompt(i, args.long_prompt_tokens, tokenizer) for i in range(256)]
    long_tokens = statistics.median(len(tokenizer.encode(p)) for p in prompts)
    kinds = ["mlxprog"]
    why_not = llama_available(args.llama_python)
    if why_not is None:
        kinds.append("llama-cpp-python")
    clients = args.chat_clients + args.long_clients + args.drop_clients
    results, commands = {}, {}
    for kind in kinds:
        print(f"mixed: starting {kind} ...", file=sys.stderr, flush=True)
        proc = start_server(kind, model, args.mixed_max_batch, args.llama_python)
        commands[kind] = proc.command
        try:
            print(f"mixed: {kind}: {clients} clients for {args.mixed} s ...", file=sys.stderr,
                  flush=True)
            results[kind] = mixed_load(proc, args, prompts)
        finally:
            stop_server(proc)
        print(f"mixed: {kind}: log {proc.log}", file=sys.stderr, flush=True)
    lines = [
        f"Mixed load for {args.mixed} s per server: {args.chat_clients} short-chat clients "
        f"(streamed, at most {args.chat_tokens} tokens), {args.long_clients} long-prompt "
        f"clients (/v1/completions, {long_tokens:.0f}-token prompts, {args.long_tokens} "
        f"tokens), {args.drop_clients} clients closing their stream after {args.drop_after} "
        f"chunks; {clients} clients, max batch {args.mixed_max_batch} (mlxprog); "
        f"warm-up: the first {args.warmup:g} s", "",
        "| server | chats | long | disconnects | errors | chat TTFT p50 (s) | chat TTFT p99 (s) "
        "| long TTFT p50 (s) | longest chat gap (s) | tokens | tok/s | peak RSS (MB) "
        "| RSS after warm-up (MB) | RSS at end (MB) | growth (MB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: |",
    ]
    notes = []
    for kind, r in results.items():
        outs = r["outcomes"]
        ok = [o for o in outs if o.error is None]
        done = {k: sum(o.kind == k for o in ok) for k in ("chat", "long", "drop")}
        errors = [o for o in outs if o.error is not None]
        chat_ttft = [o.ttft for o in ok if o.kind == "chat"]
        long_ttft = [o.ttft for o in ok if o.kind == "long"]
        gaps = [o.max_gap for o in ok if o.kind == "chat"]
        tokens = sum(o.chunks for o in outs)
        mb = lambda kb: kb / 1024  # noqa: E731
        lines.append(
            f"| {kind} | {done['chat']} | {done['long']} | {done['drop']} | {len(errors)} | "
            f"{percentile(chat_ttft, 50):.3f} | {percentile(chat_ttft, 99):.3f} | "
            f"{percentile(long_ttft, 50):.3f} | {max(gaps, default=float('nan')):.2f} | "
            f"{tokens} | {tokens / r['wall']:.1f} | {mb(r['peak_kb']):.0f} | "
            f"{mb(r['warm_kb']):.0f} | {mb(r['end_kb']):.0f} | "
            f"{mb(r['end_kb'] - r['warm_kb']):+.0f} |")
        kinds_seen: dict[str, int] = {}
        for o in errors:
            kinds_seen[o.error] = kinds_seen.get(o.error, 0) + 1
        for error, n in sorted(kinds_seen.items(), key=lambda e: -e[1])[:5]:
            notes.append(f"- {kind}: {n} x {error}")
        samples = r["samples"]
        if samples:
            marks = sorted({t for t in (args.warmup, *(args.mixed * q / 4 for q in range(1, 5)))
                            if args.warmup <= t <= samples[-1][0]})
            trace = ", ".join(f"{t:.0f} s {r_kb / 1024:.0f}" for t, r_kb in
                              ((t, RSSSampler.at_samples(samples, t)) for t in marks))
            notes.append(f"- {kind}: RSS (MB) at {trace}; highest after the warm-up "
                         f"{mb(r['max_after_kb']):.0f}; wall {r['wall']:.1f} s (the last "
                         f"requests finish after the deadline); the machine's 1-minute load "
                         f"average {r['load'][0]:.1f} before, {r['load'][1]:.1f} at the end"
                         + ("" if r["alive"] else "; THE SERVER DIED"))
    lines += ["", "Commands:", ""]
    lines += [f"- {kind}: `{' '.join(shlex.quote(a) for a in cmd)}`"
              for kind, cmd in commands.items()]
    if why_not is not None:
        lines.append(f"- llama-cpp-python's server: not run ({args.llama_python}: {why_not})")
    if notes:
        lines += [""] + notes
    return lines


# -- one stream against LLM.generate ---------------------------------------------

SINGLE_PROMPT = [{"role": "user", "content": "Write a long, detailed essay about the history "
                  "of the Roman Empire."}]


def stream_tps(url: str, tokens: int) -> tuple[float, int, str | None]:
    """One streamed greedy chat answer: (chunks - 1) over the time from the
    first chunk with text to the last; chunks; finish reason."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    times, finish = [], None
    stream = client.chat.completions.create(model="bench", messages=SINGLE_PROMPT, stream=True,
                                            max_tokens=tokens, temperature=0)
    for chunk in stream:
        if not chunk.choices:
            continue
        if chunk.choices[0].delta.content:
            times.append(time.perf_counter())
        finish = chunk.choices[0].finish_reason or finish
    return (len(times) - 1) / (times[-1] - times[0]), len(times), finish


def single(args: argparse.Namespace) -> list[str]:
    model = args.model or str(default_model_path())
    kinds = ["mlxprog"]
    why_not = llama_available(args.llama_python)
    if why_not is None:
        kinds.append("llama-cpp-python")
    llm = load(model)
    procs = {}
    try:
        for kind in kinds:
            print(f"single: starting {kind} ...", file=sys.stderr, flush=True)
            procs[kind] = start_server(kind, model, args.single_max_batch, args.llama_python)
        commands = {kind: proc.command for kind, proc in procs.items()}
        # Interleaved, the first round untimed: each server's stream, then
        # LLM.generate (the servers idle meanwhile), so that a change in the
        # machine's load falls on all of them.
        streamed: dict[str, list] = {kind: [] for kind in kinds}
        runs = []
        for run in range(args.runs + 1):
            print(f"single: round {run} ...", file=sys.stderr, flush=True)
            for kind, proc in procs.items():
                result = stream_tps(proc.url, args.single_tokens)
                if run:
                    streamed[kind].append(result)
            stats = llm.generate(SINGLE_PROMPT, max_tokens=args.single_tokens,
                                 temperature=0).stats
            if run:
                runs.append(stats)
    finally:
        for proc in procs.values():
            stop_server(proc)
    direct = statistics.median(s.decode_tps for s in runs)
    lines = [
        f"Single stream: one client, a greedy chat answer of {args.single_tokens} tokens, "
        f"tok/s from the first chunk to the last (medians of {args.runs} runs after one "
        "untimed)", "",
        "| what | tokens | tok/s | each run | / LLM.generate |",
        "| --- | ---: | ---: | --- | ---: |",
        f"| LLM.generate (in process), stats.decode_tps | "
        f"{statistics.median(s.generated_tokens for s in runs):.0f} | {direct:.1f} | "
        f"{', '.join(f'{s.decode_tps:.1f}' for s in runs)} | 1.00x |",
    ]
    for kind, rs in streamed.items():
        tps = statistics.median(r[0] for r in rs)
        lines.append(f"| {kind} server, streamed | {statistics.median(r[1] for r in rs):.0f} | "
                     f"{tps:.1f} | {', '.join(f'{r[0]:.1f}' for r in rs)} | "
                     f"{tps / direct:.2f}x |")
    ratio = statistics.median(r[0] for r in streamed["mlxprog"]) / direct
    lines += ["", f"target: the mlxprog server's stream at least 0.9x LLM.generate's decode "
              f"tok/s: {'met' if ratio >= 0.9 else 'MISSED'} ({ratio:.2f}x)", "", "Commands:", ""]
    lines += [f"- {kind}: `{' '.join(shlex.quote(a) for a in cmd)}`"
              for kind, cmd in commands.items()]
    if why_not is not None:
        lines.append(f"- llama-cpp-python's server: not run ({args.llama_python}: {why_not})")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,8", help="concurrent clients per round")
    parser.add_argument("--requests", type=int, default=2, help="requests per client")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per answer, at most")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each TTFT")
    parser.add_argument("--long-turns", type=int, default=4,
                        help="turns of the longer conversation (at most 5)")
    parser.add_argument("--prompt-cache-size", type=int, default=0,
                        help="the server's prompt cache in the throughput rounds")
    parser.add_argument("--model", default=None, metavar="GGUF",
                        help="--mixed, --single: the GGUF file (default: SmolLM2-135M)")
    parser.add_argument("--mixed", type=float, default=None, metavar="SECONDS",
                        help="run the mixed load for SECONDS against each server instead")
    parser.add_argument("--mixed-max-batch", type=int, default=4, metavar="N",
                        help="--mixed: mlxprog serve's --max-batch")
    parser.add_argument("--chat-clients", type=int, default=6, help="short-chat clients")
    parser.add_argument("--chat-tokens", type=int, default=32,
                        help="tokens of a short chat answer, at most")
    parser.add_argument("--long-clients", type=int, default=2, help="long-prompt clients")
    parser.add_argument("--long-prompt-tokens", type=int, default=1500,
                        help="tokens of a long prompt, about")
    parser.add_argument("--long-tokens", type=int, default=32,
                        help="tokens of a long prompt's answer, at most")
    parser.add_argument("--drop-clients", type=int, default=2,
                        help="clients that disconnect mid-stream")
    parser.add_argument("--drop-after", type=int, default=3,
                        help="chunks a disconnecting client reads before closing")
    parser.add_argument("--drop-tokens", type=int, default=256,
                        help="max_tokens of a request that the client disconnects from")
    parser.add_argument("--warmup", type=float, default=None, metavar="SECONDS",
                        help="the mixed load's warm-up (default: 30 s, at most a quarter "
                        "of the run)")
    parser.add_argument("--request-timeout", type=float, default=900.0,
                        help="the clients' timeout of one request, in seconds")
    parser.add_argument("--llama-python", default=sys.executable, metavar="PATH",
                        help="the Python that runs llama-cpp-python's server (default: "
                        "this one); skipped where it cannot import llama_cpp.server.app")
    parser.add_argument("--single", action="store_true",
                        help="compare one client's stream with LLM.generate instead")
    parser.add_argument("--single-tokens", type=int, default=128,
                        help="--single: tokens of the answer")
    parser.add_argument("--single-max-batch", type=int, default=None, metavar="N",
                        help="--single: mlxprog serve's --max-batch (default: its default)")
    args = parser.parse_args()
    if args.mixed is not None:
        if args.warmup is None:
            args.warmup = min(30.0, args.mixed / 4)
        print("\n".join(mixed(args)))
        return
    if args.single:
        print("\n".join(single(args)))
        return
    path = default_model_path()
    # Two copies: the server's (used from its scheduler thread) and the baseline's.
    server_llm, llm = load(path), load(path)
    lines = throughput(args, server_llm, llm) + ttft_rows(args, llm)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
