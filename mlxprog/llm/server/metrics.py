"""The server's stats (the scheduler's and the embedder's) in Prometheus'
text exposition format (``GET /metrics``)."""

from __future__ import annotations

#: Prometheus metrics: stats key -> (metric name, type, help).
_METRICS = {
    "prefilling": ("mlxprog_rows_prefilling", "gauge", "Rows being prefilled."),
    "running": ("mlxprog_rows_decoding", "gauge", "Rows decoding in the batch."),
    "waiting": ("mlxprog_requests_waiting", "gauge", "Requests waiting for a row."),
    "max_batch": ("mlxprog_max_batch", "gauge", "Rows that may prefill or decode at once."),
    "max_waiting": ("mlxprog_max_waiting", "gauge", "Requests that may wait (then 503)."),
    "cached_tokens": ("mlxprog_cached_tokens", "gauge",
                      "Tokens in the batch's KV cache and the prompt cache."),
    "requests": ("mlxprog_requests_total", "counter", "Requests answered."),
    "prompt_tokens": ("mlxprog_prompt_tokens_total", "counter",
                      "Prompt tokens prefilled (not counting prompt-cache hits)."),
    "generated_tokens": ("mlxprog_generated_tokens_total", "counter", "Tokens generated."),
    "steps": ("mlxprog_decode_steps_total", "counter", "Decode steps run."),
    "cancelled": ("mlxprog_requests_cancelled_total", "counter",
                  "Requests whose clients went away."),
    "failures": ("mlxprog_failures_total", "counter", "Unexpected errors."),
    "generated_tokens_per_second": ("mlxprog_generated_tokens_per_second", "gauge",
                                    "Tokens generated per second over the last 10 s."),
    "active_memory_bytes": ("mlxprog_mlx_active_memory_bytes", "gauge",
                            "Bytes of MLX arrays alive."),
    "cache_memory_bytes": ("mlxprog_mlx_cache_memory_bytes", "gauge",
                           "Bytes of freed buffers MLX keeps for reuse."),
    "embedding_waiting": ("mlxprog_embedding_requests_waiting", "gauge",
                          "Embedding requests waiting for the embedder."),
    "embedding_running": ("mlxprog_embedding_requests_running", "gauge",
                          "Embedding requests being embedded (0 or 1)."),
    "embedding_requests": ("mlxprog_embedding_requests_total", "counter",
                           "Embedding requests answered."),
    "embedding_tokens": ("mlxprog_embedding_tokens_total", "counter", "Input tokens embedded."),
    "embedding_failures": ("mlxprog_embedding_failures_total", "counter",
                           "Unexpected errors while embedding."),
}


def prometheus_text(stats: dict[str, float], ready: bool) -> str:
    """``stats`` (the server's: the scheduler's and the embedder's) and
    whether the server is ready, in Prometheus' text exposition format."""
    lines = ["# HELP mlxprog_ready Whether the server serves (1) or builds its programs (0).",
             "# TYPE mlxprog_ready gauge", f"mlxprog_ready {int(ready)}"]
    for key, (name, kind, text) in _METRICS.items():
        value = stats[key]  # counts exact (a float's 6 digits would round them)
        shown = str(value) if isinstance(value, int) else f"{value:.6g}"
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {shown}"]
    return "\n".join(lines) + "\n"
