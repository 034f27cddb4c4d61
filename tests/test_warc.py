"""WET/WARC reading: the real format, and every kind of bad input counted under its reason."""
from __future__ import annotations

import gzip
import io
import random
from pathlib import Path

import pytest
from conftest import gz, warc_record
from warcio.archiveiterator import ArchiveIterator as WarcioIterator

from pipeline.steps.base import Drop, Note, Rejected
from pipeline.readers.warc import RecordReader, iter_gzip_members, iter_members


def read(data: bytes, fmt: str = "wet", name: str = "x.warc.wet.gz"):
    return list(RecordReader(name, fmt).read(io.BytesIO(data)))


def docs_of(results):
    return [r for r in results if isinstance(r, dict)]


def reasons(results):
    return sorted(r.reason for r in results if isinstance(r, Rejected))


def good(i: int) -> bytes:
    body = f"Page {i}\nA first paragraph of page {i}.\nA second one.".encode()
    return gz(warc_record(body, uri=f"https://example.org/{i}", record_id=f"<urn:uuid:{i:08d}-0000-0000-0000-000000000000>"))


def test_sample_wet_files_match_warcio(sample):
    """Every conversion record warcio sees in the real sample is one of our documents, same fields."""
    paths = sorted((sample / "wet").glob("*.warc.wet.gz"))
    assert paths
    for path in paths[:2]:
        ours = read(path.read_bytes(), name=str(path))
        assert not reasons(ours)
        with open(path, "rb") as f:
            theirs = [(r.rec_headers.get_header("WARC-Record-ID"), r.rec_headers.get_header("WARC-Target-URI"),
                       r.content_stream().read().decode())
                      for r in WarcioIterator(f) if r.rec_type == "conversion"]
        docs = docs_of(ours)
        assert [(d["id"], d["url"]) for d in docs] == [(i, u) for i, u, _ in theirs]
        for doc, (_, _, text) in zip(docs, theirs):
            title, *lines = [line.strip() for line in text.splitlines()]
            assert doc["title"] == title and doc["text"] == "\n".join(line for line in lines if line)
            assert doc["content_length"] == len(text.encode()) and doc["original_length"] == len(doc["text"])
        assert sum(isinstance(r, Drop) and r.reason == "skipped_warcinfo" for r in ours) == 1


def reader_lines(body: str, **options) -> tuple[str | None, str]:
    [doc] = docs_of(RecordReader("x.warc.wet.gz", "wet", **options).read(io.BytesIO(gz(warc_record(body.encode(), title=None)))))
    return doc["title"], doc["text"]


def test_line_breaks_titles_and_empty_lines():
    body = "The title\r\nline one\rline two\n\n  line three  \n"
    assert reader_lines(body) == ("The title", "line one\nline two\nline three")
    assert reader_lines(body, title=False) == (None, "The title\nline one\nline two\nline three")
    # CCNet's raw_content: empty lines kept; a body ending without a line break gains an empty last
    # line from the record separator, one ending with a line break does not
    assert reader_lines(body, empty_lines=True) == ("The title", "line one\nline two\n\nline three")
    assert reader_lines(body.rstrip("\n"), empty_lines=True) == ("The title", "line one\nline two\n\nline three\n")
    assert reader_lines("Only a title\nx", empty_lines=True) == ("Only a title", "x\n")


@pytest.mark.parametrize("fmt", ["wet", "warc"])
def test_a_body_cut_out_whole_equals_its_lines_joined(fmt):
    """Where no line needs stripping, ``_body`` cuts the body out of the text without splitting it
    into lines: the same title, body and line count as the lines kept joined, on random texts (some
    clean, some with lines to strip, empty lines, ``\\r``, Unicode spaces), under every option."""
    rng = random.Random(7)
    pieces = ["word", "x", "\u0394\u03b5", " ", "\n", "\n", "\r", "\t", "\u3000", "\x1c", "\u2028", "\n\n"]
    texts = ["", "a", "a\nb", "title only", "\n", " a", "a ", "a\n b", "a \nb", "a\n\nb", "t\nx\ny"]
    texts += ["".join(rng.choices(pieces, k=rng.randint(1, 12))) for _ in range(3000)]
    clean = 0
    for title in (True, False):
        for empty_lines in (True, False):
            reader = RecordReader("x", fmt, title=title, empty_lines=empty_lines)
            for text in texts:
                page_title = "Page" if fmt == "warc" else None
                expected_title, lines = reader._lines(text, page_title)
                assert reader._body(text, page_title) == (expected_title, "\n".join(lines), len(lines)), text
                clean += "\n".join(line.strip() for line in text.split("\n") if line.strip()) == text != ""
    assert clean > 100  # the fast path was taken


def test_a_page_with_only_a_title_is_skipped_and_an_empty_one_rejected():
    assert read(gz(warc_record(b"", title="Only a title"))) == [Drop("skipped_title_only")]
    assert reasons(read(gz(warc_record(b"\n\n", title="")))) == ["empty"]


def test_short_documents_are_dropped_at_read_when_asked():
    data = gz(warc_record(b"x" * 299)) + gz(warc_record(b"y" * 300))
    assert len(docs_of(read(data))) == 2
    short = list(RecordReader("x.warc.wet.gz", "wet", min_length=300).read(io.BytesIO(data)))
    assert Drop("too_short") in short and [d["text"] for d in docs_of(short)] == ["y" * 300]


def test_member_offsets_are_record_offsets(sample):
    path = sorted((sample / "wet").glob("*.warc.wet.gz"))[0]
    data = path.read_bytes()
    members = list(iter_gzip_members(io.BytesIO(data)))
    assert sum(m.length for m in members) == len(data)
    for m in members[:20]:
        assert gzip.decompress(data[m.offset:m.offset + m.length]) == m.data
        assert m.data.startswith(b"WARC/1.0\r\n")


def test_sample_warc_html_is_extracted(sample):
    path = sorted((sample / "warc").glob("*.warc.gz"))[0]
    results = read(path.read_bytes(), fmt="warc", name=str(path))
    docs = docs_of(results)
    assert len(docs) > 100 and not reasons(results)
    assert all("<" not in d["text"][:200] or ">" not in d["text"][:200] for d in docs[:50])


def test_headers_are_read_by_name_not_position():
    body = b"Some text\nmore text"
    record = (b"WARC/1.0\r\nContent-Length: %d\r\nWARC-Record-ID: <urn:uuid:abc>\r\nContent-Type: text/plain\r\n"
              b"WARC-Date: 2024-01-01T00:00:00Z\r\nWARC-Target-URI: https://x.org/\r\nWARC-Type: conversion\r\n\r\n"
              % len(body)) + body + b"\r\n\r\n"
    [doc] = read(gz(record))
    assert (doc["id"], doc["url"], doc["date"]) == ("<urn:uuid:abc>", "https://x.org/", "2024-01-01T00:00:00Z")


BAD_CASES = {
    "truncated": lambda: (good(1) + good(2) + good(3))[:-25],
    "garbage": lambda: good(1) + b"\x00\xffnot gzip at all\xfe" * 10 + good(2),
    "content_length_mismatch": lambda: good(1) + gz(warc_record(b"twenty-three bytes here", content_length=10, digest=False)) + good(2),
    "empty": lambda: good(1) + gz(warc_record(b" \n", title=None)) + good(2),
    "not_utf8": lambda: good(1) + gz(warc_record("caf\xe9 cr\xe8me br\xfbl\xe9e".encode("latin-1"))) + good(2),
    "unexpected_type": lambda: good(1) + gz(warc_record(b"hello", rtype="response")) + good(2),
    "missing_header": lambda: good(1) + gz(warc_record(b"hello there", drop=("WARC-Target-URI",))) + good(2),
    "digest_mismatch": lambda: good(1) + gz(warc_record(b"hello there").replace(b"hello", b"HELLO")) + good(2),
    "corrupt_gzip": lambda: good(1) + gz(warc_record(b"hello there"))[:12] + b"\x00" * 40 + good(2),
    "unparseable": lambda: good(1) + gz(b"this is gzip but not a WARC record\r\n\r\n") + good(2),
}


@pytest.mark.parametrize("reason", sorted(BAD_CASES))
def test_bad_input_is_counted_not_fatal(reason):
    results = read(BAD_CASES[reason]())
    assert reason in reasons(results)
    bad = [r for r in results if isinstance(r, Rejected)]
    assert all(r.source == "x.warc.wet.gz" and r.offset >= 0 for r in bad)
    good_ids = [d["id"] for d in docs_of(results)]
    expected = 1 if reason == "truncated" else 2
    assert len(good_ids) == expected + (reason == "truncated"), good_ids  # good records around it survive


@pytest.mark.parametrize("chunk", [7, 64, 1000])
@pytest.mark.parametrize("reason", sorted(BAD_CASES))
def test_bad_input_across_read_chunks_gives_the_same_results(reason, chunk, monkeypatch):
    """The member splitter reads files in chunks (4 MiB); a corrupt member, or a gzip header after
    garbage, that crosses a chunk's end is found as in one chunk (the corrupt member was skipped
    past its own end, losing the members after it; the header was taken for garbage)."""
    from pipeline.readers import warc

    data = BAD_CASES[reason]() + good(3)
    whole = read(data, fmt="warc", name="x.warc.gz")  # (WARC: member by member from the start)
    monkeypatch.setattr(warc, "CHUNK", chunk)
    assert read(data, fmt="warc", name="x.warc.gz") == whole


def test_a_gzip_header_after_garbage_is_found_at_every_place_a_chunk_can_end(monkeypatch):
    from pipeline.readers import warc

    for n in range(1, 16):
        data = good(1) + b"J" * n + good(2)
        whole = read(data)
        monkeypatch.setattr(warc, "CHUNK", 7)
        assert read(data) == whole, n
        assert [r.detail for r in whole if isinstance(r, Rejected)] == [f"{n} bytes that are not gzip data"]
        assert len(docs_of(whole)) == 2
        monkeypatch.undo()


def test_blank_lines_before_the_first_record_lose_nothing():
    """fastwarc gives the first record after leading blank bytes the offset of what it read next:
    the whole file (one gzip member) was lost, or its first record, without a word."""
    records = [warc_record(f"Page {i}\nText {i}.".encode(), record_id=f"<urn:uuid:{i}>") for i in range(3)]
    for lead in (b"\r\n", b"\n\r\n", b"\t\n"):
        one_member = read(gz(lead + b"".join(records)))
        per_record = read(gz(lead + records[0]) + gz(records[1]) + gz(records[2]))
        for results in (one_member, per_record):
            assert [d["id"] for d in docs_of(results)] == ["<urn:uuid:0>", "<urn:uuid:1>", "<urn:uuid:2>"]
            assert not reasons(results)


@pytest.mark.parametrize("data, reason", [(b"", "empty_file"), (gzip.compress(b"", mtime=0), "no_records"),
                                          (gzip.compress(b"\r\n\r\n", mtime=0), "no_records")])
def test_a_file_without_records_is_one_rejection(data, reason):
    """An empty file (a download cut short, say) is not read as a file that held nothing to keep."""
    for fmt, name in (("wet", "x.warc.wet.gz"), ("warc", "x.warc.gz"), ("wet", "x.warc.wet")):
        [bad] = read(data, fmt, name)
        assert (bad.reason, bad.source, bad.offset) == (reason, name, 0)


def test_content_length_longer_than_body():
    record = gz(warc_record(b"short body", content_length=500, digest=False))
    assert reasons(read(good(1) + record + good(2))) == ["content_length_mismatch"]


def test_uncompressed_file_resyncs_after_bad_record():
    data = (warc_record(b"first doc text") + b"garbage line\r\n\r\n"
            + warc_record(b"second doc text", record_id="<urn:uuid:2>"))
    results = read(data, name="x.warc.wet")
    assert [d["text"] for d in docs_of(results)] == ["first doc text", "second doc text"]
    [bad] = [r for r in results if isinstance(r, Rejected)]
    assert (bad.reason, bad.raw) == ("unparseable", "garbage line\r\n\r\n")
    assert bad.offset == len(warc_record(b"first doc text"))


def test_header_names_are_case_insensitive():
    body = b"Some text\nmore text"
    record = (b"WARC/1.0\r\nwarc-type: conversion\r\nWARC-TARGET-URI: https://x.org/\r\nWarc-Date: 2024-01-01T00:00:00Z\r\n"
              b"warc-record-id: <urn:uuid:abc>\r\nContent-Length: %d\r\n\r\n" % len(body)) + body + b"\r\n\r\n"
    [doc] = read(gz(record))
    assert (doc["id"], doc["url"], doc["date"]) == ("<urn:uuid:abc>", "https://x.org/", "2024-01-01T00:00:00Z")


def test_a_file_the_store_cannot_serve_is_rejected_not_fatal(monkeypatch):
    """Object-store clients raise their own errors (boto's, Google's), not OSError: still one rejected record."""
    from pipeline.readers import files
    from pipeline.config import ReadConfig

    class S3ClientError(Exception):
        pass

    def unavailable(path: str):
        raise S3ClientError("503 SlowDown")

    monkeypatch.setattr(files.fs, "open_read", unavailable)
    [record] = files.read_file("s3://bucket/CC-MAIN-x.warc.wet.gz", ReadConfig())
    assert isinstance(record, Rejected)
    assert (record.source, record.reason, record.detail) == (
        "s3://bucket/CC-MAIN-x.warc.wet.gz", "unreadable_file", "S3ClientError: 503 SlowDown")


@pytest.mark.parametrize("compressed", [False, True])
def test_a_file_that_ends_inside_a_record_header_is_a_truncated_record(compressed):
    """Not a record with missing headers: the cut is named, with the record's offset."""
    first = warc_record(b"first doc text")
    cut = warc_record(b"second doc text", record_id="<urn:uuid:2>")[:70]  # inside WARC-Record-ID
    data = gz(first) + gz(cut) if compressed else first + cut
    results = read(data, name="x.warc.wet.gz" if compressed else "x.warc.wet")
    assert [d["text"] for d in docs_of(results)] == ["first doc text"]
    [bad] = [r for r in results if isinstance(r, Rejected)]
    where = "gzip member" if compressed else "file"
    assert (bad.reason, bad.offset, bad.detail) == ("truncated", len(gz(first) if compressed else first),
                                                    f"the {where} ends inside this record's header")


def http_pages(sample, limit: int = 40) -> list[tuple[str, bytes, bytes]]:
    """(URL, HTTP status line + headers, HTML body) of the sample WARC's HTML responses."""
    pages = []
    for path in sorted((sample / "warc").glob("*.warc.gz")):
        with open(path, "rb") as f:
            for r in WarcioIterator(f):
                if r.rec_type == "response" and "html" in (r.http_headers.get_header("Content-Type") or ""):
                    head = r.http_headers.to_bytes().split(b"\r\n\r\n")[0]
                    pages.append((r.rec_headers.get_header("WARC-Target-URI"), head, r.content_stream().read()))
    return pages[:limit]


def chunked(body: bytes, rng) -> bytes:
    out, pos = b"", 0
    while pos < len(body):
        n = min(rng.randint(1, 700), len(body) - pos)
        out += f"{n:x}\r\n".encode() + body[pos:pos + n] + b"\r\n"
        pos += n
    return out + b"0\r\n\r\n"


def http_headers(head: bytes, **replace: str) -> bytes:
    drop = {b"content-length", b"transfer-encoding", b"content-encoding"}
    lines = [line for line in head.split(b"\r\n") if line.split(b":")[0].strip().lower() not in drop]
    return b"\r\n".join(lines + [f"{k.replace('_', '-')}: {v}".encode() for k, v in replace.items()]) + b"\r\n\r\n"


def test_chunked_and_compressed_http_bodies_give_the_same_text(sample):
    """The sample's HTML pages served plain, chunked (random chunk sizes), gzip and chunked gzip:
    the same document text, URL by URL; broken chunking is extracted as it is and counted."""
    import random

    rng = random.Random(7)
    pages = http_pages(sample)
    assert len(pages) >= 20

    def warc(kind: str) -> bytes:
        records = []
        for i, (url, head, body) in enumerate(pages):
            if kind == "plain":
                block = http_headers(head, Content_Length=str(len(body))) + body
            elif kind == "chunked":
                block = http_headers(head, Transfer_Encoding="chunked") + chunked(body, rng)
            elif kind == "gzip":
                packed = gzip.compress(body, mtime=0)
                block = http_headers(head, Content_Encoding="gzip", Content_Length=str(len(packed))) + packed
            else:  # chunked gzip
                block = (http_headers(head, Transfer_Encoding="chunked", Content_Encoding="gzip")
                         + chunked(gzip.compress(body, mtime=0), rng))
            records.append(gz(warc_record(block, rtype="response", uri=url, content_type="application/http; msgtype=response",
                                          record_id=f"<urn:uuid:{i:08d}-0000-0000-0000-000000000000>")))
        return b"".join(records)

    texts = {kind: {d["url"]: d["text"] for d in docs_of(read(warc(kind), "warc", "x.warc.gz"))}
             for kind in ("plain", "chunked", "gzip", "chunked+gzip")}
    assert len(texts["plain"]) == len(pages)
    assert texts["chunked"] == texts["plain"] and texts["gzip"] == texts["plain"] and texts["chunked+gzip"] == texts["plain"]
    assert not any(text[:4].strip("0123456789abcdef") == "" for text in texts["chunked"].values())  # no chunk sizes
    url, head, body = pages[0]
    broken = http_headers(head, Transfer_Encoding="chunked") + b"zz-not-a-size\r\n" + body  # declared, not done
    results = read(gz(warc_record(broken, rtype="response", uri=url, content_type="application/http; msgtype=response")),
                   "warc", "x.warc.gz")
    [doc] = docs_of(results)
    assert doc["text"].startswith("zz-not-a-size") and doc["text"].endswith(texts["plain"][url].split("\n")[-1])
    assert [r.reason for r in results if isinstance(r, Note)] == ["http_chunking_broken"]


def test_chunk_lines_ended_by_lf_and_trailers_are_no_text():
    """Chunked bodies as RFC 9112 lets a server send them: chunk lines ended by LF alone, chunk
    extensions, a trailer after the last chunk, a capture cut short. warcio's reader, used before,
    took the first as broken (the sizes kept as text) and the trailer as text."""
    text = "Hello world, this is the page's text."
    page = PAGE.format(meta="", text=text).encode()
    half = len(page) // 2
    bodies = {
        "lf": b"%x\n%s\n%x\n%s\n0\n\n" % (half, page[:half], len(page) - half, page[half:]),
        "trailer": b"%x\r\n%s\r\n0\r\nX-Checksum: abc\r\n\r\n" % (len(page), page),
        "extension": b"%x;name=value\r\n%s\r\n0\r\n\r\n" % (len(page), page),
        "cut short": b"%x\r\n%s" % (len(page) + 100, page),
    }
    for kind, body in bodies.items():
        block = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n" + body
        results = read(gz(warc_record(block, rtype="response")), "warc", "x.warc.gz")
        assert [(d["title"], d["text"]) for d in docs_of(results)] == [("T", text)], kind
        assert not [r for r in results if isinstance(r, Note)], kind


def html_response(body: bytes, content_type: str = "text/html") -> bytes:
    """A WARC response record of an HTTP 200 page."""
    block = f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n\r\n".encode() + body
    return gz(warc_record(block, rtype="response", content_type="application/http; msgtype=response"))


PAGE = "<html><head>{meta}<title>T</title></head><body><p>{text}</p></body></html>"


@pytest.mark.parametrize("label, real, text", [
    ("iso-8859-1", "cp1252", "It’s “quoted” – 5 €"),  # the label browsers read as windows-1252
    ("gb2312", "gbk", "朱镕基 體育 新闻"),  # one GBK character: the whole page was mojibake
    ("shift_jis", "cp932", "株式会社の①番目"),  # ① (Windows-31J) was dropped
    ("euc-kr", "cp949", "안녕하세요 똠양꿍"),
    ("big5", "cp950", "繁體中文 €"),
    ("iso-8859-1", "utf-8", "Café déjà vu, Noël"),  # mislabelled UTF-8 (datatrove reads UTF-8 first)
    ("utf-8", "utf-8-sig", "Café déjà vu"),  # a byte-order mark
    ("iso-8859-1", "utf-8-sig", "Café déjà vu"),  # a byte-order mark wins over the label
    ("utf-8", "utf-16", "Café déjà vu"),  # UTF-16 with its mark, labelled utf-8: the markup itself was the text
    (None, "euc-kr", "안녕하세요 반갑습니다"),  # <meta charset> only (uchardet took it for UTF-8)
    (None, "iso-8859-2", "Árvíztűrő tükörfúrógép"),
])
def test_pages_are_decoded_as_a_browser_decodes_them(label, real, text):
    """A page's bytes as WHATWG's encoding sniffing reads them: byte-order mark, HTTP charset (its
    label mapped as browsers map it, decoded by the superset browsers use), <meta charset>, detection."""
    meta = f'<meta charset="{real}">' if label is None else ""
    content_type = "text/html" if label is None else f"text/html; charset={label}"
    [doc] = docs_of(read(html_response(PAGE.format(meta=meta, text=text).encode(real), content_type), "warc", "x.warc.gz"))
    assert doc["text"] == text and doc["title"] == "T"


def test_a_stray_byte_costs_one_character_not_the_page():
    """A UTF-8 page with one byte that is not UTF-8 (a string cut mid-character) was decoded again
    as windows-1252 whole (``dÃ©jÃ``); now that byte alone is replaced, as a browser shows it."""
    body = PAGE.format(meta="", text="Très bien, déjà vu. X").encode().replace(b"X", b"\xe9")
    [doc] = docs_of(read(html_response(body, "text/html; charset=utf-8"), "warc", "x.warc.gz"))
    assert doc["text"] == "Très bien, déjà vu. \ufffd"


def test_a_page_the_http_layer_cannot_decode_ends_that_record_only(sample, monkeypatch):
    """An unknown charset is detected instead, and counted; a Brotli body is decompressed (warcio's
    own Brotli reader fails on brotli >= 1.1), a broken one kept as it is and counted; a parser that
    fails on one page rejects that record, with its id, and the records after it are read (each of
    these ended the file's reading before, as one ``unreadable_file``)."""
    from pipeline.readers import warc

    brotli = pytest.importorskip("brotli", reason="brotli is not installed (make test installs it)")
    (url, head, body), (url2, head2, body2) = http_pages(sample)[:2]
    html = {"content_type": "application/http; msgtype=response"}
    plain = read(gz(warc_record(http_headers(head, Content_Length=str(len(body))) + body, rtype="response", uri=url,
                                **html)), "warc", "x.warc.gz")
    cases = {
        "charset": http_headers(head, Content_Type="text/html; charset=x-no-such-charset") + body,
        "bytes codec": http_headers(head, Content_Type="text/html; charset=base64") + body,  # no text encoding
        "br": http_headers(head, Content_Encoding="br") + brotli.compress(body),
        "broken br": http_headers(head, Content_Encoding="br") + body,
    }
    results = {kind: read(gz(warc_record(block, rtype="response", uri=url, **html)), "warc", "x.warc.gz")
               for kind, block in cases.items()}
    def page(results):
        return [(d["title"], d["text"]) for d in docs_of(results)]

    assert page(results["charset"]) == page(plain) and page(results["br"]) == page(plain) and page(plain)
    assert page(results["bytes codec"]) == page(plain)
    assert [r.reason for r in results["charset"] if isinstance(r, Note)] == ["http_charset_unknown"]
    assert [r.reason for r in results["br"] if isinstance(r, Note)] == []
    assert [r.reason for r in results["broken br"] if isinstance(r, Note)] == ["http_content_encoding_not_applied"]
    html_text = warc._html_text

    def fails_on_a_marked_page(block: bytes, identified: str):
        if b"first-page-marker" in block:
            raise RuntimeError("the parser gave up")
        return html_text(block, identified)

    monkeypatch.setattr(warc, "_html_text", fails_on_a_marked_page)
    data = b"".join(gz(warc_record(http_headers(h, Content_Length=str(len(b))) + b, rtype="response", uri=u,
                                   record_id=f"<urn:uuid:{i}>", **html))
                    for i, (u, h, b) in enumerate([(url, head, body + b"<!-- first-page-marker -->"), (url2, head2, body2)]))
    results = read(data, "warc", "x.warc.gz")
    [bad] = [r for r in results if isinstance(r, Rejected)]
    assert (bad.reason, bad.record_id, bad.detail) == ("undecodable_http", "<urn:uuid:0>", "RuntimeError: the parser gave up")
    assert [d["url"] for d in docs_of(results)] == [url2]


def test_every_content_coding_is_undone_or_the_record_dropped():
    """A body in a coding the reader could not undo (x-gzip, zstd, a stacked coding, compress) was
    kept as a document of binary garbage; each coding is now undone, the last applied first, or the
    record dropped. A body not in its declared coding is taken as it is (as warcio does); one cut
    partway keeps what was decoded; both are noted."""
    brotli = pytest.importorskip("brotli", reason="brotli is not installed (make test installs it)")
    zstandard = pytest.importorskip("zstandard", reason="zstandard is not installed (make test installs it)")
    import zlib

    text = "Hello world, this is the page's text."
    html = PAGE.format(meta="", text=text).encode()

    def deflate(data: bytes, wbits: int) -> bytes:
        packer = zlib.compressobj(wbits=wbits)
        return packer.compress(data) + packer.flush()

    cases = {
        "x-gzip": gzip.compress(html) + b"after the stream's end", "zstd": zstandard.ZstdCompressor().compress(html),
        "gzip, gzip": gzip.compress(gzip.compress(html)), "gzip, br": brotli.compress(gzip.compress(html)),
        "deflate": deflate(html, 15), "Deflate": deflate(html, -15),  # with its zlib header, then raw
        "gzip ": html,  # labelled, not applied
        "br,identity": brotli.compress(html),
        "gzip, utf-8": gzip.compress(html),  # a label that is no coding (servers send such): passed over
    }
    for coding, body in cases.items():
        block = f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: {coding}\r\n\r\n".encode() + body
        results = read(gz(warc_record(block, rtype="response", content_type="application/http; msgtype=response")),
                       "warc", "x.warc.gz")
        assert [d["text"] for d in docs_of(results)] == [text], coding
        notes = [r.reason for r in results if isinstance(r, Note)]
        assert notes == {"gzip ": ["http_content_encoding_not_applied"],
                         "gzip, utf-8": ["http_content_encoding_unknown"]}.get(coding, []), coding
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Encoding: "
    assert read(gz(warc_record(head + b"compress\r\n\r\n\x1f\x9d\x90garbage", rtype="response")), "warc",
                "x.warc.gz") == [Drop("skipped_content_encoding")]
    long_page = PAGE.format(meta="", text=" ".join(f"word{i}" for i in range(20000))).encode()
    cut = read(gz(warc_record(head + b"gzip\r\n\r\n" + gzip.compress(long_page)[:20000], rtype="response")), "warc",
               "x.warc.gz")
    [doc] = docs_of(cut)
    assert doc["text"].startswith("word0 word1") and len(doc["text"]) < 0.9 * len(long_page)
    assert [r.reason for r in cut if isinstance(r, Note)] == ["http_content_encoding_broken"]


def test_html_is_decided_as_datatrove_decides_and_lf_heads_are_read():
    """``WARC-Identified-Payload-Type`` (CommonCrawl's detection from the bytes) decides where a
    record has it, as datatrove's reader decides; an HTTP head whose lines end in LF alone (which
    warcio and browsers read) was dropped as having no headers; an HTML page with no text is a
    drop, not a rejected record."""
    page = PAGE.format(meta="", text="Some text.").encode()

    def response(block: bytes, identified: str | None = None):
        return read(gz(warc_record(block, rtype="response", identified=identified)), "warc", "x.warc.gz")

    html_head, plain_head = (f"HTTP/1.1 200 OK\r\nContent-Type: {t}\r\n\r\n".encode() for t in ("text/html", "text/plain"))
    assert [d["text"] for d in docs_of(response(plain_head + page, "text/html"))] == ["Some text."]
    assert response(html_head + page, "application/pdf") == [Drop("skipped_non_html")]
    assert [d["text"] for d in docs_of(response(html_head + page))] == ["Some text."]
    assert [d["text"] for d in docs_of(response(b"HTTP/1.1 200 OK\nContent-Type: text/html\n\n" + page))] == ["Some text."]
    assert response(html_head + b"<html><body><script>fill()</script></body></html>") == [Drop("skipped_no_text")]


def test_a_file_that_cannot_be_read_is_one_rejection(tmp_path):
    """Unreadable even for root: a link to /proc/self/mem opens but fails on read (EIO)."""
    from pipeline.readers.files import read_file
    from pipeline.config import ReadConfig

    if not Path("/proc/self/mem").exists():
        pytest.skip("no /proc/self/mem on this system")
    path = tmp_path / "unreadable.warc.wet.gz"
    path.symlink_to("/proc/self/mem")
    [result] = list(read_file(str(path), ReadConfig()))
    assert isinstance(result, Rejected) and result.reason == "unreadable_file" and result.source == str(path)
    assert result.detail.startswith("OSError: [Errno 5]"), result.detail


def member_by_member(data: bytes, name: str = "x.warc.wet.gz") -> list:
    """The reference reading: every gzip member split and parsed on its own."""
    reader = RecordReader(name, "wet")
    return list(reader._or_none(reader._read_members(iter_members(io.BytesIO(data), name))))


def structural_cases() -> dict[str, bytes]:
    """Files whose members do not hold one record each, or that end or continue wrongly."""
    one, two, three = (warc_record(f"Page {i}\nSome text of page {i}.".encode(), record_id=f"<urn:uuid:{i}>")
                       for i in (1, 2, 3))
    whole = good(1) + good(2) + good(3)
    last = len(good(1) + good(2))
    return {
        "two records in one member": good(1) + gz(one + two) + good(3),
        "two records in one member after a member of the first's size": gz(one) + gz(one + two) + good(3),
        "a record split over two members": good(1) + gz(two[:100]) + gz(two[100:]) + good(3),
        "bytes after the record in its member": good(1) + gz(two + b"xx") + good(3),
        "whitespace after the record in its member": good(1) + gz(two + b"\r\n") + good(3),
        "an empty member": good(1) + gz(b"") + good(2),
        "a member of whitespace": good(1) + gz(b"\r\n\r\n") + good(2),
        "garbage at the end": whole + b"garbage",
        "zeros at the end": whole + bytes(10),
        "a second gzip stream header at the end": whole + b"\x1f\x8b\x08",
        "not gzip after all": b"\x1f\x8b\x08" + one,
        "no records": gz(b""),
        "one record, uncompressed inside": gz(three),
        **{f"cut {n} bytes before the end": whole[:-n] for n in (1, 4, 8, 9, 30, 200)},
        **{f"cut {n} bytes into the last member": whole[:last + n] for n in (1, 10, 18)},
    }


@pytest.mark.parametrize("case", sorted(structural_cases()))
def test_the_whole_file_path_equals_member_by_member_on_structural_faults(case):
    data = structural_cases()[case]
    assert read(data) == member_by_member(data)


def test_the_whole_file_path_equals_member_by_member_on_corrupted_copies(sample):
    """400 random corruptions (flips, cuts, garbage, repeats) of 24 real records, and the bad cases."""
    from test_fuzz import corrupt

    data = (sample / "wet" / "sample-00000.warc.wet.gz").read_bytes()
    members = list(iter_gzip_members(io.BytesIO(data)))[:24]
    base = data[:members[-1].offset + members[-1].length]
    rng = random.Random(7)
    for copy in [*(corrupt(base, rng) for _ in range(400)), *(make() for make in BAD_CASES.values())]:
        assert read(copy) == member_by_member(copy)


def test_a_clean_file_is_read_whole(sample, monkeypatch):
    """The fast path holds on CommonCrawl's own layout: the member-by-member path is never entered."""
    path = sample / "wet" / "sample-00001.warc.wet.gz"
    expected = member_by_member(path.read_bytes(), path.name)

    def fail(*_):
        raise AssertionError("fell back to reading member by member")

    monkeypatch.setattr(RecordReader, "_read_members", fail)
    assert read(path.read_bytes(), name=path.name) == expected
