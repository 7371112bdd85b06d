"""Text planner writes into shell scripts and shell commands: quoted, escaped, one line each.

User-controlled text (a model id or folder, a GPU file's id or path, an output folder, notes)
reaches ``launch.sh`` and the commands planner prints for copying. Two rules keep any of it from
starting a command of its own:

- ``quote``: one shell word. Printable text is POSIX single-quoted (``shlex.quote``); text with a
  control or line-breaking character is bash ANSI-C quoted (``$'...'``, bash manual "ANSI-C
  Quoting"), so the word stays on one line and still means exactly the original string.
- ``comment``: a comment line. A comment ends only at a newline (bash manual "Comments"), so every
  character that could break a line or drive a terminal (Unicode categories Cc, Cf, Zl, Zp: NUL,
  newline, carriage return, escape, U+2028 ...) is written as a visible escape instead.
"""

import shlex
import unicodedata

#: Unicode categories written as escapes: controls, format characters, line and paragraph separators.
UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}


def unsafe(ch: str) -> bool:
    """True for a character that may not appear raw in a one-line shell text."""
    return unicodedata.category(ch) in UNSAFE_CATEGORIES


def escape(ch: str) -> str:
    """A character as a bash ANSI-C escape: \\n, \\t, \\xHH, \\uHHHH or \\UHHHHHHHH."""
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` on one line, its unsafe characters (``unsafe``) written as escapes."""
    return "".join(escape(c) if unsafe(c) else c for c in text)


def quote(word: str) -> str:
    """``word`` as one shell word that bash reads back as exactly ``word``."""
    if not any(unsafe(c) for c in word):
        return shlex.quote(word)
    body = "".join(escape(c) if unsafe(c) or c == "\\" else "\\'" if c == "'" else c for c in word)
    return f"$'{body}'"


def comment(text: str) -> str:
    """``text`` as one comment line (``# `` and ``text`` with its unsafe characters escaped)."""
    return "# " + visible(text) if text else "#"
