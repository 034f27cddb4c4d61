#!/usr/bin/env python3
"""Build the bundled sample under tests/data/sample/ from real text in Debian packages.

Sources (downloaded with ``apt-get download`` into ``--cache``, unpacked with ``dpkg -x``):

* ``libreoffice-help-{en-us,de,fr,es,el,ru,tr,vi,zh-cn,hi}``: HTML help pages under
  ``/usr/share/libreoffice/help/<ll>/text/`` (MPL-2.0);
* ``debian-handbook``: the Arabic (``ar-MA``) HTML edition of the Debian Administrator's Handbook
  (GPL-2.0+ or CC-BY-SA-3.0), split into one document per section.

Outputs (see tests/data/sample/SOURCES.md, written by this script):

* ``wet/sample-0000N.warc.wet.gz``: CommonCrawl-style WET files (warcinfo + ``conversion``
  records, one gzip member per record);
* ``warc/sample-0000N.warc.gz``: the same pages as WARC ``response`` records (HTTP/1.1 200 + HTML);
  WET file N is the conversion of WARC file N, record by record, as in CommonCrawl;
* ``ref/<lang>.txt``: per-language reference text from pages that are not in the WET/WARC files;
* ``manifest.json``: one entry per WET document with its language and duplicate ground truth;
* ``SOURCES.md``: packages, versions, licenses, paths and the rebuild command.

The build is deterministic: sorted inputs, seeded ``random.Random``, fixed WARC dates, record ids
from ``uuid5`` and gzip members with mtime 0. Running it twice gives byte-identical files (given
the same .deb files and the same resiliparse/zlib versions).

Needs: Debian's ``apt-get``/``dpkg``, ``resiliparse==2.0.1``; ``--verify`` also needs
``warcio==1.8.1``.
"""

from __future__ import annotations

import argparse
import base64
import glob
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
import uuid
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.html import HTMLTree, NodeType

SEED = 20240220
DOCS_PER_LANG = 186          # distinct pages per language before adding duplicates
MIN_CHARS = 300              # minimum extracted content length (characters)
MAX_CHARS = 2500             # longer pages are truncated at a block boundary
DUP_FRAC = 0.05              # pages published again at a second URL (same bytes)
NEAR_FRAC = 0.04             # near-duplicates (words edited or paragraphs reordered)
NATURAL_DUP_JACCARD = 0.3    # candidates this similar to an already chosen page are skipped
N_FILES = 4
REF_BYTES = 100_000          # reference text per language (UTF-8 bytes), one paragraph per line
REF_MIN_LINE = 25            # characters
CRAWL_START = datetime(2024, 2, 20, 21, 0, 0, tzinfo=timezone.utc)
EXTRACTED_DATE = datetime(2024, 3, 5, 10, 0, 0, tzinfo=timezone.utc)
LO_VERSION = "7.4"
RESILIPARSE_VERSION = "2.0.1"

# Versions the committed sample was built from; another version is used with a warning.
PINNED = {
    **{f"libreoffice-help-{p}": "4:7.4.7-1+deb12u14"
       for p in ("en-us", "de", "fr", "es", "el", "ru", "tr", "vi", "zh-cn", "hi")},
    "debian-handbook": "11.20220922",
}

# code (fastText lid.176 label), ISO 639-3 (as in CC's WARC-Identified-Content-Language),
# package, directory in the package, script of the language (None: Latin)
LANGS = [
    ("en", "eng", "libreoffice-help-en-us", "en-US", None),
    ("de", "deu", "libreoffice-help-de", "de", None),
    ("fr", "fra", "libreoffice-help-fr", "fr", None),
    ("es", "spa", "libreoffice-help-es", "es", None),
    ("el", "ell", "libreoffice-help-el", "el", "greek"),
    ("ru", "rus", "libreoffice-help-ru", "ru", "cyrillic"),
    ("tr", "tur", "libreoffice-help-tr", "tr", None),
    ("vi", "vie", "libreoffice-help-vi", "vi", None),
    ("zh", "zho", "libreoffice-help-zh-cn", "zh-CN", "han"),
    ("hi", "hin", "libreoffice-help-hi", "hi", "devanagari"),
    ("ar", "ara", "debian-handbook", "ar-MA", "arabic"),
]
# Languages whose help is mostly untranslated: keep only the translated blocks of each page.
PRUNE_UNTRANSLATED = {"hi", "ar"}

SCRIPTS = {
    "latin": ((0x0041, 0x005A), (0x0061, 0x007A), (0x00C0, 0x024F), (0x1E00, 0x1EFF)),
    "greek": ((0x0370, 0x03FF), (0x1F00, 0x1FFF)),
    "cyrillic": ((0x0400, 0x052F),),
    "han": ((0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF)),
    "devanagari": ((0x0900, 0x097F), (0xA8E0, 0xA8FF)),
    "arabic": ((0x0600, 0x06FF), (0x0750, 0x077F), (0x08A0, 0x08FF), (0xFB50, 0xFDFF),
               (0xFE70, 0xFEFF)),
}

LO_MODULES = {"swriter": "WRITER", "scalc": "CALC", "simpress": "IMPRESS", "sdraw": "DRAW",
              "smath": "MATH", "schart": "CHART", "sbasic": "BASIC", "sdatabase": "BASE",
              "shared": "SHARED"}

LICENSES = {
    "libreoffice": "MPL-2.0 (debian/copyright `Files: *`; the help pages are MPL-2.0, some "
                   "incorporate Apache-2.0 material)",
    "debian-handbook": "GPL-2.0+ or CC-BY-SA-3.0 (debian/copyright `Files: *`)",
}

NS = uuid.UUID("6f0c3a52-9f3b-5b8e-a7d4-2c1e8f5d9b10")


# --------------------------------------------------------------------------- packages

def run(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kw)


def deb_field(deb, field):
    return run(["dpkg-deb", "-f", deb, field]).stdout.strip()


def find_deb(cache, pkg):
    """The cached .deb of pkg: the pinned version if present, else the newest one."""
    debs = sorted(glob.glob(os.path.join(cache, f"{pkg}_*.deb")))
    if not debs:
        return None
    by_version = {deb_field(d, "Version"): d for d in debs}
    if PINNED.get(pkg) in by_version:
        return by_version[PINNED[pkg]]
    best = None
    for v in by_version:
        if best is None or subprocess.run(["dpkg", "--compare-versions", v, "gt", best]).returncode == 0:
            best = v
    return by_version[best]


def fetch(cache, pkgs):
    os.makedirs(cache, exist_ok=True)
    updated = False
    out = {}
    for pkg in pkgs:
        deb = find_deb(cache, pkg)
        if deb is None:
            for attempt in range(2):
                ok = False
                for spec in (f"{pkg}={PINNED[pkg]}", pkg):
                    r = subprocess.run(["apt-get", "download", spec], cwd=cache,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    if r.returncode == 0:
                        ok = True
                        break
                if ok or updated or os.geteuid() != 0:
                    break
                print("apt-get download failed; running apt-get update once", file=sys.stderr)
                run(["apt-get", "update"])
                updated = True
            deb = find_deb(cache, pkg)
            if deb is None:
                sys.exit(f"cannot download {pkg}: run `apt-get update` (as root) and retry")
        version = deb_field(deb, "Version")
        if version != PINNED[pkg]:
            print(f"WARNING: {pkg} {version} is not the pinned {PINNED[pkg]}: "
                  "the sample will differ from the committed one", file=sys.stderr)
        out[pkg] = (deb, version)
    return out


# --------------------------------------------------------------------------- text helpers

def script_share(text, script):
    """Share of the letters of text that belong to script."""
    ranges = SCRIPTS[script]
    letters = inside = 0
    for c in text:
        if c.isalpha():
            letters += 1
            o = ord(c)
            if any(a <= o <= b for a, b in ranges):
                inside += 1
    return inside / letters if letters else 0.0


def html_lines(html):
    """Text of HTML as CommonCrawl's WET has it: one line per block element."""
    text = extract_plain_text(html, preserve_formatting=True, main_content=False,
                              list_bullets=False, alt_texts=False, links=False,
                              form_fields=False, noscript=False)
    return [line.strip() for line in text.split("\n") if line.strip()]


def wet_text(html):
    """WET body: the page title, then the extracted lines."""
    tree = HTMLTree.parse(html)
    title = " ".join((tree.title or "").split())
    lines = html_lines(html)
    return "\n".join(([title] if title else []) + lines)


_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)


def normalize(text):
    """Close to CCNet's normalize_for_dedup: lowercase, digits -> 0, no punctuation."""
    text = unicodedata.normalize("NFC", text.lower())
    text = re.sub(r"\d", "0", text)
    text = _PUNCT.sub(" ", text)
    return text


def tokens(text, lang):
    text = normalize(text)
    if lang == "zh":
        return [c for c in text if not c.isspace()]
    return text.split()


def shingles(text, lang, n=5):
    t = tokens(text, lang)
    if len(t) < n:
        return {" ".join(t)}
    return {"\x1f".join(t[i:i + n]) for i in range(len(t) - n + 1)}


def jaccard(a, b):
    return len(a & b) / len(a | b) if a or b else 1.0


class SimilarityIndex:
    """Exact Jaccard of word 5-gram shingles against all chosen documents (inverted index)."""

    def __init__(self):
        self.postings = {}
        self.sizes = []

    def max_jaccard(self, sh):
        counts = {}
        for s in sh:
            for d in self.postings.get(s, ()):
                counts[d] = counts.get(d, 0) + 1
        best = 0.0
        for d, inter in counts.items():
            best = max(best, inter / (len(sh) + self.sizes[d] - inter))
        return best

    def add(self, sh):
        d = len(self.sizes)
        self.sizes.append(len(sh))
        for s in sh:
            self.postings.setdefault(s, []).append(d)


def qualifies(content, text, script):
    """Enough text (not just numbers or code) and, for a non-Latin language, mostly in its
    script (whole WET text, title and boilerplate included)."""
    if len(content) < MIN_CHARS:
        return False
    if sum(1 for c in content if c.isalpha()) < 0.4 * len(content):
        return False
    return script is None or script_share(text, script) >= 0.5


# --------------------------------------------------------------------------- DOM helpers

def elements(node):
    return [c for c in node.child_nodes if c.type == NodeType.ELEMENT]


def remove(node):
    if node.parent is not None:
        node.parent.remove_child(node)


def prune_untranslated(container, script, selectors):
    """Drop prose blocks of container that are not in script (untranslated paragraphs)."""
    n = 0
    for el in container.query_selector_all(selectors):
        if el.parent is None:
            continue
        text = el.text or ""
        letters = sum(1 for c in text if c.isalpha())
        if letters >= 3 and script_share(text, script) < 0.5:
            remove(el)
            n += 1
    if n:
        # containers the pruning left without text (table cells, rows, list items, ...)
        for el in reversed(list(container.query_selector_all(
                "div, table, thead, tbody, tr, td, th, ul, ol, li, dl, dt, dd, span, a"))):
            if el.parent is not None and not (el.text or "").strip() \
                    and el.query_selector("img") is None:
                remove(el)
    return n


def truncate(tree, container):
    """Remove trailing children of container until the WET text is at most MAX_CHARS."""
    html = str(tree)
    text = wet_text(html)
    if len(text) <= MAX_CHARS:
        return html, text, False
    # Estimate where to cut from the text of each child, then fix up one child at a time.
    kids = list(container.child_nodes)
    excess = len(text) - MAX_CHARS
    cut = len(kids)
    while cut > 0 and excess > 0:
        cut -= 1
        k = kids[cut]
        excess -= sum(len(x) + 1 for x in html_lines(k.html)) if k.type == NodeType.ELEMENT \
            else len((k.text or "").strip())
    for k in kids[cut:]:
        container.remove_child(k)
    kids = kids[:cut]
    html = str(tree)
    text = wet_text(html)
    while len(text) > MAX_CHARS:
        if not kids:
            return None, None, True
        container.remove_child(kids.pop())
        html = str(tree)
        text = wet_text(html)
    return html, text, True


# --------------------------------------------------------------------------- sources

class Doc:
    def __init__(self, lang, url, html, text, content, source_pkg, source_path, truncated, pruned,
                 family, key):
        self.lang, self.url, self.html, self.text, self.content = lang, url, html, text, content
        self.source_pkg, self.source_path = source_pkg, source_path
        self.truncated, self.pruned = truncated, pruned
        self.family = family      # "lo" or "handbook": how to find the content container
        self.key = key            # page path (LO) or page + section anchor (handbook)
        self.kind = "page"
        self.dup_of = self.near_dup_of = self.near_kind = None
        self.edit_fraction = self.jaccard = None


def container_of(tree, family):
    if family == "lo":
        return tree.body.query_selector("#DisplayArea")
    for el in elements(tree.body):
        if el.tag == "div" and el.getattr("id") != "banner":
            return el
    return None


class LibreOfficeHelp:
    def __init__(self, root, lang, subdir, script, pkg, en):
        self.root, self.lang, self.subdir, self.script, self.pkg = root, lang, subdir, script, pkg
        self.base = os.path.join(root, "usr/share/libreoffice/help", subdir)
        self.en = en  # LibreOfficeHelp for en-US (None for English itself)
        self._lines = {}

    def keys(self):
        return sorted(os.path.relpath(p, self.base)
                      for p in glob.glob(os.path.join(self.base, "text/**/*.html"), recursive=True))

    def url(self, rel, scheme="https", version=LO_VERSION, query=""):
        return f"{scheme}://help.libreoffice.org/{version}/{self.subdir}/{rel}{query}"

    def read(self, rel):
        with open(os.path.join(self.base, rel), encoding="utf-8") as f:
            return f.read()

    def content_lines(self, rel):
        """Extracted lines of the page's #DisplayArea (no header/footer boilerplate)."""
        if rel not in self._lines:
            path = os.path.join(self.base, rel)
            if not os.path.exists(path):
                self._lines[rel] = None
            else:
                tree = HTMLTree.parse(self.read(rel))
                area = tree.body.query_selector("#DisplayArea") if tree.body else None
                self._lines[rel] = html_lines(area.html) if area is not None else []
        return self._lines[rel]

    def untranslated_share(self, rel, lines):
        if self.en is None:
            return 0.0
        en = set(self.en.content_lines(rel) or ())
        total = sum(len(x) for x in lines)
        same = sum(len(x) for x in lines if x in en)
        return same / total if total else 1.0

    def build(self, rel):
        """The page as a sample document, or None when it does not qualify."""
        tree = HTMLTree.parse(self.read(rel))
        # scripts, stylesheet/icon links and the script-driven navigation (empty without JS)
        for s in tree.document.query_selector_all(
                'script, noscript, aside, link, meta[name="viewport"]'):
            remove(s)
        area = tree.body.query_selector("#DisplayArea") if tree.body else None
        if area is None:
            return None
        pruned = 0
        if self.lang in PRUNE_UNTRANSLATED:
            pruned = prune_untranslated(area, self.script, "p, h1, h2, h3, h4, h5, h6")
        else:
            lines = html_lines(area.html)
            if self.untranslated_share(rel, lines) > 0.3:
                return None
        html, text, truncated = truncate(tree, area)
        if html is None:
            return None
        tree = HTMLTree.parse(html)
        content = "\n".join(html_lines(container_of(tree, "lo").html))
        if not qualifies(content, text, self.script):
            return None
        return Doc(self.lang, self.url(rel), html, text, content, self.pkg,
                   f"/usr/share/libreoffice/help/{self.subdir}/{rel}", truncated, pruned, "lo", rel)

    def ref_lines(self, rel):
        lines = self.content_lines(rel) or []
        en = set(self.en.content_lines(rel) or ()) if self.en else set()
        return [x for x in lines if x not in en]

    def dup_url(self, doc, rng):
        rel = doc.key
        module = LO_MODULES.get(rel.split("/")[1], "SHARED")
        return rng.choice([
            self.url(rel, scheme="http"),
            self.url(rel, query=f"?DbPAR={module}&System=UNIX"),
            self.url(rel, version="latest"),
        ])

    def near_url(self, doc, rng):
        return self.url(doc.key, version=rng.choice(["7.3", "7.5"]))


class DebianHandbook:
    """The Arabic handbook, one document per section (the section's own text, without its
    subsections), each served as a copy of its page with the rest of the page removed."""

    def __init__(self, root, lang, subdir, script, pkg):
        self.root, self.lang, self.subdir, self.script, self.pkg = root, lang, subdir, script, pkg
        self.base = os.path.join(root, "usr/share/doc/debian-handbook/html", subdir)
        self._pages = {}

    def page(self, name):
        if name not in self._pages:
            with open(os.path.join(self.base, name), encoding="utf-8") as f:
                self._pages[name] = f.read()
        return self._pages[name]

    @staticmethod
    def units(tree):
        main = container_of(tree, "handbook")
        if main is None:
            return []
        return [main] + list(main.query_selector_all("div.section"))

    def keys(self):
        out = []
        for p in sorted(glob.glob(os.path.join(self.base, "*.html"))):
            name = os.path.basename(p)
            if name == "index.html":  # title page and table of contents
                continue
            n = len(self.units(HTMLTree.parse(self.page(name))))
            out.extend(f"{name}#{i}" for i in range(n))
        return out

    def url(self, name, anchor, scheme="https", edition="stable"):
        base = f"{scheme}://debian-handbook.info/browse/{self.subdir}/{edition}/{name}"
        return base if anchor is None else f"{base}?section={anchor}"

    def _unit(self, key, prune):
        name, idx = key.split("#")
        idx = int(idx)
        tree = HTMLTree.parse(self.page(name))
        units = self.units(tree)
        main, unit = units[0], units[idx]
        clone = unit.clone_node(True)
        for sub in clone.query_selector_all("div.section, div.toc"):
            remove(sub)
        pruned = prune_untranslated(clone, self.script, "div.para, p") if prune else 0
        main.parent.replace_child(clone, main)
        for s in tree.document.query_selector_all('script, link[rel="stylesheet"]'):
            remove(s)
        heading = clone.query_selector("h1, h2, h3, h4, h5, h6")
        anchor_el = clone.query_selector("div.titlepage a[id]")
        anchor = None
        if idx:
            anchor = (anchor_el.getattr("id") if anchor_el is not None else None) \
                or unit.getattr("id") or f"part-{idx}"
        title = " ".join((heading.text if heading is not None else "").split())
        return tree, clone, name, anchor, title, pruned

    def build(self, key):
        tree, clone, name, anchor, title, pruned = self._unit(key, prune=True)
        url = self.url(name, anchor)
        if title:
            t = tree.head.query_selector("title")
            if t is not None:
                t.text = title
        canon = tree.head.query_selector('link[rel="canonical"]')
        if canon is not None:
            canon.setattr("href", url)
        html, text, truncated = truncate(tree, clone)
        if html is None:
            return None
        tree = HTMLTree.parse(html)
        content = "\n".join(html_lines(container_of(tree, "handbook").html))
        if not qualifies(content, text, self.script):
            return None
        return Doc(self.lang, url, html, text, content, self.pkg,
                   f"/usr/share/doc/debian-handbook/html/{self.subdir}/{name}"
                   + (f" (section {anchor})" if anchor else ""),
                   truncated, pruned, "handbook", key)

    def ref_lines(self, key):
        tree, clone, *_ = self._unit(key, prune=False)
        return html_lines(clone.html)

    def dup_url(self, doc, rng):
        name, anchor = self._name_anchor(doc)
        return rng.choice([self.url(name, anchor, scheme="http"),
                           self.url(name, anchor, edition="bullseye")])

    def near_url(self, doc, rng):
        name, anchor = self._name_anchor(doc)
        return self.url(name, anchor, edition="buster")

    @staticmethod
    def _name_anchor(doc):
        m = re.match(r"https://[^/]+/browse/[^/]+/stable/([^?]+)(?:\?section=(.*))?$", doc.url)
        return m.group(1), m.group(2)


# --------------------------------------------------------------------------- selection

def choose(source, rng):
    """DOCS_PER_LANG qualifying documents in seeded order; the other keys feed the reference."""
    order = source.keys()
    rng.shuffle(order)
    chosen, rest, skipped_similar = [], [], 0
    index = SimilarityIndex()
    for key in order:
        if len(chosen) >= DOCS_PER_LANG:
            rest.append(key)
            continue
        doc = source.build(key)
        if doc is None:
            rest.append(key)
            continue
        sh = shingles(doc.text, doc.lang)
        if index.max_jaccard(sh) >= NATURAL_DUP_JACCARD:
            skipped_similar += 1   # neither in the sample nor in the reference text
            continue
        index.add(sh)
        chosen.append(doc)
    return chosen, rest, skipped_similar


_WORD = {"zh": re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]|[^\W\d_]+"),
         None: re.compile(r"[^\W\d_]+")}


def edit_words(doc, rng):
    """Near-duplicate: 1-4 % of the words of the page's paragraphs replaced, deleted or swapped."""
    tree = HTMLTree.parse(doc.html)
    area = container_of(tree, doc.family)
    word = _WORD.get(doc.lang, _WORD[None])
    paras = [p for p in area.query_selector_all("div.para, p")
             if len(word.findall(p.text or "")) >= 6]
    if not paras:
        return None
    vocab = sorted(set(word.findall(doc.content)))
    n_words = len(word.findall(doc.text))
    n_edits = max(2, round(rng.uniform(0.01, 0.04) * n_words))
    slots = [(i, j) for i, p in enumerate(paras) for j in range(len(word.findall(p.text)))]
    picked = sorted(rng.sample(slots, min(n_edits, len(slots))), reverse=True)
    texts = {i: p.text for i, p in enumerate(paras)}
    for i, j in picked:
        t = texts[i]
        spans = [m.span() for m in word.finditer(t)]
        if j >= len(spans):
            continue
        a, b = spans[j]
        op = rng.choice(["replace", "replace", "delete", "swap"])
        if op == "swap" and j + 1 < len(spans):
            c, d = spans[j + 1]
            t = t[:a] + t[c:d] + t[b:c] + t[a:b] + t[d:]
        elif op == "delete":
            t = t[:a] + t[b:].lstrip(" ") if doc.lang != "zh" else t[:a] + t[b:]
        else:
            new = rng.choice(vocab)
            if new == t[a:b]:
                new = vocab[(vocab.index(new) + 1) % len(vocab)]
            t = t[:a] + new + t[b:]
        texts[i] = t
    for i, p in enumerate(paras):
        if texts[i] != p.text:
            p.text = texts[i]
    return str(tree), len(picked) / max(1, n_words)


def reorder_blocks(doc, rng):
    """Near-duplicate: two adjacent paragraphs (sibling blocks) swapped."""
    tree = HTMLTree.parse(doc.html)
    area = container_of(tree, doc.family)
    pairs = []
    for parent in [area] + list(area.query_selector_all("div")):
        kids = elements(parent)
        for a, b in zip(kids, kids[1:]):
            ta, tb = (a.text or "").strip(), (b.text or "").strip()
            if (a.tag in ("p", "div") and b.tag in ("p", "div") and len(ta) >= 20
                    and len(tb) >= 20 and ta != tb):
                pairs.append((parent, a, b))
    if not pairs:
        return None
    parent, a, b = rng.choice(pairs)
    parent.insert_before(b, a)
    return str(tree), None


def add_duplicates(source, docs, rng):
    n = len(docs)
    idx = list(range(n))
    rng.shuffle(idx)
    n_dup, n_near = round(DUP_FRAC * n), round(NEAR_FRAC * n)
    extra = []
    for i in idx[:n_dup]:
        d = docs[i]
        c = Doc(d.lang, source.dup_url(d, rng), d.html, d.text, d.content, d.source_pkg,
                d.source_path, d.truncated, d.pruned, d.family, d.key)
        c.kind, c.dup_of = "dup", d
        extra.append(c)
    made = 0
    for i in idx[n_dup:]:
        if made >= n_near:
            break
        d = docs[i]
        kind = "reorder" if made % 5 in (1, 3) else "word_edit"
        res = (reorder_blocks if kind == "reorder" else edit_words)(d, rng)
        if res is None and kind == "reorder":
            kind, res = "word_edit", edit_words(d, rng)
        if res is None:
            continue
        html, frac = res
        text = wet_text(html)
        if normalize(text).split() == normalize(d.text).split():
            continue
        tree = HTMLTree.parse(html)
        c = Doc(d.lang, source.near_url(d, rng), html, text,
                "\n".join(html_lines(container_of(tree, d.family).html)), d.source_pkg,
                d.source_path, d.truncated, d.pruned, d.family, d.key)
        c.kind, c.near_dup_of, c.near_kind = "near_dup", d, kind
        c.edit_fraction = None if frac is None else round(frac, 4)
        c.jaccard = round(jaccard(shingles(text, d.lang), shingles(d.text, d.lang)), 3)
        extra.append(c)
        made += 1
    return extra


def reference(source, rest, docs, script):
    """Paragraphs of pages not in the sample, skipping lines that occur in the sample."""
    seen = set()
    for d in docs:
        seen.update(d.text.split("\n"))
    out, size = [], 0
    for key in rest:
        for line in source.ref_lines(key):
            if len(line) < REF_MIN_LINE or line in seen:
                continue
            if script and script_share(line, script) < 0.5:
                continue
            if not script and script_share(line, "latin") < 0.5:
                continue
            seen.add(line)
            out.append(line)
            size += len(line.encode("utf-8")) + 1
        if size >= REF_BYTES:
            break
    return out


# --------------------------------------------------------------------------- WARC writing

def sha1_b32(data):
    return "sha1:" + base64.b32encode(hashlib.sha1(data).digest()).decode("ascii")


def warc_date(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def record_id(kind, name):
    return f"<urn:uuid:{uuid.uuid5(NS, kind + ' ' + name)}>"


def warc_record(headers, block):
    head = "WARC/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    data = head.encode("utf-8") + block + b"\r\n\r\n"
    return gzip.compress(data, compresslevel=9, mtime=0)


def warcinfo(filename, date, fields):
    body = "".join(f"{k}: {v}\r\n" for k, v in fields).encode("utf-8")
    rid = record_id("warcinfo", filename)
    return rid, warc_record([
        ("WARC-Type", "warcinfo"),
        ("WARC-Date", warc_date(date)),
        ("WARC-Filename", filename),
        ("WARC-Record-ID", rid),
        ("Content-Type", "application/warc-fields"),
        ("Content-Length", str(len(body))),
    ], body)


def write_files(out, records):
    os.makedirs(os.path.join(out, "wet"), exist_ok=True)
    os.makedirs(os.path.join(out, "warc"), exist_ok=True)
    per = -(-len(records) // N_FILES)
    names = []
    for f in range(N_FILES):
        chunk = records[f * per:(f + 1) * per]
        warc_name = f"sample-{f:05d}.warc.gz"
        wet_name = f"sample-{f:05d}.warc.wet.gz"
        names.append((warc_name, wet_name))
        start = chunk[0]["date"]
        info_id, info = warcinfo(warc_name, start, [
            ("isPartOf", "polyglot-corpus-sample"),
            ("publisher", "polyglot-corpus (workflows/make_sample.py)"),
            ("description", "Not a crawl: pages from Debian packages (LibreOffice help, Debian "
                            "Administrator's Handbook) written as a CommonCrawl-style WARC"),
            ("operator", "workflows/make_sample.py"),
            ("format", "WARC File Format 1.0"),
            ("conformsTo", "https://iipc.github.io/warc-specifications/specifications/"
                           "warc-format/warc-1.0/"),
        ])
        _, wet_info = warcinfo(wet_name, EXTRACTED_DATE, [
            ("Software-Info", f"workflows/make_sample.py (resiliparse {RESILIPARSE_VERSION} "
                              "extract_plain_text)"),
            ("Extracted-Date", format_datetime(EXTRACTED_DATE, usegmt=True)),
            ("isPartOf", "polyglot-corpus-sample"),
            ("publisher", "polyglot-corpus (workflows/make_sample.py)"),
            ("description", "Not a crawl: text of pages from Debian packages, CommonCrawl WET "
                            "format"),
        ])
        with open(os.path.join(out, "warc", warc_name), "wb") as fw, \
                open(os.path.join(out, "wet", wet_name), "wb") as ft:
            fw.write(info)
            ft.write(wet_info)
            for r in chunk:
                payload = r["html"].encode("utf-8")
                http = ("HTTP/1.1 200 OK\r\n"
                        f"Date: {format_datetime(r['date'], usegmt=True)}\r\n"
                        "Content-Type: text/html; charset=utf-8\r\n"
                        f"Content-Length: {len(payload)}\r\n"
                        "\r\n").encode("ascii")
                block = http + payload
                fw.write(warc_record([
                    ("WARC-Type", "response"),
                    ("WARC-Date", warc_date(r["date"])),
                    ("WARC-Record-ID", r["warc_id"]),
                    ("Content-Length", str(len(block))),
                    ("Content-Type", "application/http; msgtype=response"),
                    ("WARC-Warcinfo-ID", info_id),
                    ("WARC-Target-URI", r["url"]),
                    ("WARC-Payload-Digest", sha1_b32(payload)),
                    ("WARC-Block-Digest", sha1_b32(block)),
                    ("WARC-Identified-Payload-Type", "text/html"),
                ], block))
                body = r["text"].encode("utf-8")
                ft.write(warc_record([
                    ("WARC-Type", "conversion"),
                    ("WARC-Target-URI", r["url"]),
                    ("WARC-Date", warc_date(r["date"])),
                    ("WARC-Record-ID", r["id"]),
                    ("WARC-Refers-To", r["warc_id"]),
                    ("WARC-Block-Digest", sha1_b32(body)),
                    ("WARC-Identified-Content-Language", r["iso3"]),
                    ("Content-Type", "text/plain"),
                    ("Content-Length", str(len(body))),
                ], body))
            r_files = (warc_name, wet_name)
            for r in chunk:
                r["warc_file"], r["wet_file"] = r_files
    return names


# --------------------------------------------------------------------------- verification

def verify(out, manifest):
    from warcio.archiveiterator import ArchiveIterator

    docs = {d["id"]: d for d in manifest["documents"]}
    by_url = {d["url"]: d for d in manifest["documents"]}
    refers, bodies = {}, {}
    seen_wet, seen_warc = set(), set()
    for path in sorted(glob.glob(os.path.join(out, "wet", "*.warc.wet.gz"))):
        with open(path, "rb") as f:
            for i, rec in enumerate(ArchiveIterator(f, check_digests=True)):
                body = rec.content_stream().read()
                assert len(body) == int(rec.rec_headers.get_header("Content-Length")), path
                assert rec.digest_checker.passed is not False, (path, rec.digest_checker.problems)
                if i == 0:
                    assert rec.rec_type == "warcinfo", path
                    continue
                assert rec.rec_type == "conversion", path
                rid = rec.rec_headers.get_header("WARC-Record-ID")
                d = docs[rid]
                assert d["url"] == rec.rec_headers.get_header("WARC-Target-URI")
                assert path.endswith(f"/{d['file']}.warc.wet.gz"), (path, d["file"])
                refers[rec.rec_headers.get_header("WARC-Refers-To")] = rid
                bodies[rid] = body
                assert sha1_b32(body) == rec.rec_headers.get_header("WARC-Block-Digest")
                seen_wet.add(rid)
    for path in sorted(glob.glob(os.path.join(out, "warc", "*.warc.gz"))):
        with open(path, "rb") as f:
            for i, rec in enumerate(ArchiveIterator(f, check_digests=True)):
                if i == 0:
                    assert rec.rec_type == "warcinfo", path
                    rec.content_stream().read()
                    continue
                assert rec.rec_type == "response", path
                assert rec.http_headers.get_statuscode() == "200"
                payload = rec.content_stream().read()
                assert len(payload) == int(rec.http_headers.get_header("Content-Length"))
                assert sha1_b32(payload) == rec.rec_headers.get_header("WARC-Payload-Digest")
                assert rec.digest_checker.passed is not False, (path, rec.digest_checker.problems)
                rid = rec.rec_headers.get_header("WARC-Record-ID")
                d = docs[refers[rid]]
                assert d is by_url[rec.rec_headers.get_header("WARC-Target-URI")]
                assert path.endswith(f"/{d['file']}.warc.gz"), (path, d["file"])
                # the WET text is the conversion of this very payload
                assert wet_text(payload.decode("utf-8")) == d["_text"], rid
                seen_warc.add(rid)
    assert seen_wet == set(docs) and seen_warc == set(refers), "record sets differ"
    # duplicate ground truth: dup_of = same bytes, near_dup_of = different text, and no other
    # two documents with the same normalized text
    groups = {}
    for rid, d in docs.items():
        if d.get("dup_of"):
            assert bodies[rid] == bodies[d["dup_of"]], rid
        if d.get("near_dup_of"):
            assert bodies[rid] != bodies[d["near_dup_of"]], rid
        key = hashlib.sha1(" ".join(normalize(bodies[rid].decode("utf-8")).split())
                           .encode("utf-8")).digest()
        groups.setdefault(key, []).append(rid)
    for ids in groups.values():
        roots = {docs[i].get("dup_of") or i for i in ids}
        assert len(roots) == 1, f"unlisted exact duplicates: {ids}"
    print(f"verified {len(seen_wet)} WET and {len(seen_warc)} WARC records", file=sys.stderr)


# --------------------------------------------------------------------------- main

SOURCES_MD = """\
# Bundled sample: sources and licenses

Everything under `tests/data/sample/` is generated by `workflows/make_sample.py` from real text in
Debian (bookworm) packages. Rebuild (deterministic; needs `apt-get`/`dpkg`, root or a warm
`--cache`, and `pip install resiliparse==2.0.1 warcio==1.8.1`):

```
python3 workflows/make_sample.py --cache ~/.cache/polyglot-corpus/debs --out tests/data/sample --verify
```

The script runs `apt-get download` for the packages below (pinned versions first) into `--cache`
and unpacks them with `dpkg -x`; nothing else is fetched. With the same .deb files and the same
resiliparse/zlib versions the output is byte-identical (seed {seed}, fixed WARC dates, `uuid5`
record ids, gzip mtime 0).

## Packages

| language | package | version | license | paths used |
|---|---|---|---|---|
{package_rows}

The LibreOffice help pages are MPL-2.0 (`Files: *` in the packages' `debian/copyright`; some pages
incorporate Apache-2.0 licensed material). The Debian Administrator's Handbook is
"GPL-2.0+ or CC-BY-SA-3.0" (`/usr/share/doc/debian-handbook/copyright`). The HTML is
redistributed with `<script>`, `<noscript>`, `<link>` and the script-driven `<aside>` navigation
removed (LibreOffice; the rest of each page is as shipped) and, for the handbook, cut into one page
per section with the stylesheet links removed; the CSS/JS/image files the pages refer to are not
included.

## Parts

* `wet/sample-0000N.warc.wet.gz` ({n_files} files): CommonCrawl WET format. A `warcinfo` record,
  then one WARC/1.0 `conversion` record per page (`WARC-Target-URI`, `WARC-Date`,
  `WARC-Record-ID`, `WARC-Refers-To` = id of the `response` record in the matching WARC file,
  `WARC-Block-Digest` = `sha1:` + base32, `WARC-Identified-Content-Language` (ISO 639-3),
  `Content-Type: text/plain`, `Content-Length`), each record its own gzip member. The body is the
  page title, then the text of the HTML (resiliparse `extract_plain_text`, no list bullets / alt
  texts / form fields), one line per block element, empty lines dropped. Languages are mixed
  across files. WET file N is the conversion of WARC file N, in the same record order.
* `warc/sample-0000N.warc.gz`: the same pages as WARC/1.0 `response` records (`HTTP/1.1 200 OK`,
  `Content-Type: text/html; charset=utf-8`, then the HTML) with `WARC-Payload-Digest` and
  `WARC-Block-Digest`, one gzip member per record, after a `warcinfo` record.
* `ref/<lang>.txt`: reference text per language (one paragraph per line, UTF-8, about
  {ref_kb} KB each) for KenLM / SentencePiece training: lines of help pages (handbook sections for
  `ar`) that are **not** in the WET/WARC files, without lines that also occur in a sample page,
  without lines shorter than {ref_min} characters, without lines identical to the English page
  (untranslated) and, for non-Latin scripts, without lines mostly outside the script.
* `manifest.json`: per-language counts and package versions (`languages`), and one entry per WET
  document (`documents`): `id` (the WET record's `WARC-Record-ID`; the WARC `response` record is
  its `WARC-Refers-To`, and every URL occurs once), `url`, `lang` (fastText lid.176 label), `file`
  (`wet/<file>.warc.wet.gz`, `warc/<file>.warc.gz`), `chars` (of the WET body), and, only where
  they apply: `truncated`, `pruned_blocks`, and the duplicate ground truth: `dup_of` (WET id of
  the original, for the same page published at a second URL: same bytes), `near_dup_of` with
  `near_dup_kind` (`word_edit`: 1–4 % of the words of its paragraphs replaced, deleted or swapped,
  `edit_fraction` = edits / words of the document; `reorder`: two adjacent paragraphs swapped) and
  `jaccard` (word 5-gram shingles of the normalized text vs the original).

## How the pages were chosen

* Per language, page paths are sorted, shuffled with `random.Random("{seed}:<lang>")` and taken in
  that order until {per_lang} pages qualify: at least {min_chars} characters of content text,
  longer pages truncated (trailing blocks removed) to at most {max_chars} characters of WET text
  (`truncated: true`).
* Mostly untranslated pages are skipped: for `de fr es el ru tr vi zh` a page qualifies when at most
  30 % of its content text is in lines identical to the `en-US` page and, for non-Latin scripts,
  at least half its letters are in the script.
* A candidate whose word 5-gram Jaccard similarity to an already chosen page of the language is
  ≥ {natural} is skipped (and not used for the reference text either), so the only document-level
  duplicates are the ones listed in the manifest. Paragraph-level boilerplate that the help pages
  share (header, "Help content debug info" footer, "To access this command...", navigation) is
  kept, as a crawl has it.
* ~{dup_pct} % of the pages are published again at a second URL (`http://` mirror, `?DbPAR=...`
  variant, `latest` / `bullseye` alias) with a different record id and date and the same bytes;
  ~{near_pct} % get a near-duplicate at another version's URL (`7.3`/`7.5`, `buster`).
* Records of all languages are shuffled together and split into {n_files} files; dates increase
  from {crawl_start} by 1–30 s per record.

## Known limitations of the sources

* **Hindi**: `libreoffice-help-hi` is almost entirely untranslated (about 4 % of its text is in
  Devanagari; only a handful of pages are mostly Hindi). The `hi` documents are therefore help pages
  with their untranslated (non-Devanagari) `<p>`/`<h1-6>` blocks removed (`pruned_blocks` in the
  manifest); page titles and the header/footer boilerplate stay as they are, often in English.
  Pruning also drops the containers (table cells, list items, ...) it leaves empty. Even so,
  barely more `hi` pages qualify than the sample takes, and many `hi` documents are short lists of
  translated UI labels; `ref/hi.txt` keeps only Devanagari lines.
* **Arabic**: the `ar-MA` handbook is partly translated; untranslated paragraphs
  (`div.para`/`p` mostly in Latin script) are removed from each section page the same way;
  code blocks stay. Sections are served at `...?section=<id>` URLs.
* `zh`, `vi`, `ru`, `tr` help is only partly translated: pages that are mostly English are skipped;
  the chosen pages may still contain some untranslated lines.

## Counts

| lang | documents | of which `dup_of` | `near_dup_of` | truncated | ref lines | ref bytes |
|---|---|---|---|---|---|---|
{count_rows}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/polyglot-corpus/debs"),
                    help="directory for the downloaded .deb files")
    ap.add_argument("--out", default="tests/data/sample", help="output directory")
    ap.add_argument("--verify", action="store_true",
                    help="parse the output back with warcio and check every record")
    args = ap.parse_args()

    from importlib.metadata import version as dist_version
    ver = dist_version("resiliparse")
    if ver and ver != RESILIPARSE_VERSION:
        print(f"WARNING: resiliparse {ver}, the sample was built with {RESILIPARSE_VERSION}",
              file=sys.stderr)

    pkgs = sorted({spec[2] for spec in LANGS})
    debs = fetch(args.cache, pkgs)
    work = tempfile.mkdtemp(prefix="make_sample_")
    try:
        roots = {}
        for pkg, (deb, _) in sorted(debs.items()):
            roots[pkg] = os.path.join(work, pkg)
            os.makedirs(roots[pkg])
            run(["dpkg", "-x", deb, roots[pkg]])

        en = None
        t0 = time.monotonic()
        records, refs, stats = [], {}, {}
        for lang, iso3, pkg, subdir, script in LANGS:
            rng = random.Random(f"{SEED}:{lang}")
            if pkg == "debian-handbook":
                source = DebianHandbook(roots[pkg], lang, subdir, script, pkg)
            else:
                source = LibreOfficeHelp(roots[pkg], lang, subdir, script, pkg, en)
                if lang == "en":
                    en = source
            docs, rest, skipped = choose(source, rng)
            if len(docs) < DOCS_PER_LANG:
                print(f"WARNING: {lang}: only {len(docs)} qualifying pages", file=sys.stderr)
            extra = add_duplicates(source, docs, rng)
            refs[lang] = reference(source, rest, docs + extra, script)
            stats[lang] = dict(pages=len(docs), skipped_similar=skipped, pkg=pkg, subdir=subdir)
            for d in docs + extra:
                d.iso3 = iso3
                records.append(d)
            print(f"{lang}: {len(docs)} pages + {len(extra)} duplicates, "
                  f"[{time.monotonic() - t0:.0f} s] "
                  f"{skipped} skipped as similar, ref {len(refs[lang])} lines", file=sys.stderr)

        rng = random.Random(f"{SEED}:files")
        rng.shuffle(records)
        t = CRAWL_START
        rows = []
        for d in records:
            t += timedelta(seconds=rng.randint(1, 30))
            d.date = t
            d.id = record_id("conversion", d.url)
            d.warc_id = record_id("response", d.url)
        assert len({d.url for d in records}) == len(records), "duplicate URLs"
        for d in records:
            rows.append(dict(
                id=d.id, warc_id=d.warc_id, url=d.url, lang=d.lang, iso3=d.iso3, date=d.date,
                html=d.html, text=d.text, d=d))
        out = args.out
        for sub in ("wet", "warc", "ref"):
            shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
        os.makedirs(os.path.join(out, "ref"), exist_ok=True)
        names = write_files(out, rows)

        documents = []
        for r in rows:
            d = r["d"]
            x = dict(id=d.id, url=d.url, lang=d.lang, file=r["wet_file"].split(".")[0],
                     chars=len(d.text))
            # optional keys only where they apply, to keep the manifest small
            if d.truncated:
                x["truncated"] = True
            if d.pruned:
                x["pruned_blocks"] = d.pruned
            if d.dup_of:
                x["dup_of"] = d.dup_of.id
            if d.near_dup_of:
                x.update(near_dup_of=d.near_dup_of.id, near_dup_kind=d.near_kind,
                         jaccard=d.jaccard)
                if d.edit_fraction is not None:
                    x["edit_fraction"] = d.edit_fraction
            documents.append(x)
        langs = {}
        for lang, iso3, pkg, subdir, script in LANGS:
            mine = [x for x in documents if x["lang"] == lang]
            langs[lang] = dict(
                documents=len(mine), pages=stats[lang]["pages"],
                dup=sum(1 for x in mine if x.get("dup_of")),
                near_dup=sum(1 for x in mine if x.get("near_dup_of")),
                package=pkg, package_version=debs[pkg][1], ref=f"ref/{lang}.txt")
        manifest = dict(
            description="Ground truth for the bundled sample, written by workflows/make_sample.py "
                        "(see SOURCES.md). One entry per WET record: id = its WARC-Record-ID, "
                        "file = wet/<file>.warc.wet.gz and warc/<file>.warc.gz; the response "
                        "record is the WET record's WARC-Refers-To; URLs are unique. Optional: "
                        "truncated, pruned_blocks, dup_of (same bytes at a second URL), "
                        "near_dup_of + near_dup_kind (word_edit|reorder) + jaccard (word 5-gram "
                        "shingles vs the original) + edit_fraction.",
            seed=SEED,
            wet_files=[f"wet/{w}" for _, w in names], warc_files=[f"warc/{a}" for a, _ in names],
            languages=langs, documents=documents)
        with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
            f.write("{\n")
            for k in ("description", "seed", "wet_files", "warc_files"):
                f.write(f"  {json.dumps(k)}: {json.dumps(manifest[k], ensure_ascii=False, sort_keys=True)},\n")
            f.write('  "languages": {\n')
            f.write(",\n".join(f"    {json.dumps(k)}: {json.dumps(v, sort_keys=True)}"
                               for k, v in langs.items()))
            f.write('\n  },\n  "documents": [\n')
            f.write(",\n".join("    " + json.dumps(x, ensure_ascii=False, sort_keys=True)
                               for x in documents))
            f.write("\n  ]\n}\n")

        count_rows = []
        for lang, iso3, pkg, subdir, script in LANGS:
            text = "".join(x + "\n" for x in refs[lang])
            with open(os.path.join(out, "ref", f"{lang}.txt"), "w", encoding="utf-8") as f:
                f.write(text)
            L = langs[lang]
            count_rows.append(
                f"| {lang} | {L['documents']} | {L['dup']} | {L['near_dup']} | "
                f"{sum(1 for x in documents if x['lang'] == lang and x.get('truncated'))} | "
                f"{len(refs[lang])} | {len(text.encode('utf-8'))} |")

        package_rows = []
        for lang, iso3, pkg, subdir, script in LANGS:
            if pkg == "debian-handbook":
                lic = "GPL-2.0+ or CC-BY-SA-3.0"
                paths = f"`/usr/share/doc/debian-handbook/html/{subdir}/*.html` (not index.html)"
            else:
                lic = "MPL-2.0"
                paths = f"`/usr/share/libreoffice/help/{subdir}/text/**/*.html`"
            package_rows.append(f"| {lang} | `{pkg}` | `{debs[pkg][1]}` | {lic} | {paths} |")
        with open(os.path.join(out, "SOURCES.md"), "w", encoding="utf-8") as f:
            f.write(SOURCES_MD.format(
                seed=SEED, package_rows="\n".join(package_rows), n_files=N_FILES,
                ref_kb=REF_BYTES // 1000, ref_min=REF_MIN_LINE, per_lang=DOCS_PER_LANG,
                min_chars=MIN_CHARS, max_chars=MAX_CHARS, natural=NATURAL_DUP_JACCARD,
                dup_pct=round(DUP_FRAC * 100), near_pct=round(NEAR_FRAC * 100),
                crawl_start=warc_date(CRAWL_START), count_rows="\n".join(count_rows)))

        if args.verify:
            for x, r in zip(documents, rows):
                x["_text"] = r["text"]
            verify(out, dict(documents=documents))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
