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
    ("# coding: raw_unicode_escape\n", "raw_unicode_escape", True),
    ("#!/usr/bin/env python\n# vim: set fileencoding=latin-1 :\n", "latin-1", True),
    ("# coding: utf-7\n", "utf-7", True),
    ("# coding: no-such-codec\n", "no-such-codec", True),  # Python refuses to import it; so does the judge
    ("#\x0b second line to str.splitlines, not to Python\n# coding: latin-1\n", "latin-1", True),
])
def test_the_declaration_is_found_where_python_finds_it(head, name, refused):
    assert declared(head + BODY) == name
    assert (foreign(head + BODY) is not None) is refused


def test_a_declaration_past_the_second_line_is_a_comment():
    assert declared("x = 1\ny = 2\n# coding: latin-1\n") is None


def test_codes_that_declare_different_encodings_never_share_a_verdict():
    """The archive reuses a verdict for code that differs only in comments and formatting; a
    declared encoding changes what the import runs, so it is kept in the hash."""
    assert code_hash(BODY) == code_hash("# a comment\n" + BODY.replace("x = 1", "x  =  1"))
    assert code_hash(BODY) != code_hash("# coding: raw_unicode_escape\n" + BODY)
    assert code_hash("# coding: latin-1\n" + BODY) != code_hash("# coding: raw_unicode_escape\n" + BODY)
