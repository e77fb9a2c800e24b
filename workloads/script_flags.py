"""The flags a training script's argparse parser accepts, read from its source without running it, and the arguments
a workload passes it that the parser would refuse at start-up on every rank ("unrecognized arguments").

The script is read with Python's `ast`, never imported: a user's script (recipes/user/) may import torch at
the top, or do anything. Its parser is readable when the file makes exactly one `argparse.ArgumentParser(...)` and
every `add_argument` call names its option strings as plain strings; then the option strings are all the parser has.
Anything that could add flags or accept unknown ones out of sight makes it unreadable, and an unreadable parser is
never judged (`read` returns None): the parser handed to another function (e.g. `deepspeed.add_config_arguments`),
`parents=`, subparsers, `parse_known_args`, a `prefix_chars` other than "-", or option strings computed at run time.
"""

from __future__ import annotations

import ast
import difflib
import functools
import re
from pathlib import Path

import msgspec

from recipes import contract, contract_programs

# What argparse takes for a negative number rather than an option (its _negative_number_matcher).
NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
# Methods that let a parser take what it does not define: with them, no argument can be called unknown.
TOLERANT = frozenset({"parse_known_args", "parse_known_intermixed_args", "add_subparsers"})
HELP = ("-h", "--help")


class ScriptFlags(msgspec.Struct, frozen=True):
    """A parser's options: each `add_argument` call's option strings (aliases of one action together)."""

    actions: tuple[tuple[str, ...], ...]
    abbrev: bool  # argparse's allow_abbrev: a unique prefix of a long option is that option

    @property
    def flags(self) -> tuple[str, ...]:
        return tuple(flag for action in self.actions for flag in action)

    def action_of(self, token: str) -> tuple[str, ...] | str | None:
        """The action an argument token selects (its option strings), None when the parser has none, or, for a
        prefix several long options share, the text argparse's "ambiguous option" error would list."""
        name = token.split("=", 1)[0] if token.startswith("--") else token
        for action in self.actions:
            if name in action:
                return action
        if token.startswith("--"):
            matches = [flag for flag in self.flags if flag.startswith("--") and flag.startswith(name)]
            if self.abbrev and len(matches) == 1:
                return next(a for a in self.actions if matches[0] in a)
            if self.abbrev and matches:
                return ", ".join(matches)
            return None
        # A short option with its value attached (-x5): argparse reads the first two characters.
        return next((a for a in self.actions if token[:2] in a and not token.startswith("--")), None)

    def closest(self, token: str, leave_out: frozenset[str] = frozenset()) -> list[str]:
        """The parser's flags, closest to `token` first (difflib's ratio), without `leave_out` and help."""
        name = token.split("=", 1)[0]
        flags = [f for f in dict.fromkeys(self.flags) if f not in leave_out and f not in HELP]
        return sorted(flags, key=lambda f: -difflib.SequenceMatcher(None, name, f).ratio())


def option_tokens(args: list[str]) -> list[tuple[int, str]]:
    """(index, token) of each argument that argparse reads as an option string (not a value, not after `--`)."""
    found = []
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if arg.startswith("-") and len(arg) > 1 and not NEGATIVE_NUMBER.match(arg):
            found.append((i, arg))
    return found


def _is_parser_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    return name == "ArgumentParser"


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _parser_settings(call: ast.Call) -> tuple[bool, bool] | None:
    """(allow_abbrev, add_help) of the ArgumentParser call, or None when they or its other settings hide flags."""
    if _keyword(call, "parents") is not None or any(k.arg is None for k in call.keywords):
        return None
    prefix = _keyword(call, "prefix_chars")
    if prefix is not None and not (isinstance(prefix, ast.Constant) and prefix.value == "-"):
        return None
    settings = []
    for name in ("allow_abbrev", "add_help"):
        value = _keyword(call, name)
        if value is not None and not (isinstance(value, ast.Constant) and isinstance(value.value, bool)):
            return None
        settings.append(True if value is None else bool(value.value))
    return settings[0], settings[1]


def _parser_names(tree: ast.Module, call: ast.Call) -> set[str]:
    """The names the parser is bound to (`parser = argparse.ArgumentParser(...)`)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.value is call:
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and node.value is call and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _escapes(tree: ast.Module, names: set[str]) -> bool:
    """Whether the parser is passed to a call (anything may add flags to it there) or returned to code not read."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            passed = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(a, ast.Name) and a.id in names for a in passed):
                return True
    return False


def _actions(tree: ast.Module) -> list[tuple[str, ...]] | None:
    """Every add_argument call's option strings; None when one is not a plain string (computed flags)."""
    actions = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        if not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
            return None
        options = tuple(a.value for a in node.args if a.value.startswith("-"))
        if options:
            actions.append(options)
    return actions


def _tolerant(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in TOLERANT for n in ast.walk(tree))


def parse_source(text: str) -> ScriptFlags | None:
    """The flags of the one argparse parser in this source, or None when they cannot be known (see the module)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    calls = [n for n in ast.walk(tree) if _is_parser_call(n)]
    if len(calls) != 1 or _tolerant(tree):
        return None
    settings = _parser_settings(calls[0])
    actions = _actions(tree)
    if settings is None or actions is None or _escapes(tree, _parser_names(tree, calls[0])):
        return None
    abbrev, add_help = settings
    return ScriptFlags(actions=(*((HELP,) if add_help else ()), *actions), abbrev=abbrev)


@functools.cache
def of_program(program: contract.Program) -> ScriptFlags:
    """The flags of a program whose parser recipes/contract.py declares: read from the declaration itself."""
    options = (*program.options, *program.hidden)
    return ScriptFlags(actions=(HELP, *(o.flags for o in options)), abbrev=program.abbrev)


def read(path: Path) -> ScriptFlags | None:
    """The flags of the script at `path`, or None (no such file, or no parser that can be read). A program of the
    recipes package with a declared contract (recipes/contract_programs.py PROGRAMS) is read from the declaration."""
    program = contract_programs.PROGRAMS.get(path.name) if path.parent == contract.HERE else None
    if program is not None:
        return of_program(program)
    try:
        return parse_source(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
