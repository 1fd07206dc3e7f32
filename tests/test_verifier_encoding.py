"""verifier/encoding.py: a candidate declares UTF-8 or nothing (PEP 263's comment is code)."""

from __future__ import annotations

import pytest

from kernforge.archive.content import code_hash
from kernforge.verifier.encoding import declared, foreign

BODY = "x = 1\n# note\\u000ay = 2\n"


@pytest.mark.parametrize("head, name, refused", [
    ("", None, False),
    ("# -*- coding: utf-8 -*-\n", "utf-8", False),
    ("#!/usr/bin/env python\n# coding=UTF8\n", "UTF8", False),
    ("# coding: utf-8-sig\n", "utf-8-sig", False),
    ("# -*- coding: utf-8-unix -*-\n", "utf-8-unix", False),  # Emacs's spelling: Python reads UTF-8
    ("# coding: raw_unicode_escape\n", "raw_unicode_escape", True),  # the \\u000a in BODY is a line break
    ("# coding: no-such-codec\n", "no-such-codec", True),  # Python refuses to import it; so does the judge
    # Python would read this very text from the UTF-8 bytes: nothing to refuse
    ("#!/usr/bin/env python\n# vim: set fileencoding=latin-1 :\n", "latin-1", False),
    ("# coding: ascii\n", "ascii", False),
    ("#\x0b second line to str.splitlines, not to Python\n# coding: raw_unicode_escape\n", "raw_unicode_escape", True),
])
def test_the_declaration_is_found_where_python_finds_it(head, name, refused):
    assert declared(head + BODY) == name
    assert (foreign(head + BODY) is not None) is refused


@pytest.mark.parametrize("source", [
    "# coding: latin-1\n# \u00e9t\u00e9\nx = 1\n",  # UTF-8 bytes of an accent, read as Latin-1: other text
    "# coding: ascii\n# \u00e9\nx = 1\n",  # not ASCII: Python could not read it
    "# coding: utf-7\nx = 1 +2\n",  # '+' starts a UTF-7 sequence
])
def test_a_declaration_under_which_python_reads_other_text_is_refused(source):
    assert foreign(source) is not None


@pytest.mark.parametrize("source", [
    '"""Rotary embedding."""\n# Rotary position encoding: NeoX style\nx = 1\n',
    "import torch\n# decoding: one query per program\n",
])
def test_a_coding_comment_on_line_two_under_code_is_no_declaration(source):
    """Python reads line 2 only where line 1 is blank or a comment (red team G: honest rotary and
    decode-attention kernels were refused for a comment)."""
    assert declared(source) is None and foreign(source) is None


def test_a_declaration_past_the_second_line_is_a_comment():
    assert declared("x = 1\ny = 2\n# coding: latin-1\n") is None


def test_codes_that_declare_different_encodings_never_share_a_verdict():
    """The archive reuses a verdict for code that differs only in comments and formatting; a
    declared encoding changes what the import runs, so it is kept in the hash."""
    assert code_hash(BODY) == code_hash("# a comment\n" + BODY.replace("x = 1", "x  =  1"))
    assert code_hash(BODY) != code_hash("# coding: raw_unicode_escape\n" + BODY)
    assert code_hash("# coding: latin-1\n" + BODY) != code_hash("# coding: raw_unicode_escape\n" + BODY)
