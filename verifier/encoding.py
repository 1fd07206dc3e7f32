"""A source's declared encoding (PEP 263): the one comment Python does not ignore.

A ``# coding: NAME`` comment on a module's first line, or on its second where the first is blank
or a comment, makes Python decode the file's bytes with NAME. Everything that reads a candidate
as text (the static screen, the archive's code hash, a person reading it) sees a comment; the
import sees what NAME makes of the bytes. Under ``raw_unicode_escape`` a ``\\u000a`` inside a
comment is a line break, and the rest of the comment runs (red team: a payload hidden that way
passed the screen, was accepted, and ran in ``export --check``).

So the judge asks what the import would ask: the candidate's file is its text in UTF-8, and a
declaration is refused where Python would decode those bytes into any other text (or could not
decode them at all). Declaring UTF-8 in any spelling Python takes (``utf8``, Emacs's
``utf-8-unix``), or ASCII or Latin-1 over text that is ASCII, changes nothing and passes; a
``coding:`` comment on line 2 under a line of code is no declaration (Python ignores it, and so
does the judge: "Rotary position encoding: ..." there is a comment).
"""

from __future__ import annotations

import io
import re
import tokenize

#: Python's own pattern for the declaration (the tokenizer's)
COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
#: a line after which Python looks for the declaration on the next line: blank or a comment
_BLANK_OR_COMMENT = re.compile(r"^[ \t\f]*(?:#.*)?$")


def declared(source: str) -> str | None:
    """The encoding the source declares, as written, or None: on line 1, or on line 2 where line
    1 is blank or a comment. Lines are split as Python's tokenizer splits them (\\n, \\r\\n, \\r),
    not as ``str.splitlines`` does."""
    lines = re.split(r"\r\n|\r|\n", source.removeprefix("\ufeff"), maxsplit=2)[:2]
    for line in lines:
        found = COOKIE.match(line)
        if found:
            return found.group(1)
        if not _BLANK_OR_COMMENT.match(line):
            return None
    return None


def foreign(source: str) -> str | None:
    """The declared encoding where the import would not read this very text from its UTF-8 bytes
    (an unknown name, or one that cannot decode them, included), else None."""
    name = declared(source)
    if name is None:
        return None
    data = source.encode("utf-8", "surrogatepass")
    try:
        used, _ = tokenize.detect_encoding(io.BytesIO(data).readline)  # the import's own reading
        text = data.decode(used)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return name
    return None if text == source.removeprefix("\ufeff") or text == source else name
