"""An outside check of the real SmolLM2-135M-Instruct GGUF (Q4_1): mlxprog's
greedy tokens against llama.cpp's.

The expected ids in ``tests/data/smollm2_llama_cpp_greedy.json`` were made
once by llama.cpp through llama-cpp-python 0.3.36 (libllama 0.5.0-dev,
ggml 0.25.3, llama.cpp commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f as
vendored in that release's sdist; a CPU build, AVX2/FMA/F16C, no AVX-512),
with llama-cpp-python's defaults otherwise (f16 KV cache, no flash
attention), 2 threads, greedy (``temp=0``, ``top_k=1``, no repeat
penalty), raw completion without the chat template, fed the same prompt ids
that mlxprog's ``generate(prompt, chat=False)`` feeds: ``encode(prompt)``,
no BOS (the file's ``tokenizer.ggml.add_bos_token`` is false; llama.cpp's
own tokenization, recorded in the file, gives the same ids). The file says
all of that too. Regenerate it (only when the model file or the prompts
change) with ``python tests/llm/test_smollm_outside_check.py --regenerate``.

What the comparison found, and what the tests check:

- llama.cpp's logits and mlxprog's differ by up to about 1-2 over the
  vocabulary at each step, in both numerics (llama.cpp's own choice of KV
  cache type moves its logits by up to ~0.8 on this model). So where two
  candidate tokens are within a few tenths of a logit, either side may pick
  either one, and the two greedy continuations part there for good.
- ``test_greedy_tokens_agree_with_llama_cpp``: mlxprog's greedy tokens equal
  llama.cpp's for the first ``agree[numerics]`` tokens of each prompt: the
  leading tokens where the two agree *robustly*, every step's top-2 gap in
  mlxprog's logits being at least :data:`ROBUST_GAP` (recorded by the
  regeneration; they part at a near tie right after).
- ``test_llama_cpp_tokens_are_mlxprog_greedy_or_near_ties``: fed
  llama.cpp's whole continuation (teacher forcing), every token llama.cpp
  picked is mlxprog's top token or within :data:`NEAR_TIE` logits of it.
  This checks all of llama.cpp's tokens, past the point where the greedy
  runs part.
- ``numerics="int8"`` (llama.cpp-style 8-bit activations in the decode
  steps) does not follow llama.cpp measurably further than ``"exact"``
  here: its rounding is not llama.cpp's bit for bit (llama.cpp keeps each
  Q8_1 block's scale ``d`` and ``d * sum(q)`` in float16, mlxprog in
  float32; llama.cpp's K/V cache is float16, mlxprog's float32).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for --regenerate

from family_checks import program_logits  # noqa: E402
from llm_fixtures import smollm_path  # noqa: E402

from mlxprog.llm import LLM, load  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "smollm2_llama_cpp_greedy.json"
PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "Once upon a time, in a small village,"]
#: llama.cpp's greedy tokens recorded per prompt.
N_TOKENS = 32
MAX_LENGTH = 64
#: A llama.cpp token within this many logits of mlxprog's top one is a near
#: tie (the largest seen when the file was made: 0.22).
NEAR_TIE = 0.5
#: The smallest top-2 gap (mlxprog's logits) at which agreement counts as robust.
ROBUST_GAP = 0.1


def teacher_forced_logits(llm: LLM, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """mlxprog's logits after ``prompt`` and after each token of
    ``continuation``, with the numerics ``llm.generate`` runs."""
    return program_logits(llm, prompt, continuation, max_length=MAX_LENGTH)


def robust_agreement(ours: list[int], theirs: list[int], logits: np.ndarray) -> int:
    """How many leading tokens ``ours`` and ``theirs`` share with every one
    of them at least :data:`ROBUST_GAP` ahead of the runner-up in ``logits``
    (ours, teacher-forced on ``theirs``)."""
    top2 = np.sort(logits, axis=-1)[:, -2:]
    n = 0
    while (n < min(len(ours), len(theirs)) and ours[n] == theirs[n]
           and top2[n, 1] - top2[n, 0] >= ROBUST_GAP):
        n += 1
    return n


# -- the tests ------------------------------------------------------------------

@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(DATA.read_text())


@pytest.fixture(scope="module", params=["exact", "int8"])
def llm(request) -> LLM:
    llm = load(smollm_path(), max_length=MAX_LENGTH, numerics=request.param)
    if llm.numerics != request.param:
        pytest.skip(f"numerics {request.param!r} unavailable here (got {llm.numerics!r})")
    return llm


def test_the_recorded_model_file_is_the_installed_one(expected):
    path = smollm_path()
    assert path.name == expected["model"]["file"]
    assert path.stat().st_size == expected["model"]["bytes"]


def test_prompt_ids_are_llama_cpp_tokenization(llm, expected):
    for case in expected["cases"]:
        assert llm.tokenizer.encode(case["prompt"]) == case["prompt_ids"], case["prompt"]


def test_greedy_tokens_agree_with_llama_cpp(llm, expected):
    for case in expected["cases"]:
        n = case["agree"][llm.numerics]
        assert n >= 5, case  # every prompt agrees on at least its first five tokens
        out = llm.generate(case["prompt_ids"], max_tokens=n, chat=False)
        assert out.tokens == case["llama_cpp_ids"][:n], (case["prompt"], llm.numerics)


def test_llama_cpp_tokens_are_mlxprog_greedy_or_near_ties(llm, expected):
    for case in expected["cases"]:
        theirs = case["llama_cpp_ids"]
        logits = teacher_forced_logits(llm, case["prompt_ids"], theirs[:-1])
        behind = logits.max(axis=-1) - logits[np.arange(len(theirs)), theirs]
        assert behind.max() <= NEAR_TIE, (case["prompt"], llm.numerics,
                                          [(i, round(float(b), 3)) for i, b in enumerate(behind)
                                           if b > 0])


# -- regenerating the expected ids ------------------------------------------------

def regenerate() -> None:
    """Run llama.cpp (llama-cpp-python) and write :data:`DATA`; the
    ``agree`` counts come from mlxprog's runs of the same prompts."""
    import importlib.metadata
    import os

    import llama_cpp

    path = smollm_path()
    threads = 2
    cpp = llama_cpp.Llama(model_path=str(path), n_ctx=MAX_LENGTH * 2, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    ours = {n: load(path, max_length=MAX_LENGTH, numerics=n) for n in ("exact", "int8")}
    cases = []
    for prompt in PROMPTS:
        ids = ours["exact"].tokenizer.encode(prompt)
        cpp_ids = cpp.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        assert cpp_ids == ids, (prompt, cpp_ids, ids)
        cpp.reset()
        theirs = []
        for token in cpp.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                                  repeat_penalty=1.0, reset=True):
            theirs.append(int(token))
            if len(theirs) == N_TOKENS or token == cpp.token_eos():
                break
        agree, parted = {}, {}
        for numerics, llm in ours.items():
            mine = llm.generate(ids, max_tokens=N_TOKENS, chat=False).tokens
            logits = teacher_forced_logits(llm, ids, theirs[:-1])
            agree[numerics] = robust_agreement(mine, theirs, logits)
            parted[numerics] = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b),
                                    None)
        cases.append(dict(prompt=prompt, prompt_ids=ids, llama_cpp_ids=theirs,
                          llama_cpp_text=ours["exact"].tokenizer.decode(theirs),
                          agree=agree, greedy_runs_part_at=parted))
        print(prompt, agree, parted)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    record = {
        "about": ("Greedy token ids of llama.cpp for tests/llm/test_smollm_outside_check.py; "
                  "see that file's docstring. agree[numerics]: leading tokens mlxprog's "
                  f"greedy run shares with llama.cpp's, each >= {ROBUST_GAP} ahead of the "
                  "runner-up in mlxprog's logits; greedy_runs_part_at: the first index "
                  "where they differ (null: not within the recorded tokens)."),
        "producer": {
            "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
            "libllama_version": llama_cpp.llama_version().decode()
            if isinstance(llama_cpp.llama_version(), bytes) else str(llama_cpp.llama_version()),
            "llama_cpp_commit": "0c1e57098bba43ac29e6e3b677cdceebdd22334f (vendor/llama.cpp "
                                "of the llama-cpp-python 0.3.36 sdist)",
            "build": ("from the PyPI sdist with CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON "
                      "-DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF\" (docs/benchmarks.md)"),
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "settings": {"n_ctx": MAX_LENGTH * 2, "n_threads": threads, "temp": 0.0,
                         "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0,
                         "kv_cache": "f16 (default)", "flash_attn": False,
                         "chat_template": False, "bos": "none (add_bos_token false)"},
            "host_cpus": os.cpu_count(),
        },
        "model": {"file": path.name, "bytes": path.stat().st_size, "sha256": digest},
        "mlxprog_check": {"near_tie_logits": NEAR_TIE, "robust_gap_logits": ROBUST_GAP},
        "cases": cases,
    }
    text = json.dumps(record, indent=1, ensure_ascii=False)
    # One line per list of ids.
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]",
                  lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", text)
    DATA.write_text(text + "\n")
    print(f"wrote {DATA}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit("usage: python tests/llm/test_smollm_outside_check.py --regenerate")
    regenerate()
