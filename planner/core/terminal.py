"""Text shown on a terminal: what a user wrote (a path, a key, a model id) is echoed back in
messages, and a control character in it would act on the terminal, not show. Escape sequences
(ESC, CSI) can clear the screen, retitle the window or hide the text after them; a bidirectional
override can reverse what follows. Each is shown as its Python escape instead (``\\x1b``,
``\\u202e``); line feeds and tabs stay, as layout.
"""

import re

#: C0 controls but tab and line feed, DEL, C1 controls (8-bit CSI 0x9b among them), and the
#: Unicode bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every character that would act on a terminal written as its escape."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
