"""Read CommonCrawl WET and WARC files into documents, routing bad records to ``rejected``.

fastwarc parses the records. Around it, this module splits the file into gzip members itself
(CommonCrawl gzips every record separately) because fastwarc, given a whole file, ends the
iteration at the first malformed record and reads a truncated record as if it were complete.
Splitting by member gives every record its compressed offset (as in CommonCrawl's index), lets a
corrupt or truncated member be reported and skipped, and resynchronises after garbage bytes.
Uncompressed files are read whole and resynchronised on the next ``WARC/1.`` line.

A gzipped WET file is first read the fast way, by one fastwarc iterator over the whole file
(:meth:`RecordReader._read_whole`), as long as every record is shown to fill its own gzip member
exactly; from the first record that is not, reading goes on member by member from that record's
member, so the results are the same either way (``tests/test_warc.py`` compares both on every
corruption it tries). Splitting in Python cost about 3 times fastwarc's whole-file iteration.

Every record ends as exactly one of: a :class:`Document`, a :class:`Drop` (records that are
normal but not text, e.g. ``warcinfo`` or a non-HTML response: counted) or a :class:`Rejected`
(truncated, not decodable, wrong type, missing headers, lying Content-Length: counted and
written to ``<out>/rejected/``).
"""
from __future__ import annotations

import codecs
import dataclasses
import importlib
import io
import itertools
import re
import zlib
from typing import Any, BinaryIO, Iterable, Iterator, Union

from fastwarc.stream_io import GzipReader
from fastwarc.warc import ArchiveIterator, WarcRecord

from ..steps.base import Document, Drop, Note, Rejected

GZIP_MAGIC = b"\x1f\x8b\x08"
LINE_BREAK = re.compile(r"\r\n|\r|\n")  # what Python's text mode (CCNet's WET reader) splits lines at
LINE_TO_CLEAN = re.compile(r"\n(?:\s|(?<=\s\n))")
"""A ``\\n`` with whitespace (``str.strip``'s, ``\\n`` included) after or before it: a line to strip
or an empty line."""
CHUNK = 1 << 22
WINDOW = 1 << 16
RAW_PREVIEW = 2048
REQUIRED_HEADERS = ("WARC-Record-ID", "WARC-Target-URI", "WARC-Date")
SKIPPED_TYPES = {"warcinfo", "request", "metadata", "revisit", "resource"}
HTML_TYPES = ("text/html", "application/xhtml+xml")
HTTP_HEAD_END = re.compile(rb"\r?\n\r?\n")
CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]+")
CODING_ALIASES = {"x-gzip": "gzip"}
"""HTTP content codings under another name (RFC 9110: x-gzip is gzip)."""
CODINGS = {"gzip", "x-gzip", "deflate", "br", "zstd", "compress", "x-compress", "dcb", "dcz", "exi", "pack200-gzip",
           "aes128gcm"}
"""IANA's HTTP content codings: a body in one this reader cannot undo is dropped (its bytes are no
text); any other label is taken for a server's mistake and the body kept as it is."""

ReadResult = Union[Document, Drop, Note, Rejected]


@dataclasses.dataclass(frozen=True)
class Member:
    """One gzip member (or one uncompressed file): where it starts and what it held."""

    offset: int
    length: int
    data: bytes
    error: str = ""  # "", "garbage", "corrupt_gzip" or "truncated"
    detail: str = ""
    compressed: bool = True


_WHOLE = Member(0, 0, b"")  # what a record of the fast path is read from: a complete member


class _Buffered:
    """A byte stream read in chunks, with the file offset of the current position. The buffer is a
    bytearray, grown and cut in place: a member kept whole while it is inflated (``more(keep_from)``)
    is not copied again at every chunk."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.buf, self.pos, self.base, self.eof = stream, bytearray(), 0, 0, False

    @property
    def offset(self) -> int:
        return self.base + self.pos

    def available(self) -> int:
        return len(self.buf) - self.pos

    def more(self, keep_from: int | None = None) -> bool:
        """Read the next chunk, dropping what was consumed (only what lies before file offset
        ``keep_from``, when given: the start of a member that may need scanning again). False at
        end of stream."""
        chunk = b"" if self.eof else self.stream.read(CHUNK)
        if not chunk:
            self.eof = True
            return False
        drop = self.pos if keep_from is None else min(self.pos, keep_from - self.base)
        self.base += drop
        del self.buf[:drop]
        self.buf += chunk
        self.pos -= drop
        return True

    def skip_to_magic(self) -> int:
        """Advance to the next gzip magic after the current position (or the end); return the
        number of bytes skipped."""
        start, after = self.offset, 1
        while True:
            i = self.buf.find(GZIP_MAGIC, self.pos + after)
            if i >= 0:
                self.pos = i
                return self.offset - start
            # keep the last bytes in case a magic straddles the chunk boundary (searched from their first)
            self.pos, after = max(min(self.pos + after, len(self.buf)), len(self.buf) - len(GZIP_MAGIC) + 1), 0
            if not self.more():
                self.pos = len(self.buf)
                return self.offset - start


def iter_gzip_members(stream: BinaryIO, base: int = 0) -> Iterator[Member]:
    """Split a (multi-member) gzip stream into members, reporting garbage, corruption and truncation.
    ``base``: the file offset the stream starts at."""
    src = _Buffered(stream)
    src.base = base
    while src.available() or src.more():
        if src.available() < len(GZIP_MAGIC) and not src.eof:
            src.more()
        start = src.offset
        if src.buf[src.pos:src.pos + len(GZIP_MAGIC)] != GZIP_MAGIC:
            skipped = src.skip_to_magic()
            yield Member(start, skipped, b"", "garbage", f"{skipped} bytes that are not gzip data")
            continue
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        parts: list[bytes] = []
        try:
            while not inflater.eof:
                if not src.available() and not src.more(keep_from=start):
                    yield Member(start, src.offset - start, b"".join(parts), "truncated",
                                 "file ends inside this gzip member")
                    return
                with memoryview(src.buf) as view, view[src.pos:src.pos + WINDOW] as window:  # (released: the
                    parts.append(inflater.decompress(window))                           # buffer then grows)
                    src.pos += len(window) - len(inflater.unused_data)
        except zlib.error as exc:
            # resume scanning one byte after this member's start (kept in the buffer by more())
            src.pos = start - src.base + 1
            skipped = src.skip_to_magic() + 1
            yield Member(start, skipped, b"", "corrupt_gzip", str(exc))
            continue
        yield Member(start, src.offset - start, b"".join(parts))


def iter_members(stream: BinaryIO, path: str) -> Iterator[Member]:
    """Gzip members of a ``.gz`` file, or the whole content of an uncompressed one."""
    head = stream.read(len(GZIP_MAGIC))
    rest = io.BufferedReader(_Prepend(head, stream)) if head else stream
    if head == GZIP_MAGIC or path.endswith(".gz"):
        yield from iter_gzip_members(rest)  # a .gz with a bad head is reported as garbage
    else:
        data = rest.read()
        yield Member(0, len(data), data, compressed=False)


class _Tee(io.RawIOBase):
    """The stream fastwarc reads, whose bytes are kept from offset ``base`` on: the fast path reads
    gzip trailers in them, and the member-by-member path resumes from them (:meth:`rest`)."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream, self.kept, self.base = stream, bytearray(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.stream.read(len(b))
        b[:len(data)] = data
        self.kept += data
        return len(data)

    @property
    def end(self) -> int:
        """The offset after the last byte read."""
        return self.base + len(self.kept)

    def tell(self) -> int:
        return self.end

    def at(self, start: int, end: int) -> bytes:
        return bytes(self.kept[start - self.base:end - self.base])

    def forget(self, offset: int) -> None:
        """Drop the bytes before ``offset``."""
        del self.kept[:offset - self.base]
        self.base = offset

    def rest(self, offset: int) -> BinaryIO:
        """The file from ``offset`` (kept) on."""
        return io.BufferedReader(_Prepend(self.at(offset, self.end), self.stream))


def member_holds(data: bytes, size: int) -> bool:
    """Whether ``data`` is exactly one complete gzip member of ``size`` uncompressed bytes."""
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    try:
        return len(inflater.decompress(data)) == size and inflater.eof and not inflater.unused_data
    except zlib.error:
        return False


class _Prepend(io.RawIOBase):
    """A raw stream that first returns ``head`` then reads from ``stream``."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self.head, self.stream = head, stream

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        if self.head:
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.stream.read(len(b))
        b[: len(data)] = data
        return len(data)


@dataclasses.dataclass
class RecordReader:
    """Turns WARC/WET records of one file into documents, drops and rejections."""

    source: str
    fmt: str  # "wet" or "warc"
    verify_digests: bool = True
    title: bool = True  # the first line of a WET body (an HTML page's <title>) goes to "title", not "text"
    empty_lines: bool = False  # keep empty lines in "text" (CCNet's raw_content)
    min_length: int = 0  # documents with a shorter text are dropped at read, before any dedup (CCNet: 300)
    notes: list[Note] = dataclasses.field(default_factory=list, repr=False)  # of records being converted

    def read(self, stream: BinaryIO) -> Iterator[ReadResult]:
        """The file's records; an empty file, or one without a record (an empty gzip stream, say: a
        download cut short), is one rejection."""
        head = stream.read(len(GZIP_MAGIC))
        if not head:
            yield self._reject(0, "empty_file", "the file is empty", b"")
            return
        rest = io.BufferedReader(_Prepend(head, stream))
        yield from self._or_none(self._read_whole(rest) if head == GZIP_MAGIC and self.fmt == "wet" else
                                 self._read_members(iter_members(rest, self.source)))

    def _or_none(self, results: Iterable[ReadResult]) -> Iterator[ReadResult]:
        """``results``, or one ``no_records`` rejection where there are none."""
        found = False
        for found, result in zip(itertools.repeat(True), results):
            yield result
        if not found:
            yield self._reject(0, "no_records", "no WARC record in the file", b"")

    def _read_whole(self, stream: BinaryIO) -> Iterator[ReadResult]:
        """A gzipped WET file through one fastwarc iterator, each record's result held back until
        its gzip member is shown to hold it and nothing else: the member's ISIZE trailer (fastwarc
        checks it and the CRC) equals the record's header, block and separator, the next record
        starts in the next member, and the last member, inflated again, ends at the end of the
        file. A record that is not so, or that is rejected (its rejection needs the member's bytes),
        or a read error, hands over to :meth:`_read_members` from that record's member on."""
        tee, held = _Tee(stream), None  # held: (member offset, uncompressed size, result)
        try:
            for record in ArchiveIterator(GzipReader(tee), parse_http=False, stream_detect=False, fsspec_args=False):
                start = record.stream_pos
                if held is None and start != tee.base:  # (the first record after bytes that are not one:
                    break                                 # fastwarc gives it the offset of what it read next)
                if held is not None:  # (a start that does not move on would read the trailer at the wrong place)
                    if start <= held[0] or int.from_bytes(tee.at(start - 4, start), "little") != held[1] & 0xFFFFFFFF:
                        break
                    yield held[2]
                    if start - tee.base > CHUNK:  # now and then: each forget moves what is kept after it
                        tee.forget(start)
                size = record.headers.write(io.BytesIO()) + record.content_length + 4
                held = (start, size, self._convert(record, _WHOLE, start, b""))
                if isinstance(held[2], Rejected):
                    break
            else:
                while tee.readinto(bytearray(CHUNK)):  # fastwarc may stop before trailing bytes
                    pass
                if held is not None and member_holds(tee.at(held[0], tee.end), held[1]):
                    yield held[2]
                    return
        except OSError:
            pass
        resume = held[0] if held is not None else tee.base
        yield from self._read_members(iter_gzip_members(tee.rest(resume), resume))

    def _read_members(self, members: Iterable[Member]) -> Iterator[ReadResult]:
        for member in members:
            if member.error in ("garbage", "corrupt_gzip"):
                yield self._reject(member.offset, member.error, member.detail, b"")
                continue
            for result in self._records(member):
                yield from self.notes
                self.notes.clear()
                yield result

    def _reject(self, offset: int, reason: str, detail: str, raw: bytes, record_id: str = "") -> Rejected:
        preview = raw[:RAW_PREVIEW].decode("utf-8", errors="replace")
        return Rejected(self.source, offset, reason, detail, record_id, preview)

    def _records(self, member: Member) -> Iterator[ReadResult]:
        """Parse the records of one member.

        fastwarc reports a malformed record only when it fails to parse the *next* one, so each
        result is held back until the parser has moved past it. On a failure, the held record
        is blamed (``content_length_mismatch``) if its block does not end where its
        Content-Length says; otherwise the bytes after it are ``unparseable``. Parsing resumes
        at the next ``WARC/1.`` line.
        """
        data, start = member.data, 0

        def where(pos: int) -> int:  # a record's offset: its gzip member's, or its own if uncompressed
            return member.offset if member.compressed else member.offset + pos

        while start < len(data.rstrip()):
            pending: tuple[int, int, ReadResult] | None = None
            try:
                for record in ArchiveIterator(io.BytesIO(data[start:]), parse_http=False):
                    if pending is not None:
                        yield pending[2]
                    pos = start + record.stream_pos
                    declared = record.content_length
                    raw = data[pos:pos + RAW_PREVIEW]
                    if data.find(b"\r\n\r\n", pos) < 0 and data.find(b"\n\n", pos) < 0:  # no end of header
                        where_cut = "gzip member" if member.compressed and member.error != "truncated" else "file"
                        result = self._reject(where(pos), "truncated", f"the {where_cut} ends inside this record's header", raw)
                    else:
                        result = self._convert(record, member, where(pos), raw)
                    pending = (pos, declared, result)
                    if member.error == "truncated":
                        break
            except OSError as exc:
                if pending is None:
                    reason = "truncated" if member.error == "truncated" else "unparseable"
                    yield self._reject(where(start), reason, f"not a WARC record: {exc}", data[start:_next(data, start)])
                    resume = start
                else:
                    pos, declared, result = pending
                    block_end = data.find(b"\r\n\r\n", pos) + 4 + declared
                    if data[block_end:block_end + 4] == b"\r\n\r\n":
                        yield result
                        resume = block_end + 4
                        yield self._reject(where(resume), "unparseable", f"not a WARC record: {exc}",
                                           data[resume:_next(data, resume)])
                    else:
                        record_id = result.record_id if isinstance(result, Rejected) else (
                            result.get("id", "") if isinstance(result, dict) else "")
                        yield self._reject(where(pos), "content_length_mismatch",
                                           "bytes left after the record's declared Content-Length", data[pos:], record_id)
                        resume = pos
                start = _next(data, resume)
                continue
            if pending is not None:
                yield pending[2]
            return
        if member.error == "truncated" and not data.strip():
            yield self._reject(member.offset, "truncated", member.detail, b"")

    def _convert(self, record: WarcRecord, member: Member, offset: int, raw: bytes) -> ReadResult:
        # one pass over fastwarc's HeaderMap (its get() is ~2 us a call); names are case-insensitive
        headers = {name.lower(): value for name, value in record.headers.items()}
        record_id = headers.get("warc-record-id", "")
        rtype = headers.get("warc-type", "")
        expected = "conversion" if self.fmt == "wet" else "response"
        if rtype != expected:
            if rtype in SKIPPED_TYPES:
                return Drop(f"skipped_{rtype}")
            return self._reject(offset, "unexpected_type", f"WARC-Type {rtype!r} in a {self.fmt} file", raw, record_id)
        missing = [h for h in REQUIRED_HEADERS if not headers.get(h.lower())]
        if missing:
            return self._reject(offset, "missing_header", "missing " + ", ".join(missing), raw, record_id)
        declared = record.content_length  # fastwarc lowers it to what it could read
        digest_ok = not (self.verify_digests and headers.get("warc-block-digest")) or record.verify_block_digest()
        block = record.reader.read()
        if len(block) < declared:
            reason = "truncated" if member.error == "truncated" else "content_length_mismatch"
            return self._reject(offset, reason,
                                f"Content-Length {declared} but {len(block)} bytes present", raw, record_id)
        if not digest_ok:
            return self._reject(offset, "digest_mismatch", "WARC-Block-Digest does not match the block", raw, record_id)
        title = None
        if self.fmt == "wet":
            try:
                text = block.decode("utf-8")
            except UnicodeDecodeError as exc:
                return self._reject(offset, "not_utf8", f"invalid UTF-8 at byte {exc.start} of the body", raw, record_id)
            digest = headers.get("warc-block-digest", "")
        else:
            try:
                converted = _html_text(block, headers.get("warc-identified-payload-type", ""))
            except Exception as exc:  # noqa: BLE001 (a parser's failure on one page's bytes ends that record only)
                return self._reject(offset, "undecodable_http", f"{type(exc).__name__}: {exc}", raw, record_id)
            if isinstance(converted, Drop):
                return converted
            (title, text, notes), digest = converted, headers.get("warc-payload-digest", "")
            self.notes.extend(notes)
        title, body, nlines = self._body(text, title)
        if not body.strip():  # a page with a title and nothing else is a normal record that is not text, as is
            if title or self.fmt == "warc":  # an HTML page without text (one its scripts fill, say)
                return Drop("skipped_title_only" if title else "skipped_no_text")
            return self._reject(offset, "empty", "no text in the record", raw, record_id)
        if len(body) < self.min_length:
            return Drop("too_short")
        return {
            "id": record_id,
            "url": headers.get("warc-target-uri", ""),
            "date": headers.get("warc-date", ""),
            "digest": digest,
            "source": self.source,
            "title": title,
            "text": body,
            "nlines": nlines,
            "length": len(body),
            "original_nlines": nlines,
            "original_length": len(body),
            "content_length": declared,
        }

    def _body(self, text: str, title: str | None) -> tuple[str | None, str, int]:
        """The title, the body (the lines :meth:`_lines` keeps, joined by ``\\n``) and its number of
        lines. Where no line needs stripping, none is empty and there is no ``\\r`` (all 53,328 bodies
        of the benchmark's CommonCrawl WET records), the body is cut out of ``text`` as it is, with
        no string made per line: reading the benchmark's 8 files took 1.22 s, against 1.38 s."""
        if not clean_lines(text):
            title, lines = self._lines(text, title)
            return title, "\n".join(lines), len(lines)
        wet = self.fmt == "wet"
        if not self.title:
            title = None
        elif wet:
            title, _, text = text.partition("\n")
        nlines = text.count("\n") + 1 if text else 0
        if wet and self.empty_lines:  # the empty last line a WET body gains (below)
            return title, text + "\n" if text else "", nlines + 1
        return title, text, nlines

    def _lines(self, text: str, title: str | None) -> tuple[str | None, list[str]]:
        """The title (the first line of a WET body, the ``<title>`` of an HTML page; None unless
        ``title``) and the document's lines, stripped, split at any line break (``\\r\\n``, ``\\r``,
        ``\\n``, as a text-mode reader splits them); empty lines are left out unless ``empty_lines``.

        With ``empty_lines`` a WET body's lines are CCNet's ``raw_content`` exactly: CCNet reads a
        WET file line by line, so a body that does not end with a line break gains an empty last
        line from the record separator (process_wet_file.py: parse_doc)."""
        lines = [line.strip() for line in (LINE_BREAK.split(text) if "\r" in text else text.split("\n"))]
        if self.fmt == "wet":
            if self.empty_lines:
                lines.append("")
                if len(lines) >= 2 and not lines[-1] and not lines[-2]:
                    del lines[-2:]
            if self.title:
                title, lines = (lines[0] if lines else ""), lines[1:]
        if not self.title:
            title = None
        if not self.empty_lines:
            lines = [line for line in lines if line]
        return title, lines


def clean_lines(text: str) -> bool:
    """Whether ``text`` is non-empty, has no ``\\r``, and every line of it (split at ``\\n``) is
    stripped already and not empty: then stripping each line and dropping the empty ones leaves it
    as it is."""
    return bool(text) and "\r" not in text and not text[0].isspace() and not text[-1].isspace() \
        and not LINE_TO_CLEAN.search(text)


def _next(data: bytes, pos: int) -> int:
    """Where the next record may start after ``pos`` (the end of ``data`` if nowhere)."""
    found = data.find(b"WARC/1.", pos + 1)
    return found if found >= 0 else len(data)


def _html_text(block: bytes, identified: str = "") -> tuple[str, str, list[Note]] | Drop:
    """Title and text of an HTTP response block holding HTML, as resiliparse extracts them (one
    line per block), and notes. Whether it is HTML: the record's ``WARC-Identified-Payload-Type``
    (``identified``; CommonCrawl's detection from the bytes) where it has one, as datatrove decides,
    else the HTTP ``Content-Type``. The HTTP head may end its lines with ``\\n`` alone, as warcio and
    browsers accept. The body is de-chunked and decompressed first (:func:`_http_body`)."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    end = HTTP_HEAD_END.search(block)
    if end is None:
        return Drop("skipped_no_http_headers")
    status_line, *header_lines = block[:end.start()].decode("latin-1").replace("\r\n", "\n").split("\n")
    body = block[end.end():]
    parts = status_line.split()
    if len(parts) < 2 or parts[1] != "200":
        return Drop("skipped_http_status")
    headers: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip().lower()
    content_type = headers.get("content-type", "")
    if not (identified.lower() or content_type).startswith(HTML_TYPES):
        return Drop("skipped_non_html")
    payload = _http_body(body, headers)
    if isinstance(payload, Drop):
        return payload
    body, notes = payload
    charset = content_type.partition("charset=")[2].split(";")[0].strip().strip('"\'') or None
    if charset is not None and _web_encoding(charset) is None:
        notes.append(Note("http_charset_unknown"))
        charset = None
    tree = HTMLTree.parse(_decode(body, charset))
    text = extract_plain_text(tree, main_content=False, alt_texts=False, preserve_formatting=True)
    return tree.title, text, notes


BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
SUPERSETS = {"gbk": "gb18030", "gb2312": "gb18030", "shift_jis": "cp932", "euc_kr": "cp949", "big5": "cp950",
             "iso8859-11": "cp874"}
"""Python's codec for what browsers decode under a WHATWG encoding name where Python's own codec of
that name is narrower (a page labelled gb2312 with one GBK character, shift_jis with ①)."""


ONE_BYTE = frozenset({"cp1252", "iso8859-2", "iso8859-15", "cp1250", "cp1251", "cp1253", "cp1254", "cp1257",
                      "koi8-r", "koi8-u", "iso8859-5", "iso8859-7", "iso8859-9", "cp874"})
"""Python's names of the one-byte encodings a mislabelled UTF-8 page most often carries."""


def _decode(body: bytes, charset: str | None) -> str:
    """An HTML page's text as a browser decodes it (WHATWG's order): a byte-order mark, else the HTTP
    charset, else the page's ``<meta charset>``, else detection (uchardet); labels mapped as WHATWG
    maps them (iso-8859-1 is windows-1252); bytes the encoding does not map replaced, not the whole
    page decoded again as windows-1252. One exception, as datatrove decodes every page: a page labelled
    with a one-byte encoding whose bytes are valid UTF-8 (and not all ASCII) is UTF-8."""
    from resiliparse.parse.encoding import detect_encoding

    for bom, encoding in BOMS:
        if body.startswith(bom):
            return body[len(bom):].decode(encoding, errors="replace")
    encoding = _web_encoding(charset) or _web_encoding(detect_encoding(body, from_html_meta=True)) or "utf-8"
    if encoding != "utf-8" and codecs.lookup(encoding).name in ONE_BYTE and not body.isascii():
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return body.decode(encoding, errors="replace")


def _web_encoding(label: str | None) -> str | None:
    """The Python codec a browser decodes a page labelled ``label`` with (WHATWG's label table, then
    :data:`SUPERSETS`); None for a label that is no text encoding."""
    from resiliparse.parse.encoding import map_encoding_to_html5

    name = map_encoding_to_html5(label, fallback_utf8=False) if label else None
    if name is None or not _known_charset(name):
        return None
    return SUPERSETS.get(codecs.lookup(name).name, name)


def _known_charset(name: str) -> bool:
    """Whether ``name`` is a text encoding Python has (not a bytes-to-bytes codec such as ``base64``)."""
    try:
        return getattr(codecs.lookup(name), "_is_text_encoding", True)
    except LookupError:
        return False


def _http_body(body: bytes, headers: dict[str, str]) -> tuple[bytes, list[Note]] | Drop:
    """The payload of an HTTP body and notes, or a Drop: de-chunked where ``Transfer-Encoding``
    says so (:func:`_dechunk`; broken chunking is taken as it is, noted), then each
    ``Content-Encoding`` undone, the last applied first (gzip and its alias x-gzip, deflate with or
    without its zlib header, br where brotli is installed, zstd where zstandard is). A registered
    coding this cannot undo drops the record (``skipped_content_encoding``): its bytes are no text;
    a label that is no coding (``utf-8``) is passed over, noted, as browsers pass over it. A body that
    is not in its declared coding from its first byte on is taken as it is, as warcio takes it (a
    server that labels a plain page gzip); one that breaks partway keeps what was decoded, noted."""
    notes = []
    if "chunked" in headers.get("transfer-encoding", ""):
        body, sound = _dechunk(body)
        if not sound:
            notes.append(Note("http_chunking_broken"))
    codings = [c.strip() for c in headers.get("content-encoding", "").split(",")]
    for coding in reversed([c for c in codings if c not in ("", "identity")]):
        undone = _undo(CODING_ALIASES.get(coding, coding), body)
        if undone is None and coding in CODINGS:
            return Drop("skipped_content_encoding")
        if undone is None:  # not a content coding at all (utf-8, none, binary: servers send such), as browsers
            notes.append(Note("http_content_encoding_unknown"))  # pass over it
            continue
        decoded, complete = undone
        if not decoded and not complete:
            notes.append(Note("http_content_encoding_not_applied"))
            break
        if not complete:
            notes.append(Note("http_content_encoding_broken"))
        body = decoded
    return body, notes


def _dechunk(body: bytes) -> tuple[bytes, bool]:
    """The payload of a chunked HTTP body, and whether its chunking was sound. As RFC 9112 reads
    it: a hex size line (extensions after ``;`` ignored), that many bytes, a line break; lines may
    end in LF alone; the trailer after the last (empty) chunk is no payload; a body cut short (a
    capture truncated) keeps what it holds. Where the chunking breaks, the rest is taken as it is:
    the whole body if it breaks at once (a server that says chunked and is not). warcio's reader,
    used before, kept the sizes of LF-only chunk lines and the trailer as text."""
    out, at = [], 0
    while at < len(body):
        eol = body.find(b"\n", at)
        size = body[at:eol if eol >= 0 else len(body)].split(b";")[0].strip()
        if not CHUNK_SIZE.fullmatch(size):
            return b"".join(out) + body[at:], False
        if eol < 0 or not int(size, 16):
            break
        start = eol + 1
        at = start + int(size, 16)
        out.append(body[start:at])
        if body.startswith(b"\r\n", at):
            at += 2
        elif body.startswith(b"\n", at):
            at += 1
        elif at < len(body):
            return b"".join(out) + body[at:], False
    return b"".join(out), True


def _undo(coding: str, data: bytes) -> tuple[bytes, bool] | None:
    """``data`` decoded from the HTTP content coding ``coding`` (what was decoded until an error or
    the coded stream's end), and whether it reached that end without an error; None for a coding
    this cannot undo. Bytes after the stream's end are left out (of gzip, deflate and zstd; Brotli
    cannot tell them from a broken stream)."""
    if coding in ("gzip", "deflate"):
        zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and int.from_bytes(data[:2], "big") % 31 == 0
        wbits = zlib.MAX_WBITS | 16 if coding == "gzip" else zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
        inflater = zlib.decompressobj(wbits)  # (deflate without its zlib header: what some servers send)
        step, finished, error = inflater.decompress, lambda: inflater.eof, zlib.error
    elif coding == "br" and (brotli := _optional("brotli")) is not None:
        decompressor = brotli.Decompressor()  # (warcio's own reader of it fails on brotli >= 1.1)
        step, finished, error = decompressor.process, decompressor.is_finished, brotli.error
    elif coding == "zstd" and (zstandard := _optional("zstandard")) is not None:
        frame = zstandard.ZstdDecompressor().decompressobj()
        step, finished, error = frame.decompress, lambda: frame.eof, zstandard.ZstdError
    else:
        return None
    out = []
    for at in range(0, len(data), WINDOW):
        try:
            out.append(step(data[at:at + WINDOW]))
        except error:
            return b"".join(out), False
        if finished():
            break
    return b"".join(out), finished()


def _optional(name: str) -> Any:
    """The module ``name``, or None where it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
