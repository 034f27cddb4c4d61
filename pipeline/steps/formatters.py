"""FineWeb-2's final touches, each a step that changes a document's text and counts the documents
it changed (``changed``): ftfy's encoding fixes, PII replacement (emails, public IP addresses) and
symbol-line removal, as datatrove 0.10.1's ``FTFYFormatter``, ``PIIFormatter`` and
``SymbolLinesFormatter`` do them (``tests/test_quality_parity.py`` compares the text).
"""
from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
from typing import Any, Callable, Pattern

from ..util.errors import UserError
from .base import Document, RunInfo, Step, StepResult
from .punctuation import PUNCTUATION_SET


class TextStep(Step):
    """A step that rewrites the text of every document and keeps it."""

    counters = ("changed",)

    def __call__(self, doc: Document) -> StepResult:
        text = doc.get("text") or ""
        fixed = self.format(text)
        if fixed == text:
            return doc
        self.count("changed")
        return {**doc, "text": fixed}

    def format(self, text: str) -> str:
        raise NotImplementedError


@dataclasses.dataclass
class FtfyConfig:
    unescape_html: str | bool = "auto"
    """ftfy's TextFixerConfig keys, with datatrove's FTFYFormatter defaults."""
    remove_terminal_escapes: bool = True
    fix_encoding: bool = True
    restore_byte_a0: bool = True
    replace_lossy_sequences: bool = True
    decode_inconsistent_utf8: bool = True
    fix_c1_controls: bool = True
    fix_latin_ligatures: bool = False
    fix_character_width: bool = False
    """Off: it would turn CJK full-width punctuation half-width."""
    uncurl_quotes: bool = False
    fix_line_breaks: bool = False
    fix_surrogates: bool = True
    remove_control_chars: bool = True
    normalization: str | None = None
    """NFC, NFD, NFKC, NFKD or null (none, as datatrove)."""

    choices = {"normalization": (None, "NFC", "NFD", "NFKC", "NFKD"), "unescape_html": (True, False, "auto")}


FTFY_TRIGGERS = re.compile("[&\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\u206a-\u206f\ufeff\ufff9-\ufffc\ud800-\udfff]|\n[\u00c3\u00c2] ")
"""What any of ftfy's fixers that datatrove turns on would act on, besides mojibake: an HTML entity,
a control, C1 or surrogate character (ftfy's ``remove_control_chars``, ``fix_c1_controls``,
``fix_surrogates``, terminal escapes), and a line starting with "Ã " or "Â ", which ftfy's
mojibake pattern matches only at the start of a segment (it cuts the text after each line break)."""


@functools.cache
def badness_conditions(pattern: Pattern[str]) -> tuple[tuple[frozenset[str], ...], ...] | None:
    """What a text needs for ftfy's ``BADNESS_RE`` to match it: per alternative of the pattern, the
    character sets of those of its positions that match only non-ASCII characters (a match has one
    character of each). None if the pattern is not a plain alternation (another ftfy): then no shortcut.

    Searching the whole pattern costs about 0.2 ms per document; testing the text's characters
    against these sets a sixth of that, and most texts fail it (an ASCII text always does)."""
    try:
        from re import _constants as sre, _parser as parser
    except ImportError:  # Python < 3.11
        return None
    tree = parser.parse(pattern.pattern, pattern.flags)
    if pattern.flags & re.IGNORECASE or len(tree) != 1 or tree[0][0] is not sre.BRANCH:
        return None

    def chars(op: Any, arg: Any) -> frozenset[str] | None:
        if op is sre.LITERAL:
            return frozenset(chr(arg))
        if op is not sre.IN:
            return None
        found: set[str] = set()
        for item_op, item in arg:
            if item_op is sre.LITERAL:
                found.add(chr(item))
            elif item_op is sre.RANGE:
                found.update(map(chr, range(item[0], item[1] + 1)))
            else:  # a category or a negation: any character, nearly
                return None
        return frozenset(found)

    conditions = []
    for alternative in tree[0][1][1]:
        sets = [s for s in (chars(op, arg) for op, arg in alternative) if s and min(map(ord, s)) >= 128]
        if not sets:
            return None
        conditions.append(tuple(sets))
    return tuple(conditions)


def may_be_bad(text: str, conditions: tuple[tuple[frozenset[str], ...], ...]) -> bool:
    """False when ``BADNESS_RE`` cannot match ``text`` (``conditions`` from :func:`badness_conditions`)."""
    if text.isascii():
        return False
    present = set(text)
    return any(all(not present.isdisjoint(s) for s in sets) for sets in conditions)


class Ftfy(TextStep):
    """Fixes mojibake and other encoding damage with ftfy (``ftfy.fix_text``)."""

    name = "ftfy"
    Config = FtfyConfig
    worker_modules = ("ftfy",)

    def __init__(self, cfg: FtfyConfig, run: RunInfo = RunInfo()) -> None:
        super().__init__(cfg, run)
        self._fix: Callable[[str], str] | None = None
        self._suspect: Callable[[str], Any] | None = None
        self.plain = not (cfg.fix_latin_ligatures or cfg.fix_character_width or cfg.uncurl_quotes
                          or cfg.fix_line_breaks or cfg.normalization)

    def setup(self) -> None:
        import ftfy
        from ftfy.badness import BADNESS_RE

        config = ftfy.TextFixerConfig(**dataclasses.asdict(self.cfg))
        conditions = badness_conditions(BADNESS_RE)
        self._fix = lambda text: ftfy.fix_text(text, config=config)
        self._suspect = lambda text: (len(text) > config.max_decode_length or FTFY_TRIGGERS.search(text)
                                      or ((conditions is None or may_be_bad(text, conditions))
                                          and BADNESS_RE.search(text)))

    def format(self, text: str) -> str:
        """ftfy's fix, skipped where ftfy would change nothing: no mojibake (ftfy's own pattern, over
        the whole text rather than line by line) and nothing else its enabled fixers touch. Exact
        while the ``unsafe`` fixers (ligatures, width, quotes, line breaks, normalization) are off."""
        if self._fix is None:
            self.setup()
        if self.plain and not self._suspect(text):  # type: ignore[misc]
            return text
        return self._fix(text)  # type: ignore[misc]


EMAIL = re.compile(  # datatrove's PIIFormatter pattern
    r"\b[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:(?:[A-Za-z0-9](?:["
    r"A-Za-z0-9-]*[A-Za-z0-9])?\.)+[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?|\[(?:(?:25[0-5]|2[0-4][0-9]|["
    r"01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?|[A-Za-z0-9-]*[A-Za-z0-9]:)])")
IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)\.){3}(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)")
DIGIT_DOT_DIGIT = re.compile(r"[0-9]\.[0-9]")
"""In every IPv4 address: a text without it has none (and is searched ten times faster)."""


@dataclasses.dataclass
class PiiConfig:
    remove_emails: bool = True
    """Replace email addresses."""
    remove_ips: bool = True
    """Replace IPv4 addresses."""
    only_remove_public_ips: bool = True
    """Only addresses that are globally routable (private, loopback and reserved ones stay)."""
    email_replacement: list[str] = dataclasses.field(
        default_factory=lambda: ["email@example.com", "firstname.lastname@example.org"])
    """Replacements, used in turn."""
    ip_replacement: list[str] = dataclasses.field(default_factory=lambda: [
        "22.214.171.124", "126.96.36.199", "188.8.131.52", "184.108.40.206", "220.127.116.11", "18.104.22.168"])
    """Replacements, used in turn (datatrove's addresses, which did not answer pings)."""

    def validate(self) -> None:
        for kind in ("email", "ip"):
            if getattr(self, f"remove_{kind}s") and not getattr(self, f"{kind}_replacement"):
                raise UserError(f"{kind}_replacement: empty; give at least one replacement (or remove_{kind}s: false)")


class _Replacer:
    """Replaces each match with the next replacement in turn. The turn starts again with every
    document (datatrove's carries on from the task's previous document, so the text would depend
    on which worker saw which documents before: not the same bytes on every runner)."""

    def __init__(self, pattern: re.Pattern[str], replacements: list[str],
                 valid: Callable[[str], bool] | None = None) -> None:
        self.pattern, self.replacements, self.valid, self.turn = pattern, replacements, valid, 0

    def __call__(self, match: re.Match[str]) -> str:
        if self.valid and not self.valid(match.group(0)):
            return match.group(0)
        replacement = self.replacements[self.turn]
        self.turn = (self.turn + 1) % len(self.replacements)
        return replacement

    def sub(self, text: str) -> str:
        self.turn = 0
        return self.pattern.sub(self, text)


def _public_ip(address: str, public_only: bool) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return not public_only or ip.is_global


class Pii(TextStep):
    """Replaces email addresses and public IP addresses, as datatrove's ``PIIFormatter``."""

    name = "pii"
    Config = PiiConfig

    def __init__(self, cfg: PiiConfig, run: RunInfo = RunInfo()) -> None:
        super().__init__(cfg, run)
        self.emails = _Replacer(EMAIL, cfg.email_replacement)
        self.ips = _Replacer(IPV4, cfg.ip_replacement, lambda ip: _public_ip(ip, cfg.only_remove_public_ips))

    def format(self, text: str) -> str:
        if self.cfg.remove_emails and "@" in text:
            text = self.emails.sub(text)
        if self.cfg.remove_ips and DIGIT_DOT_DIGIT.search(text):
            text = self.ips.sub(text)
        return text


ESCAPE = re.compile(r"\\[ntr\\]")
"""A backslash escape written where YAML does not read one (unquoted, or in single quotes)."""


@dataclasses.dataclass
class SymbolLinesConfig:
    symbols_to_remove: list[str] | None = None
    """Characters a removed line consists of (with spaces); null: datatrove's punctuation set."""
    replace_char: str = ""
    """What a run of removed lines becomes ("": nothing; FineWeb-2: a line break, "\\n" in double quotes in YAML)."""

    def validate(self) -> None:
        longer = [s for s in self.symbols_to_remove or () if len(s) != 1]
        if longer:  # (a string in the config file is a list of one: its characters were never matched alone)
            raise UserError(f"symbols_to_remove holds {longer[0]!r}: give single characters, e.g. ['|', '-', '+']")
        escape = ESCAPE.search(self.replace_char)
        if escape:  # (YAML reads escapes only in double quotes: \n unquoted or in single quotes is two characters)
            raise UserError(f"replace_char holds {escape.group()} as two characters (a backslash, then "
                            f"{escape.group()[1]}), which would go into every document with a symbol line: YAML reads "
                            f'escapes only in double quotes; write "{escape.group()}" (--set \'symbol_lines.replace_char='
                            f'"{escape.group()}"\')')


class SymbolLines(TextStep):
    """Removes lines made only of symbols (table rules, separators), as datatrove's ``SymbolLinesFormatter``."""

    name = "symbol_lines"
    Config = SymbolLinesConfig

    def __init__(self, cfg: SymbolLinesConfig, run: RunInfo = RunInfo()) -> None:
        super().__init__(cfg, run)
        symbols: Any = PUNCTUATION_SET if cfg.symbols_to_remove is None else frozenset(cfg.symbols_to_remove)
        self.symbols = frozenset(symbols) | {" "}

    def format(self, text: str) -> str:
        out, in_removed = [], False
        for line in text.splitlines():
            if line.strip() and self.symbols.issuperset(line):
                if not in_removed and self.cfg.replace_char:
                    out.append(self.cfg.replace_char)
                in_removed = True
            else:
                out.append(line)
                in_removed = False
        return "\n".join(out)
