"""The ``url_filter`` step: drops documents by their URL, from block lists the user passes, with
datatrove 0.10.1's ``URLFilter`` semantics and drop reasons (checked in this order):

- ``domain``: the registered domain (``example.co.uk``, by the Public Suffix List) is blocked;
- ``subdomain``: the full host name is blocked;
- ``url``: the exact URL is blocked;
- ``hard_blacklisted``: a banned word is one of the URL's words (split at non-alphanumerics);
- ``soft_blacklisted``: at least ``soft_word_threshold`` soft-banned words are;
- ``blacklisted_subword``: a banned sub-word occurs anywhere in the URL, lowercased, with
  everything but letters and digits removed.

Lists are text files, one entry per line, a ``#`` first on a line making it a comment (:func:`read_list`); words
are lowercased and reduced to letters and digits, domains lowercased, and so is a URL's host before
it is compared with them (datatrove compares the host as the URL spells it: ``Example.com`` passed
its ``example.com``; host names are case-insensitive). The Public Suffix List is
tldextract's bundled snapshot (no download at run time). Where to get lists: README ("URL filtering").
"""
from __future__ import annotations

import dataclasses
import io
import re
import sys
from typing import Any

from ..output import fs
from ..util.errors import UserError
from .base import Document, Drop, RunInfo, Step, StepResult

NON_ALNUM = re.compile(r"[^a-zA-Z0-9]+")
LISTS = ("domains", "urls", "banned_words", "banned_subwords", "soft_banned_words")


def normalize(text: str) -> str:
    return NON_ALNUM.sub("", text).lower()


@dataclasses.dataclass
class UrlFilterConfig:
    domains: str | None = None
    """File of blocked domains (registered domains or full host names), local, gs:// or s3://."""
    urls: str | None = None
    """File of blocked URLs (exact)."""
    banned_words: str | None = None
    """File of words that block a URL containing one as a word."""
    banned_subwords: str | None = None
    """File of strings that block a URL containing one anywhere."""
    soft_banned_words: str | None = None
    """File of words that block a URL containing ``soft_word_threshold`` of them."""
    soft_word_threshold: int = 2
    """How many soft-banned words block a URL."""

    ranges = {"soft_word_threshold": (1, None)}


def read_list(name: str, path: str) -> set[str]:
    """The entries of list ``name`` (a :data:`LISTS` key) in file ``path``, read as datatrove reads
    its list files: a line each (ended by ``\\n``, ``\\r\\n`` or ``\\r`` only), stripped; one that
    begins with ``#`` is a comment (an indented ``  # casino`` is not: it is the word ``casino``).
    Domains are lowercased (host names are case-insensitive), an internationalized one kept in both
    forms (``bücher.de`` and the ``xn--bcher-kva.de`` that URLs carry); words reduced to ASCII
    letters and digits, lowercased. Unlike datatrove, a byte-order mark is left out (datatrove reads
    in the locale's encoding and keeps it in the first entry), and so is an entry left empty: a blank
    line, or a word with no ASCII letter or digit (``порно``, ``----``: said). Datatrove keeps the
    empty entry: as a domain it blocks every URL whose host has no registered domain (an IP address,
    ``localhost``), as a word every URL ending in ``/``."""
    try:
        with fs.open_read(path) as stream:
            data = stream.read()
    except OSError as exc:
        raise UserError(f"url_filter.{name} {path}: cannot read it ({exc})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = len(io.StringIO(data[:exc.start].decode("utf-8", "replace") + "-", newline=None).readlines())
        raise UserError(f"url_filter.{name} {path}: line {line} is not UTF-8 ({exc.reason})") from None
    import idna

    entries, unmatchable = set(), []
    for line in (line.strip() for line in io.StringIO(text, newline=None) if not line.startswith("#")):
        if not line:
            continue
        if name.endswith("words"):
            word = normalize(line)
            if word:
                entries.add(word)
            else:
                unmatchable.append(line)
        elif name == "domains":
            entries.add(line.lower())
            try:  # UTS 46 / IDNA 2008, as URLs and browsers have it (Python's "idna" codec is IDNA 2003:
                entries.add(idna.encode(line, uts46=True).decode("ascii"))  # straße.de became strasse.de)
            except (idna.IDNAError, UnicodeError):
                try:  # a name IDNA 2008 refuses and 2003 took (i❤.ws, ☃.net): registered that way
                    entries.add(line.lower().encode("idna").decode("ascii"))
                except UnicodeError:  # (not a name IDNA encodes: kept as it is)
                    pass
        else:
            entries.add(line)
    if unmatchable:
        print(f"warning: url_filter.{name} {path}: {len(unmatchable)} entries without an ASCII letter or digit "
              f"(e.g. {unmatchable[0]!r}) can never match a URL's words: left out", file=sys.stderr)
    return entries


class UrlFilter(Step):
    """Drops documents whose URL is blocked (datatrove's ``URLFilter`` with the user's lists)."""

    name = "url_filter"
    Config = UrlFilterConfig
    counters = ("domain", "subdomain", "url", "hard_blacklisted", "soft_blacklisted", "blacklisted_subword", "no_url")
    worker_modules = ("ahocorasick", "tldextract")

    def __init__(self, cfg: UrlFilterConfig, run: RunInfo = RunInfo()) -> None:
        super().__init__(cfg, run)
        self.lists: dict[str, frozenset[str]] = {}
        self._extract: Any = None
        self._subwords: Any = None

    @classmethod
    def active(cls, cfg: UrlFilterConfig) -> bool:
        return any(getattr(cfg, name) for name in LISTS)

    @classmethod
    def inactive_error(cls, cfg: UrlFilterConfig) -> str:
        keys = ", ".join(f"url_filter.{name}" for name in LISTS)
        return f"url_filter is in steps but has no lists: set one of {keys}, or take it out of steps"

    def store_paths(self) -> dict[str, str]:
        return {f"url_filter.{name}": getattr(self.cfg, name) for name in LISTS if getattr(self.cfg, name)}

    def prepare(self) -> None:
        """Reads the lists on the driver (they travel to the workers with the step)."""
        for name in LISTS:
            path = getattr(self.cfg, name)
            self.lists[name] = frozenset(read_list(name, path) if path else ())

    def setup(self) -> None:
        import ahocorasick
        from tldextract import TLDExtract

        if not self.lists:
            self.prepare()
        self._extract = TLDExtract(suffix_list_urls=(), cache_dir=None)  # the bundled snapshot, offline
        automaton = ahocorasick.Automaton(ahocorasick.STORE_INTS)
        for i, word in enumerate(sorted(self.lists["banned_subwords"])):
            automaton.add_word(word, i)
        automaton.make_automaton()
        self._subwords = automaton if self.lists["banned_subwords"] else None

    def __call__(self, doc: Document) -> StepResult:
        reason = self.check(doc.get("url") or "")
        return Drop(reason) if reason else doc

    def check(self, url: str) -> str | None:
        """The drop reason of ``url``, or None."""
        if self._extract is None:
            self.setup()
        if not url:
            return "no_url"
        lists = self.lists
        info = self._extract(url)  # (it keeps the host's case; the lists are lowercased)
        if info.top_domain_under_public_suffix.lower() in lists["domains"]:
            return "domain"
        if info.fqdn.lower() in lists["domains"]:
            return "subdomain"
        if url in lists["urls"]:
            return "url"
        words = set(NON_ALNUM.split(url))
        if not lists["banned_words"].isdisjoint(words):
            return "hard_blacklisted"
        if len(lists["soft_banned_words"] & words) >= self.cfg.soft_word_threshold:
            return "soft_blacklisted"
        if self._subwords is not None and next(self._subwords.iter(normalize(url)), False):
            return "blacklisted_subword"
        return None
