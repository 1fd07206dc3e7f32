"""Pull the candidate module out of a model's reply, or say plainly why there is none.

A reply may hold prose, several fenced blocks (a kernel in one, ``ModelNew`` in the next, a usage
example last), no fence at all, or a fence cut off by the token limit. The rule: the candidate is
the last complete Python block that defines ``ModelNew``; blocks before it that define names it
uses are joined in front of it; an unterminated block is never taken from a truncated reply (a
module cut at a line boundary can still parse, and would be judged as if it were the model's
answer). Reasoning is never searched: it holds drafts, not the answer.
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass

#: Fence languages that hold a Python module. An unlabelled fence counts: models often omit it.
PYTHON_LANGS = {"", "python", "py", "python3", "py3", "ipython"}

_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\n`]*)$", re.MULTILINE)
_MODULE_START = re.compile(r"^(import |from |@triton|class |def |[A-Z_][A-Z0-9_]* = |\"\"\"|#)", re.MULTILINE)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    closed: bool
    index: int  # 1-based position among the reply's fenced blocks


@dataclass(frozen=True)
class Extraction:
    """The module (``code``) or None, and a sentence saying what was found or what is missing."""

    code: str | None
    note: str
    #: "ok", "no_code", "no_model_new", "truncated", "syntax_error" (code kept for the verifier)
    kind: str
    blocks: int = 0
    #: first line of the module's docstring: the model's own one-line summary of the kernel
    summary: str = ""

    @property
    def ok(self) -> bool:
        return self.code is not None


def fenced_blocks(text: str) -> list[Block]:
    """Every fenced block in order; a fence left open runs to the end of the text."""
    blocks: list[Block] = []
    pos = 0
    while True:
        start = _FENCE.search(text, pos)
        if start is None:
            return blocks
        fence, info = start.group("fence"), start.group("info").strip()
        lang = info.split()[0].lower() if info else ""
        body_start = start.end() + 1
        # A closing fence: the same character, at least as long, nothing after it on the line.
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        end = closing.search(text, body_start)
        if end is None:
            blocks.append(Block(lang, text[body_start:], False, len(blocks) + 1))
            return blocks
        blocks.append(Block(lang, text[body_start:end.start()], True, len(blocks) + 1))
        pos = end.end()


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):  # ValueError: null bytes in the source
        return None


def _defines_model_new(code: str, tree: ast.Module | None) -> bool:
    if tree is None:
        return re.search(r"^class\s+ModelNew\b", code, re.MULTILINE) is not None
    return any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body)


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _used_names(tree: ast.Module) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _bound_names(tree: ast.Module) -> set[str]:
    """Names bound anywhere in the module (locals and arguments included)."""
    names = _top_level_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _summary(tree: ast.Module | None) -> str:
    doc = ast.get_docstring(tree) if tree is not None else None
    return doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""


def _join_helpers(blocks: list[Block], chosen: Block, tree: ast.Module) -> tuple[str, list[int]]:
    """Prepend earlier complete Python blocks that define names the chosen block uses but lacks."""
    missing = _used_names(tree) - _bound_names(tree) - set(dir(builtins))
    parts: list[str] = []
    used: list[int] = []
    for block in blocks:
        if block.index >= chosen.index or not block.closed or block.lang not in PYTHON_LANGS:
            continue
        helper = _parse(block.code)
        if helper is None or _defines_model_new(block.code, helper):
            continue
        if _top_level_names(helper) & missing:
            parts.append(block.code.rstrip() + "\n")
            used.append(block.index)
    if not parts:
        return chosen.code, []
    joined = "\n\n".join(parts + [chosen.code])
    return (joined, used) if _parse(joined) is not None else (chosen.code, [])


def extract_code(text: str | None, *, truncated: bool = False) -> Extraction:
    """The candidate module in ``text`` (the reply's content, reasoning already removed)."""
    text = (text or "").replace("\r\n", "\n")
    cut = " (the reply hit the output token limit)" if truncated else ""
    if not text.strip():
        return Extraction(None, f"the reply has no content{cut}", "truncated" if truncated else "no_code")
    blocks = fenced_blocks(text)
    if not blocks:
        return _unfenced(text, truncated)

    python = [b for b in blocks if b.lang in PYTHON_LANGS]
    with_model = [b for b in python if _defines_model_new(b.code, _parse(b.code))]
    complete = [b for b in with_model if b.closed and _parse(b.code) is not None]
    if complete:
        chosen = complete[-1]
        tree = _parse(chosen.code)
        assert tree is not None
        code, joined = _join_helpers(blocks, chosen, tree)
        note = f"block {chosen.index} of {len(blocks)} defines ModelNew"
        if joined:
            note += f", joined after block(s) {', '.join(map(str, joined))} that define names it uses"
        if len(complete) > 1:
            note += f" (the last of {len(complete)} such blocks)"
        return Extraction(code.strip("\n") + "\n", note, "ok", len(blocks), _summary(_parse(code)))

    open_block = next((b for b in with_model if not b.closed), None)
    if open_block is not None:
        if truncated:
            return Extraction(None, f"the code block defining ModelNew is cut off{cut}; no complete module", "truncated", len(blocks))
        if _parse(open_block.code) is not None:
            # The model forgot the closing fence but finished normally: the module is whole.
            return Extraction(open_block.code.strip("\n") + "\n", f"block {open_block.index} defines ModelNew (its closing fence is missing)", "ok", len(blocks), _summary(_parse(open_block.code)))
    broken = [b for b in with_model if b.closed]
    if broken:
        chosen = broken[-1]
        error = _syntax_error(chosen.code)
        # Kept: the verifier's static screen turns it into a compile error with the line, which
        # is exactly the feedback a repair turn needs.
        return Extraction(chosen.code.strip("\n") + "\n", f"block {chosen.index} defines ModelNew but does not parse: {error}", "syntax_error", len(blocks))
    if truncated and blocks and not blocks[-1].closed:
        return Extraction(None, f"the reply was cut off inside block {blocks[-1].index} before any block defined ModelNew{cut}", "truncated", len(blocks))
    langs = ", ".join(sorted({b.lang or "unlabelled" for b in blocks}))
    if not python:
        return Extraction(None, f"{len(blocks)} code block(s) ({langs}) but none in Python; the module must be one ```python block", "no_code", len(blocks))
    return Extraction(None, f"{len(python)} Python block(s) but none defines class ModelNew", "no_model_new", len(blocks))


def _unfenced(text: str, truncated: bool) -> Extraction:
    if truncated:
        return Extraction(None, "the reply hit the output token limit and has no closed code block", "truncated")
    # The whole reply may be the module, or prose followed by the module: try each line that
    # could open one (a markdown "# Plan" heading also looks like a comment, so not just the first).
    starts = [m.start() for m in _MODULE_START.finditer(text)][:50]
    candidates = [text] + [text[i:] for i in starts if i > 0]
    for code in candidates:
        tree = _parse(code)
        if tree is not None and _defines_model_new(code, tree):
            return Extraction(code.strip("\n") + "\n", "no code fence; the reply itself is a module defining ModelNew", "ok", 0, _summary(tree))
    if re.search(r"^class\s+ModelNew\b", text, re.MULTILINE):
        return Extraction(None, "no code fence, and the text around class ModelNew is not a Python module; put the module in one ```python block", "no_code")
    return Extraction(None, "no code block and no class ModelNew in the reply", "no_code")


def _syntax_error(code: str) -> str:
    try:
        ast.parse(code)
    except SyntaxError as err:
        return f"line {err.lineno}: {err.msg}"
    except ValueError as err:
        return str(err)
    return "unknown"
