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
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai

from mlxprog.llm import LLM, PromptCache, default_model_path, load
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
    args = parser.parse_args()
    path = default_model_path()
    # Two copies: the server's (used from its scheduler thread) and the baseline's.
    server_llm, llm = load(path), load(path)
    lines = throughput(args, server_llm, llm) + ttft_rows(args, llm)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
