"""The LLM commands of the ``mlxprog`` CLI: ``generate``, ``chat``, ``export-llm``,
``serve``, ``perplexity``, ``embed``.

Every option is declared once, below, as a :class:`~mlxprog.flags.Flag`;
each command lists the flags it takes (:func:`add_commands`). The generation
flags store under :class:`~mlxprog.llm.GenerationOptions`' field names, so
each command builds its options once from the flags it has
(:func:`_generation_options`), and the model settings under
:func:`~mlxprog.llm.load`'s parameter names. Numeric flags are checked as
they are parsed: a value out of range exits with status 2 and names the flag
(``argument --max-tokens: must be at least 1, got 0``), before any model loads.
The model settings (``--chat-template``, ``--extra-eos-token``,
``--adapter-path``, ...) are checked as the model loads, before anything is
generated; a bad one exits with status 2 too, naming the flag
(:func:`_setting_flags`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..errors import ProgramError, SettingError, UsageError
from ..flags import (
    OneOf, add_command, at_least, choice, choices_metavar, flag, in_range, non_empty, number,
)
from ..native import MAX_THREADS
from .constraints import Constraint, ConstraintError
from .engine import SIZE_FLAGS, PromptTooLongError
from .options import (
    AUTO_NUMERICS, DEFAULT_DRAFT_TOKENS, DEFAULT_LOOKUP_NGRAM, DEFAULT_MAX_LENGTH, DRAFTS,
    MAX_DRAFT_TOKENS, MAX_LOOKUP_NGRAM, NUMERICS, GenerationOptions,
)
from .programs import POOLINGS

if TYPE_CHECKING:
    from .cache import PromptCache
    from .engine import Generation, GenerationStats, Piece
    from .generate import LLM


def _origins(value: str) -> list[str]:
    """An argparse ``type=`` for ``--allowed-origins``: comma-separated
    origins (``scheme://host[:port]``, as browsers send them: no path) or ``*``."""
    origins = [o.strip() for o in value.split(",") if o.strip()]
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"[a-z][a-z0-9+.-]*://[^/\s]+", origin):
            raise argparse.ArgumentTypeError(
                f"{origin!r} is not an origin such as https://example.com:8443 (a scheme and "
                "a host, no path), or *")
    if not origins:
        raise argparse.ArgumentTypeError("no origin given")
    return origins


def _constraint(make: Callable[[str, str], Constraint], flag_name: str,
                file_holds: str | None = None) -> Callable[[str], Constraint]:
    """An argparse ``type=`` for the constraint flag ``flag_name``: its
    value (or, when ``file_holds`` says what, the text of the file it names)
    made into a constraint by ``make`` (a :class:`Constraint` constructor,
    given the flag as the field its errors name), so that a schema, regex
    or grammar that cannot be used, or a file that cannot be read, exits
    with status 2 naming the flag before any model loads."""

    def parse(value: str) -> Constraint:
        text = value
        if file_holds is not None:
            try:
                text = read_text(value, file_holds, f"file {value!r}")
            except ProgramError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        try:
            return make(text, flag_name)
        except ConstraintError as exc:
            where = exc.field.removeprefix(flag_name).lstrip(".")
            raise argparse.ArgumentTypeError(
                f"{where}: {exc.problem}" if where else exc.problem) from None

    return parse


# -- the flags ----------------------------------------------------------------

MODEL = flag("-m", "--model", metavar="PATH",
             help="a .gguf file, a Hugging Face directory or a directory written by mlxprog "
             "export-llm (default: SmolLM2-135M-Instruct)")
#: ``export-llm`` takes the model as a positional argument too.
MODEL_FILE = flag("model_file", nargs="?", metavar="MODEL",
                  help="the model; the same as -m PATH")
MAX_LENGTH_DEFAULT = ("unless the model is a directory written by export-llm, whose programs "
                      f"have theirs (default: {DEFAULT_MAX_LENGTH})")
"""The end of the ``--max-length`` help of the commands that load a model
(the flag's default is None): an exported directory's programs are built
for the length they were exported with."""
MAX_LENGTH = flag("--max-length", type=at_least(2), metavar="N",
                  help=f"KV-cache length: prompt plus generated tokens, {MAX_LENGTH_DEFAULT}")
NUMERICS_FLAG = flag("--numerics", default=AUTO_NUMERICS, type=choice((AUTO_NUMERICS, *NUMERICS)),
                     metavar=choices_metavar((AUTO_NUMERICS, *NUMERICS)),
                     help="the quantized matmuls' numerics: int8 (llama.cpp's: activations "
                     "quantized to 8 bits, integer dot products), exact (MLX's float "
                     "numerics); auto: int8 on the CPU, exact otherwise")
THREADS = flag("--threads", type=in_range(1, MAX_THREADS), metavar="N",
               help="threads of the native CPU kernels, the calling one included "
               "(default: MLXPROG_NATIVE_THREADS, else the usable cores)")
ADAPTER_PATH = flag("--adapter-path", metavar="DIR",
                    help="a LoRA adapter directory (mlx-lm's adapters.safetensors or PEFT's "
                    "adapter_model.safetensors, with adapter_config.json) fused into the "
                    "model's weights as it loads")
CHAT_TEMPLATE = flag("--chat-template", metavar="TEMPLATE",
                     help="a Jinja chat template in place of the model's: the template "
                     "itself (any text with {{ or {%%}) or a file holding it")
EXTRA_EOS_TOKEN = flag("--extra-eos-token", dest="extra_eos_tokens", action="append",
                       default=[], metavar="TEXT",
                       help="a token, given as its text (such as '<|im_end|>'), that ends "
                       "generation as the model's EOS does (repeatable)")
KV_BITS = flag("--kv-bits", type=number(int, lambda v: v in (4, 8), "4 or 8"),
               metavar="BITS", help="store the KV cache's keys and values quantized to 4 or 8 "
               "bits (default: float32)")
KV_GROUP_SIZE = flag("--kv-group-size", metavar="N",
                     type=number(int, lambda v: v in (32, 64, 128), "32, 64 or 128"),
                     help="features sharing one scale and bias in the quantized KV cache "
                     "(default 32 with 4 bits, 64 with 8; needs --kv-bits)")
KV_RECENT = flag("--kv-recent", type=at_least(0), metavar="N",
                 help="the last N tokens' keys and values the quantized KV cache also keeps "
                 "in float, read unrounded by each query (default 16, 0: none; needs "
                 "--kv-bits)")
MAX_KV_SIZE = flag("--max-kv-size", type=at_least(2), metavar="N",
                   help="a rotating KV cache of N tokens: the first --kv-keep and the most "
                   "recent ones, so generation goes on past N and past --max-length "
                   "(prompts must fit in N; default: no bound)")
KV_KEEP = flag("--kv-keep", dest="keep", type=at_least(0), metavar="N",
               help="the first tokens the rotating cache always keeps (default 4; needs "
               "--max-kv-size)")
DRAFT_MODEL = flag("--draft-model", metavar="PATH",
                   help="a smaller model with the same vocabulary to draft tokens with "
                   "(speculative decoding; generations draft with it unless --draft or a "
                   "request's draft field says otherwise)")

TEMP = flag("--temp", dest="temperature", metavar="TEMP", default=0.0,
            type=number(float, lambda v: v >= 0, ">= 0"), help="temperature (0: greedy)")
TOP_P = flag("--top-p", metavar="P", default=1.0,
             type=number(float, lambda v: 0 < v <= 1, "in (0, 1]"), help="nucleus sampling mass")
TOP_K = flag("--top-k", metavar="K", type=at_least(1),
             help="keep the k most likely tokens (default: all)")
MIN_P = flag("--min-p", metavar="P", default=0.0,
             type=number(float, lambda v: 0 <= v < 1, "in [0, 1)"),
             help="keep tokens at least this times as likely as the best")
SYSTEM_PROMPT = flag("--system-prompt", metavar="TEXT",
                     help="a system message before the conversation")
SEED = flag("--seed", metavar="N", default=0,
            type=number(int, lambda v: 0 <= v < 2**64, "a non-negative integer below 2**64"),
            help="sampling seed")
REPETITION_PENALTY = flag("--repetition-penalty", metavar="PENALTY",
                          type=number(float, lambda v: v > 0, "> 0"),
                          help="make recent tokens less likely (mlx-lm's rule; default: off)")
REPETITION_CONTEXT_SIZE = flag("--repetition-context-size", metavar="N", type=at_least(1),
                               default=20,
                               help="how many recent tokens the repetition penalty counts")
DRAFT = flag("--draft", type=choice(DRAFTS), metavar=choices_metavar(DRAFTS),
             help="speculative decoding: prompt-lookup drafts tokens from n-grams of the "
             "prompt and the reply (no second model), model from --draft-model, none decodes "
             "plainly (default: model with --draft-model, else none); the output stays the "
             "same")
NUM_DRAFT_TOKENS = flag("--num-draft-tokens", type=in_range(1, MAX_DRAFT_TOKENS),
                        default=DEFAULT_DRAFT_TOKENS, metavar="N",
                        help="the most drafted tokens each step verifies")
PROMPT_LOOKUP_NGRAM = flag("--prompt-lookup-ngram", type=in_range(1, MAX_LOOKUP_NGRAM),
                           default=DEFAULT_LOOKUP_NGRAM, metavar="N",
                           help="the longest n-gram prompt lookup matches")
MAX_TOKENS = flag("--max-tokens", type=at_least(1), default=256, metavar="N",
                  help="tokens to generate")
VERBOSE = flag("--verbose", action=argparse.BooleanOptionalAction, default=True,
               help="print the stats line on stderr")
JSON = flag("--json", action="store_true",
            help="instead of streaming, print one JSON object on stdout at the end: the "
            "text, finish_reason, cache_full, the token ids and the stats")

PROMPT = OneOf((flag("-p", "--prompt", help="the prompt text; - reads it from stdin"),
                flag("--prompt-file", metavar="FILE", help="read the prompt from FILE")),
               required=True)
STOP = flag("--stop", action="append", default=[], metavar="TEXT",
            help="stop when this text appears (repeatable)")
CHAT = flag("--chat", action=argparse.BooleanOptionalAction, default=True,
            help="wrap the prompt in the model's chat template")
IN_PROGRAM = flag("--in-program", action="store_true",
                  help="run the decode loop as one program (while + runtime_call)")
PROMPT_CACHE = flag("--prompt-cache", metavar="FILE",
                    help="reuse the KV cache saved in FILE (.safetensors) for the prefix it "
                    "shares with the prompt, and save the prompt and reply to it afterwards "
                    "(a new file if FILE does not exist)")
#: Structured output: one constraint, stored as GenerationOptions' ``constraint``.
CONSTRAINT = OneOf((
    flag("--json-schema", dest="constraint", metavar="FILE",
         type=_constraint(Constraint.json_schema, "--json-schema", "the schema"),
         help="the reply is JSON that the JSON schema in FILE validates (constrained "
         "decoding: it always parses and validates, unless --max-tokens cuts it)"),
    flag("--regex", dest="constraint", metavar="REGEX",
         type=_constraint(Constraint.regex, "--regex"),
         help="the reply is text that REGEX matches whole (Rust regex syntax)"),
    flag("--grammar", dest="constraint", metavar="FILE",
         type=_constraint(Constraint.grammar, "--grammar", "the grammar"),
         help="the reply follows the grammar in FILE: llguidance's Lark (a start: rule) "
         "or llama.cpp's GBNF (a root ::= rule)")))

OUTPUT = flag("-o", "--output", required=True, metavar="DIR", help="output directory")
WORLD_SIZE = flag("--world-size", type=at_least(1), default=1, metavar="N",
                  help="split the model over N processes (tensor parallelism): one directory "
                  "of programs per rank")

HOST = flag("--host", default="127.0.0.1", help="address to listen on")
PORT = flag("--port", type=in_range(0, 65535), default=8080,
            help="port to listen on; 0 picks a free one")
MAX_BATCH = flag("--max-batch", type=in_range(1, 64), default=8, metavar="N",
                 help="requests decoded together; more wait in order")
PROMPT_CACHE_SIZE = flag("--prompt-cache-size", type=at_least(0), default=8, metavar="N",
                         help="prompt prefixes kept for reuse; 0 turns the cache off")
PREFILL_CHUNK = flag("--prefill-chunk", type=at_least(1), default=128, metavar="N",
                     help="prompt tokens prefilled at a time between decode steps, so a long "
                     "prompt does not stall the other requests")
MAX_QUEUE = flag("--max-queue", type=at_least(0), default=64, metavar="N",
                 help="requests that may wait for a row; more get a 503")
MODEL_ID = flag("--model-id", metavar="ID",
                help="the model's name in the API (default: the model file's stem)")
API_KEY = flag("--api-key", type=non_empty("the API key"), metavar="KEY",
               help="require 'Authorization: Bearer KEY' on every request but /health "
               "(default: no key)")
ALLOWED_ORIGINS = flag("--allowed-origins", type=_origins, default=[], metavar="ORIGINS",
                       help="comma-separated origins (https://app.example.com, or *) whose "
                       "web pages may call the server (CORS)")
SHUTDOWN_GRACE = flag("--shutdown-grace", type=number(float, lambda v: v >= 0, "at least 0"),
                      default=5, metavar="SECONDS",
                      help="how long running requests may take to finish once SIGINT or "
                      "SIGTERM stops the server; then they end with an error")

TEXT_FILE = flag("file", metavar="FILE", help="the text (UTF-8); - reads stdin")
SEGMENT_LENGTH = flag("--segment-length", type=at_least(2), metavar="N",
                      help="the most tokens of context a segment holds (default: the whole "
                      "text, up to the model's context length)")
#: ``--segment-length``'s name before it had its own: still taken, not shown.
SEGMENT_LENGTH_ALIAS = flag("--window", dest="segment_length", type=at_least(2),
                            help=argparse.SUPPRESS)
STRIDE = flag("--stride", type=at_least(1), metavar="N",
              help="how far each segment starts after the previous one (default: half the "
              "segment length)")
CHUNK = flag("--chunk", type=at_least(1), default=256, metavar="N",
             help="tokens per program call (bounds the logits held at once)")

TEXTS = OneOf((flag("text", nargs="*", default=[], metavar="TEXT",
                    help="the texts to embed, one input each"),
               flag("--file", metavar="FILE",
                    help="embed each non-empty line of FILE (- reads stdin)")),
              required=True)
POOLING = flag("--pooling", type=choice(POOLINGS), default="mean",
               metavar=choices_metavar(POOLINGS),
               help="mean: the average over the input's tokens; last: the last token's")
NORMALIZE = flag("--normalize", action=argparse.BooleanOptionalAction, default=True,
                 help="divide each embedding by its L2 norm")

#: How a command that runs a model runs it (see :func:`_set_threads`).
RUNTIME = (NUMERICS_FLAG, THREADS)
#: The model and how it loads, for the commands that load one by ``-m``.
LOADING = (MODEL, MAX_LENGTH, *RUNTIME, ADAPTER_PATH)
#: The quantized KV cache's settings.
KV_CACHE = (KV_BITS, KV_GROUP_SIZE, KV_RECENT)
#: :func:`~mlxprog.llm.load`'s model settings, for the commands that render
#: chats and generate.
MODEL_SETTINGS = (CHAT_TEMPLATE, EXTRA_EOS_TOKEN, *KV_CACHE, MAX_KV_SIZE, KV_KEEP, DRAFT_MODEL)
#: The sampling attributes (:class:`~mlxprog.llm.Sampling`).
SAMPLING = (TEMP, TOP_P, TOP_K, MIN_P)
#: The generation flags beyond sampling, for the commands that generate.
GENERATION = (SYSTEM_PROMPT, SEED, REPETITION_PENALTY, REPETITION_CONTEXT_SIZE, DRAFT,
              NUM_DRAFT_TOKENS, PROMPT_LOOKUP_NGRAM)

#: The model settings of :func:`~mlxprog.llm.load` that flags give: their
#: parameter (and ``argparse`` dest) -> the flag.
SETTING_FLAGS = {f.dest: f.names[0] for f in (*MODEL_SETTINGS, ADAPTER_PATH)}


def add_commands(commands: Any) -> None:
    """Register the LLM subcommands on the main parser's subparsers."""
    add_command(commands, "generate", _cmd_generate, "generate text with an LLM",
                [PROMPT, *LOADING, *MODEL_SETTINGS, *SAMPLING, *GENERATION, CONSTRAINT,
                 MAX_TOKENS, STOP, CHAT, IN_PROGRAM, VERBOSE, JSON, PROMPT_CACHE])
    add_command(commands, "chat", _cmd_chat, "chat with an LLM interactively",
                [*LOADING, *MODEL_SETTINGS, *SAMPLING, *GENERATION, CONSTRAINT,
                 MAX_TOKENS.but(default=512, help="tokens per reply"),
                 VERBOSE.but(action="store_true", default=False,
                             help="print a stats line on stderr after each reply")])
    # Only the sampling attributes: the seed is no part of the programs (the
    # PRNG key is an input of each call).
    add_command(commands, "export-llm", _cmd_export, "write an LLM's programs as JSON",
                [OneOf((MODEL_FILE, MODEL)), OUTPUT,
                 MAX_LENGTH.but(default=DEFAULT_MAX_LENGTH, help="KV-cache length"),
                 WORLD_SIZE, NUMERICS_FLAG, ADAPTER_PATH, *SAMPLING])
    add_command(commands, "serve", _cmd_serve, "serve an LLM over an OpenAI-compatible API",
                [MODEL, HOST, PORT, MAX_LENGTH.but(help="KV-cache length of each request: "
                                                   f"prompt plus generated tokens, "
                                                   f"{MAX_LENGTH_DEFAULT}"),
                 MAX_BATCH, PROMPT_CACHE_SIZE, PREFILL_CHUNK, MAX_QUEUE, MODEL_ID, API_KEY,
                 ALLOWED_ORIGINS, SHUTDOWN_GRACE, *RUNTIME, ADAPTER_PATH, *MODEL_SETTINGS])
    add_command(commands, "perplexity", _cmd_perplexity, "measure an LLM's perplexity on a text",
                [TEXT_FILE, MODEL, *RUNTIME, ADAPTER_PATH, SEGMENT_LENGTH, SEGMENT_LENGTH_ALIAS,
                 STRIDE, CHUNK, *KV_CACHE,
                 JSON.but(help="print one JSON object: perplexity, nll, tokens, numerics, "
                          "segment_length, stride, chunk, seconds")])
    add_command(commands, "embed", _cmd_embed, "print embeddings of texts",
                [TEXTS, *LOADING, POOLING, NORMALIZE])


def _model_path(model: str | None, flag_name: str = "-m") -> str | None:
    """The model a command line names (None: the default model), checked to
    exist so that a mistyped path is an error naming ``flag_name``."""
    if model is not None and not os.path.exists(model):
        raise ProgramError(f"{flag_name} {model}: no such file or directory")
    return model


def _settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """The model settings a command's flags give (those it has flags for)."""
    given = vars(args)
    return {name: given[name] for name in SETTING_FLAGS if name in given}


@contextlib.contextmanager
def _setting_flags() -> Iterator[None]:
    """Report a bad model setting (:class:`~mlxprog.llm.SettingError`,
    raised as the model loads) as a bad flag: exit status 2, naming the flag
    instead of the parameter."""
    try:
        yield
    except SettingError as exc:
        raise UsageError(f"{SETTING_FLAGS[exc.setting]}: {exc.problem}") from None


def _set_threads(args: argparse.Namespace) -> None:
    """Size the native kernels' thread pool as ``--threads`` says, before
    the model loads (which starts the pool)."""
    from .. import native

    if args.threads is None:
        return
    try:
        native.set_threads(args.threads)
    except RuntimeError as exc:  # the pool started earlier in this process
        raise ProgramError(f"--threads {args.threads}: {exc}") from None


def _load(args: argparse.Namespace, model: str | None, **options: Any) -> LLM:
    """Load ``model`` with the command's ``--threads``, ``--numerics`` and
    model settings; ``options`` go to :func:`~mlxprog.llm.load`."""
    from . import load

    _set_threads(args)
    with _setting_flags():
        return load(model, numerics=args.numerics, **_settings_of(args), **options)


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt a ``generate`` command line gives: ``--prompt TEXT``,
    ``--prompt -`` (stdin) or ``--prompt-file FILE``. What is read from stdin
    or a file loses its trailing line breaks (an editor's last newline is
    not part of the prompt); a file that cannot be read is a
    :class:`~mlxprog.ProgramError` naming it."""
    if args.prompt_file is None and args.prompt != "-":
        return args.prompt
    where = "stdin" if args.prompt_file is None else f"prompt file {args.prompt_file!r}"
    return read_text(args.prompt_file, "the prompt", where).rstrip("\r\n")


def read_text(path: str | None, what: str, where: str) -> str:
    """The UTF-8 text of file ``path``, or of stdin when ``path`` is None; a
    :class:`~mlxprog.ProgramError` saying it cannot read ``what`` from
    ``where`` when that fails."""
    try:
        if path is None:
            return sys.stdin.read()
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ProgramError(f"cannot read {what} from {where}: {reason}") from None


def _generation_options(args: argparse.Namespace) -> GenerationOptions:
    """The generation options given by a command's flags (validated before the
    model loads); the options it has no flags for keep their defaults."""
    given = vars(args)
    names = [f.name for f in dataclasses.fields(GenerationOptions) if f.init]
    return GenerationOptions(**{name: given[name] for name in names if name in given})


def _cmd_generate(args: argparse.Namespace) -> int:
    """Stream a completion of PROMPT, then print a stats line. The default
    model is SmolLM2-135M-Instruct (installed on first use)."""
    import mlx.core as mx

    options = _generation_options(args)
    if args.in_program and options.constraint is not None:
        raise UsageError("--in-program: the in-program decode loop cannot follow "
                         "--json-schema, --regex or --grammar; leave one out")
    prompt = read_prompt(args)
    # Under mlx.launch the processes split the model (tensor parallelism);
    # alone, init() gives a group of one and the whole model runs here.
    group = mx.distributed.init()
    if group.size() > 1 and args.prompt_cache:
        raise ProgramError(f"--prompt-cache: a model split over {group.size()} processes "
                           "keeps part of each KV cache per process; run without it")
    llm = _load(args, _model_path(args.model), max_length=args.max_length, group=group)
    # Every rank generates the same tokens; only rank 0 shows them.
    shown = llm.rank == 0
    write = _write if shown else _discard
    verbose = args.verbose and shown
    cache = _prompt_cache(llm, args.prompt_cache) if args.prompt_cache else None
    last: Piece | None = None
    try:
        if args.json:
            result = llm.generate(prompt, prompt_cache=cache, options=options)
        elif args.in_program:
            result = llm.generate_in_program(prompt, on_text=write, options=options)
        else:
            for last in llm.stream(prompt, prompt_cache=cache, options=options):
                write(last.text)
            result = llm.last_generation
    except PromptTooLongError as exc:
        raise ProgramError(_too_long("the prompt has", exc)) from None
    except KeyboardInterrupt:
        # What was generated stays on screen; the stats so far follow.
        if shown:
            print(flush=True)
        if verbose and last is not None:
            print(_stats_line(llm, last.stats, "interrupted"), file=sys.stderr)
        return 130
    if args.json and shown:
        print(json.dumps({"text": result.text, "finish_reason": result.finish_reason,
                          "cache_full": result.cache_full, "tokens": result.tokens,
                          "numerics": llm.numerics, "stats": result.stats.as_dict()}))
    elif shown:
        print(flush=True)
    if cache is not None:
        cache.save(args.prompt_cache)
    if verbose:
        print(_stats_line(llm, result.stats, _finish(result, llm, args.max_tokens))
              + _native_build_note(), file=sys.stderr)
    return 0


def _stats_line(llm: LLM, stats: GenerationStats, finish: str | None = None) -> str:
    """The ``--verbose`` line: the generation's stats, the numerics it ran
    with, and why it stopped (when given)."""
    line = f"{stats.summary()} | numerics: {llm.numerics}"
    return line if finish is None else f"{line} | finish: {finish}"


def _native_build_note() -> str:
    """What the stats line adds when this process built the native kernels
    first: the build ran before the timed generation, so it is not in the
    stats, and the user saw the wait."""
    from .. import native

    seconds = native.build_seconds()
    return "" if seconds is None else f" (native kernels built in {seconds:.0f} s, not timed)"


def _too_long(what: str, exc: PromptTooLongError) -> str:
    """A prompt too long for the cache, in the flags' terms."""
    flag = SIZE_FLAGS[exc.setting]
    return (f"{what} {exc.prompt_tokens} tokens, but the KV cache holds {exc.max_length} "
            f"({flag}); raise {flag} or shorten it")


def _prompt_cache(llm: LLM, path: str) -> PromptCache:
    """The prompt cache in ``--prompt-cache`` FILE, or a new one if there is
    no such file yet."""
    return llm.load_prompt_cache(path) if os.path.exists(path) else llm.prompt_cache()


def _finish(result: Generation, llm: LLM, max_tokens: int) -> str:
    """Why a generation stopped, in the flags' terms (``max_tokens`` is
    ``--max-tokens``)."""
    if result.finish_reason == "length":
        if result.cache_full:
            return (f"length (the KV cache of {llm.max_length} tokens is full; "
                    "raise --max-length)")
        return f"length (--max-tokens {max_tokens})"
    return {"eos": "eos (end of sequence)",
            "stop": "stop (a --stop text, or the constrained reply complete)"}.get(
        result.finish_reason, result.finish_reason)


def _single_process(command: str) -> None:
    """Refuse to run ``command`` as one of several processes: it does not
    split the model, so every process would run (and print) all of it."""
    import mlx.core as mx

    size = mx.distributed.init().size()
    if size > 1:
        raise ProgramError(f"mlxprog {command} runs in one process, but this is one of {size} "
                           "(mlx.launch); only mlxprog generate splits the model over them")


def _cmd_chat(args: argparse.Namespace) -> int:
    """An interactive chat that keeps the conversation; an empty line or
    end of input quits, /reset starts over."""
    from . import Chat

    _single_process("chat")
    options = _generation_options(args)
    llm = _load(args, _model_path(args.model), max_length=args.max_length)
    chat = Chat(llm, options=options)
    print("mlxprog chat: Ctrl-C stops a reply; an empty line, Ctrl-D or Ctrl-C at the "
          "prompt quits; /reset starts over.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            return 130
        if not line.strip():
            return 0
        if line.strip() == "/reset":
            chat.reset()
            print("[the conversation starts over]", file=sys.stderr)
            continue
        try:
            reply = chat.send(line)
        except PromptTooLongError as exc:
            print(f"error: {_too_long('the message makes a prompt of', exc)}", file=sys.stderr)
            continue
        if chat.dropped:
            rotating = llm.cache_layout.max_kv_size
            size = (f"{rotating} tokens (--max-kv-size)" if rotating is not None
                    else f"{llm.max_length} tokens (--max-length)")
            print(f"[the conversation outgrew the KV cache of {size}: dropped the "
                  f"{chat.dropped} oldest exchange"
                  f"{'s' if chat.dropped > 1 else ''}]", file=sys.stderr)
        try:
            for piece in reply:
                _write(piece.text)
        except KeyboardInterrupt:
            reply.close()  # the reply so far stays in the conversation
            print("\n[interrupted]", file=sys.stderr)
            continue
        print()
        result = llm.last_generation
        if result.finish_reason == "length":
            print(f"[the reply stopped at {_finish(result, llm, args.max_tokens)}]",
                  file=sys.stderr)
        if args.verbose:
            print(_stats_line(llm, result.stats), file=sys.stderr)


def _cmd_export(args: argparse.Namespace) -> int:
    """Write prefill.json, decode.json, decode_loop.json and
    manifest.json; the weights stay in the model file and bind to the
    programs' captures by name. With --world-size N, each rank's
    tensor-parallel programs go to rank0/ ... rank<N-1>/."""
    from . import export, load

    sampling = _generation_options(args).sampling
    # The model is the positional MODEL or -m (argparse allows one of them).
    model = (_model_path(args.model_file, "model") if args.model is None
             else _model_path(args.model))
    with _setting_flags():
        llm = load(model, max_length=args.max_length, numerics=args.numerics,
                   adapter_path=args.adapter_path)
    for path in export(llm, args.output, sampling, world_size=args.world_size):
        print(path)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    """Serve an LLM over an OpenAI-compatible HTTP API:
    /v1/chat/completions and /v1/completions (streaming or not),
    /v1/embeddings, /v1/models, /health, /metrics. Requests are decoded
    together in one batch; Ctrl-C stops the server. See docs/serving.md."""
    # Imported here: the ASGI stack is needed only by this command.
    from .server import serve

    _single_process("serve")
    _set_threads(args)
    with _setting_flags():
        serve(_model_path(args.model), host=args.host, port=args.port,
              max_length=args.max_length, max_batch=args.max_batch,
              prompt_cache_size=args.prompt_cache_size, prefill_chunk=args.prefill_chunk,
              max_waiting=args.max_queue, model_id=args.model_id, numerics=args.numerics,
              api_key=args.api_key, allowed_origins=args.allowed_origins,
              shutdown_grace=args.shutdown_grace, **_settings_of(args))
    return 0


def _cmd_perplexity(args: argparse.Namespace) -> int:
    """Print the model's perplexity on FILE (its text tokenized as it is,
    no chat template): the exponential of the mean negative log-likelihood
    of each token after the ones before it. Texts longer than
    --segment-length tokens are scored in overlapping segments. See
    docs/llm.md."""
    from .perplexity import perplexity

    _single_process("perplexity")
    model = _model_path(args.model)
    stdin = args.file == "-"
    text = read_text(None if stdin else args.file, "the text",
                     "stdin" if stdin else f"file {args.file!r}")
    # Loaded by load, as generate's model is, so that -m takes an exported
    # directory too (perplexity() itself loads model files only).
    llm = _load(args, model)
    result = perplexity(llm, text, segment_length=args.segment_length, stride=args.stride,
                        chunk=args.chunk)
    if args.json:
        fields = ("perplexity", "nll", "tokens", "numerics", "segment_length", "stride", "chunk",
                  "seconds")
        print(json.dumps({name: getattr(result, name) for name in fields}))
    else:
        print(f"perplexity {result.perplexity:.4f} over {result.tokens} tokens (nll "
              f"{result.nll:.4f} nats/token; numerics {result.numerics}, segment length "
              f"{result.segment_length}, stride {result.stride}, chunk {result.chunk}; "
              f"{result.seconds:.1f} s)")
    return 0


def _cmd_embed(args: argparse.Namespace) -> int:
    """Print one JSON array per input on stdout: the model's final hidden
    states pooled over the input's tokens (texts tokenized as they are, no
    chat template), of norm 1 unless --no-normalize. See docs/llm.md."""
    from .generate import EmbeddingInputError

    _single_process("embed")
    model = _model_path(args.model)
    if args.file is None:
        inputs = args.text
    else:
        stdin = args.file == "-"
        text = read_text(None if stdin else args.file, "the texts",
                         "stdin" if stdin else f"file {args.file!r}")
        inputs = [line for line in text.splitlines() if line.strip()]
        if not inputs:  # found before the model loads
            raise ProgramError(f"--file {args.file}: no line to embed (every line is blank)")
    llm = _load(args, model, max_length=args.max_length)
    try:
        vectors = llm.embed(inputs, pooling=args.pooling, normalize=args.normalize)
    except EmbeddingInputError as exc:
        if exc.tokens is None:
            raise
        raise ProgramError(f"input {exc.index} has {exc.tokens} tokens, but --max-length is "
                           f"{llm.max_length}; raise it or shorten the input") from None
    for vector in vectors.tolist():
        print(json.dumps(vector))
    return 0


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _discard(text: str) -> None:
    """What the ranks other than 0 do with their (identical) text."""
