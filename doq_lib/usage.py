"""The command line's words (L0): help for one command, and usage errors said plainly.

``doq.py``'s docstring is the docopt text that parses the command line. docopt's own messages
for a line that does not fit it name its internals (``Warning: found unmatched (duplicate?)
arguments [Argument(None, 'keys')]``) and print the whole usage; this module reads the same
text to say what is wrong (an unknown option or command, a missing subcommand or option) and
to show the usage of the one command concerned, and ``doq <command> --help`` shows that
command's usage, its description and only its options.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

PROG = "doq"
_OPTION = re.compile(r"(--?[A-Za-z][\w.-]*)")


@dataclass
class Option:
    """One entry of the Options section: its names, and its text as printed."""

    names: tuple[str, ...]
    takes_value: bool
    text: str


@dataclass
class Doc:
    """The parts of the docopt text a user is shown."""

    usage: list[str]                                     # one entry per usage pattern
    #: each command's entries of the Commands section, as written ("get" has two)
    commands: dict[str, list[str]] = field(default_factory=dict)
    options: list[Option] = field(default_factory=list)


def _blocks(lines: list[str]) -> list[str]:
    """Entries of an indented section: a line at the section's indentation starts one, deeper
    lines continue it."""
    out: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        if out and len(line) - len(line.lstrip()) > 2:
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


def parse(text: str) -> Doc:
    _, _, tail = text.partition("Usage:\n")
    usage_part, _, tail = tail.partition("\nCommands:\n")
    command_part, _, tail = tail.partition("\nOptions:\n")
    option_part, _, _ = tail.partition("\n\n")
    doc = Doc(usage=_blocks(usage_part.splitlines()))
    for block in _blocks(command_part.splitlines()):
        command = block.split()[0]            # "get queues": an entry of "get"
        doc.commands.setdefault(command, []).append(block)
    for block in _blocks(option_part.splitlines()):
        first, _, _ = block.strip().partition("  ")
        names = tuple(_OPTION.findall(first))
        doc.options.append(Option(names, "<" in first, block))
    return doc


def _words(pattern: str) -> list[str]:
    return pattern.split()[1:]                  # without the program's name


def command_of(argv: list[str], takes_value: set[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option or an option's
    value); None when there is none."""
    words = _positionals(argv, takes_value)
    return words[0] if words else None


def patterns_of(doc: Doc, command: str) -> list[str]:
    """The usage patterns of ``command`` (serve: the one with ``[serve]``)."""
    out = []
    for pattern in doc.usage:
        words = _words(pattern)
        if words and words[0].strip("[]") == command:
            out.append(pattern)
    return out


def _required_words(pattern: str) -> list[str]:
    """The words of a usage pattern outside any brackets (what it requires)."""
    depth, out = 0, []
    for token in re.findall(r"\[|\]|\(|\)|\|[^\s\[\]()]*|[^\s\[\]()|]+", pattern):
        if token == "[":
            depth += 1
        elif token == "]":
            depth -= 1
        elif depth == 0:
            out.append(token.removesuffix("..."))
    return out[1:]


def _required(pattern: str) -> list[str]:
    """The options a usage pattern requires."""
    return [w.split("=")[0] for w in _required_words(pattern) if w.startswith("--")]


def _subcommands(doc: Doc, command: str) -> list[str]:
    return list(dict.fromkeys(
        _words(p)[1] for p in patterns_of(doc, command)
        if len(_words(p)) > 1 and not _words(p)[1].startswith(("-", "[", "<"))))


def _given(argv: list[str]) -> set[str]:
    return {token.split("=")[0] for token in argv if token.startswith("-")}


def _long_names(token: str, known: set[str]) -> str:
    name = token.split("=")[0]
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return f"unknown option {name}" + (f" (did you mean {close[0]}?)" if close else "")


def _positionals(argv: list[str], takes_value: set[str]) -> list[str]:
    out, skip = [], False
    for token in argv:
        if skip:
            skip = False
        elif token.startswith("-"):
            skip = "=" not in token and token in takes_value
        else:
            out.append(token)
    return out


def _problem(doc: Doc, name: str, argv: list[str], known: set[str],
             takes_value: set[str]) -> tuple[str, list[str]]:
    """What is wrong with a command line that names command ``name``, and the usage
    patterns that help (the subcommand's when one is given)."""
    patterns = patterns_of(doc, name)
    unknown = [t for t in argv if t.startswith("-") and t.split("=")[0] not in known]
    if unknown:
        return _long_names(unknown[0], known), patterns
    words = _positionals(argv, takes_value)
    if words and words[0] == name:
        words = words[1:]
    subs = _subcommands(doc, name)
    if subs:
        if not words or words[0] not in subs:
            return (f"say which: {', '.join(subs[:-1])} or {subs[-1]}" if len(subs) > 1
                    else f"expected {subs[0]}"), patterns
        patterns = [p for p in patterns if _words(p)[1] == words[0]]
        words = words[1:]
    bare = [t for t in argv if "=" not in t and t in takes_value]
    if bare and argv.index(bare[-1]) == len(argv) - 1:
        return f"{bare[-1]} needs a value ({bare[-1]}=...)", patterns
    if len(patterns) == 1:
        required = [w for w in _required_words(patterns[0]) if w.startswith("<")]
        if len(words) < len(required):
            return f"{required[len(words)]} is required", patterns
        given = _given(argv)
        for option in _required(patterns[0]):
            if option not in given and not any(option in opt.names and set(opt.names) & given
                                               for opt in doc.options):
                return f"{option} is required", patterns
    return "these arguments do not fit its usage", patterns


def usage_error(doc: Doc, argv: list[str], known: set[str], takes_value: set[str]) -> str:
    """What is wrong with ``argv`` (which docopt refused), then the usage of its command."""
    command = command_of(argv, takes_value)
    if command is not None and command not in doc.commands:
        return (f"{PROG}: unknown command {command!r}; the commands are "
                f"{', '.join(doc.commands)}\nRun '{PROG} --help' for what each does.")
    name = command or "serve"
    problem, patterns = _problem(doc, name, argv, known, takes_value)
    who = PROG if command is None else f"{PROG} {name}"
    lines = [f"{who}: {problem}", "Usage:"]
    lines += [f"  {p}" for p in _shown(patterns)]
    lines.append(f"Run '{PROG} {name} --help' for its options.")
    return "\n".join(lines)


def _shown(patterns: list[str]) -> list[str]:
    return [re.sub(r"\n\s+", "\n    ", p.strip()) for p in patterns]


def _names_command(text: str, command: str) -> bool:
    """Whether an option's description says it is for ``command`` ("backup, restore: ...",
    "get messages: ...")."""
    return re.search(rf"(^|[\s,]){re.escape(command)}( [a-z]+)?[,:]", text) is not None


def command_help(doc: Doc, command: str, config_help: str = "") -> str:
    """``doq <command> --help``: its usage, what it does and its options."""
    patterns = patterns_of(doc, command)
    used = set(_OPTION.findall(" ".join(patterns)))
    lines = ["Usage:"] + [f"  {p}" for p in _shown(patterns)]
    lines += ["", "Commands:"] + doc.commands.get(command, []) + ["", "Options:"]
    lines += [opt.text for opt in doc.options
              if set(opt.names) & used or "--help" in opt.names
              or _names_command(" ".join(opt.text.split()[len(opt.names):]), command)]
    text = "\n".join(lines) + "\n"
    if "[options]" in " ".join(patterns) and config_help:
        text += "\n" + config_help
    return text
