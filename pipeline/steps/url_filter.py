"""The ``url_filter`` step: drops documents by their URL, from block lists the user passes, with
datatrove 0.10.1's ``URLFilter`` semantics and drop reasons (checked in this order):

- ``domain``: the registered domain (``example.co.uk``, by the Public Suffix List) is blocked;
- ``subdomain``: the full host name is blocked;
- ``url``: the exact URL is blocked;
- ``hard_blacklisted``: a banned word is one of the URL's words (split at non-alphanumerics);
- ``soft_blacklisted``: at least ``soft_word_threshold`` soft-banned words are;
- ``blacklisted_subword``: a banned sub-word occurs anywhere in the URL, lowercased, with
  everything but letters and digits removed.

Lists are text files, one entry per line, ``#`` starting a comment line; words are lowercased and
reduced to letters and digits. The Public Suffix List is tldextract's bundled snapshot (no
download at run time). Where to get lists: README ("URL filtering").
"""
from __future__ import annotations

import dataclasses
import re
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

    def store_paths(self) -> dict[str, str]:
        return {f"url_filter.{name}": getattr(self.cfg, name) for name in LISTS if getattr(self.cfg, name)}

    def prepare(self) -> None:
        """Reads the lists on the driver (they travel to the workers with the step)."""
        for name in LISTS:
            path = getattr(self.cfg, name)
            entries: set[str] = set()
            if path:
                try:
                    with fs.open_read(path) as stream:
                        lines = stream.read().decode("utf-8").splitlines()
                except (OSError, UnicodeDecodeError) as exc:
                    raise UserError(f"url_filter.{name} {path}: cannot read it ({exc})") from None
                words = name.endswith("words")
                entries = {normalize(line) if words else line.strip() for line in lines if line and line[0] != "#"}
            self.lists[name] = frozenset(entries)

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
        info = self._extract(url)
        if info.top_domain_under_public_suffix in lists["domains"]:
            return "domain"
        if info.fqdn in lists["domains"]:
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
