"""The LLM commands of the ``mlxprog`` CLI: ``generate``, ``chat``, ``export-llm``.

The generation flags store under :class:`~mlxprog.llm.GenerationOptions`'
field names, so each command builds its options once from the flags it has
(:func:`_generation_options`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import GenerationOptions


def add_commands(commands: Any) -> None:
    """Register the LLM subcommands on the main parser's subparsers."""
    generate = commands.add_parser(
        "generate", help="generate text with an LLM",
        description="Stream a completion of PROMPT, then print a stats line. The default "
        "model is SmolLM2-135M-Instruct (installed on first use).",
    )
    generate.add_argument("--prompt", required=True, help="the prompt text")
    _model_options(generate)
    _sampling_options(generate)
    generate.add_argument("--max-tokens", type=int, default=256, help="tokens to generate")
    generate.add_argument("--stop", action="append", default=[], metavar="TEXT",
                          help="stop when this text appears (repeatable)")
    generate.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                          help="wrap the prompt in the model's chat template (default: yes)")
    generate.add_argument("--in-program", action="store_true",
                          help="run the decode loop as one program (while + runtime_call)")
    generate.set_defaults(handler=_cmd_generate)

    chat = commands.add_parser("chat", help="chat with an LLM interactively",
                               description="An interactive chat that keeps the conversation; "
                               "an empty line or end of input quits, /reset starts over.")
    _model_options(chat)
    _sampling_options(chat)
    chat.add_argument("--max-tokens", type=int, default=512, help="tokens per reply")
    chat.set_defaults(handler=_cmd_chat)

    export = commands.add_parser(
        "export-llm", help="write an LLM's programs as JSON",
        description="Write prefill.json, decode.json, decode_loop.json and manifest.json; "
        "the weights stay in the model file and bind to the programs' captures by name.",
    )
    export.add_argument("model", nargs="?", default=None,
                        help="model file or directory (default: SmolLM2-135M-Instruct)")
    export.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    export.add_argument("--max-length", type=int, default=2048, help="KV-cache length")
    _sampling_options(export)
    export.set_defaults(handler=_cmd_export)


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="a .gguf file or Hugging Face directory (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--max-length", type=int, default=2048,
                        help="KV-cache length: prompt plus generated tokens (default 2048)")


def _sampling_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temp", dest="temperature", metavar="TEMP", type=float, default=0.0,
                        help="temperature (0: greedy)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    parser.add_argument("--top-k", type=int, default=None, help="keep the k most likely tokens")
    parser.add_argument("--min-p", type=float, default=0.0,
                        help="keep tokens at least this times as likely as the best")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")


def _generation_options(args: argparse.Namespace) -> GenerationOptions:
    """The generation options given by a command's flags (validated before the
    model loads); the options it has no flags for keep their defaults."""
    from . import GenerationOptions

    given = vars(args)
    names = [f.name for f in dataclasses.fields(GenerationOptions) if f.init]
    return GenerationOptions(**{name: given[name] for name in names if name in given})


def _cmd_generate(args: argparse.Namespace) -> int:
    from . import load

    options = _generation_options(args)
    llm = load(args.model, max_length=args.max_length)
    if args.in_program:
        result = llm.generate_in_program(args.prompt, on_text=_write, options=options)
    else:
        for piece in llm.stream(args.prompt, options=options):
            _write(piece)
        result = llm.last_generation
    print(flush=True)
    print(result.stats.summary(), file=sys.stderr)
    return 0


def _cmd_chat(args: argparse.Namespace) -> int:
    from . import load

    options = _generation_options(args)
    llm = load(args.model, max_length=args.max_length)
    messages: list[dict[str, str]] = []
    print("mlxprog chat: an empty line quits, /reset starts over.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        if not line.strip():
            return 0
        if line.strip() == "/reset":
            messages.clear()
            continue
        messages.append({"role": "user", "content": line})
        reply = ""
        for piece in llm.stream(messages, options=options):
            reply += piece
            _write(piece)
        print()
        messages.append({"role": "assistant", "content": reply})


def _cmd_export(args: argparse.Namespace) -> int:
    from . import export, load

    sampling = _generation_options(args).sampling
    for path in export(load(args.model, max_length=args.max_length), args.output, sampling):
        print(path)
    return 0


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()
