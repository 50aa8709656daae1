"""Hostile ZIPs: the shared reader (studio/files/archive.py) stops every member at a cap by the bytes it actually
inflates, whatever the directory declares, and refuses a pile of entries before zipfile lists them; EPUBs go
through it, so a lying member, a repeated spine or a billion laughs is refused fast, in little memory, with a
sentence a person reads. Memory is the test process's own peak RSS (tests/probes.py), reset before each."""

from __future__ import annotations

import io
import os
import stat
import struct
import time
import zipfile
import zlib

import httpx
import pytest

from studio.files.archive import KB, MB, Archive, ArchiveRefused, Caps
from studio.projects import importing
from studio.projects.importing import ImportRefused
from tests.probes import peak_growth_mb, server_pid

CAPS = Caps(noun="test archive", members=20, total=4 * MB, member=1 * MB)
DATE = (2026, 1, 1, 0, 0, 0)  # a fixed date: the bytes are the same in every process (xdist collects alike)


def _zip(members: dict[str, bytes], *, method=zipfile.ZIP_DEFLATED, attrs: dict[str, int] | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, date_time=DATE)
            info.external_attr = (attrs or {}).get(name, 0o644 << 16)
            z.writestr(info, data, method)
    return out.getvalue()


def _deflated_zeros(mib: int) -> bytes:
    """A raw deflate stream of `mib` MiB of zeros: one fully flushed MiB repeated, so it costs nothing to build."""
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    one = block.compress(bytes(MB)) + block.flush(zlib.Z_FULL_FLUSH)
    return one * mib + zlib.compressobj(9, zlib.DEFLATED, -15).flush()


def _patch(data: bytes, name: str, **fields) -> bytes:
    """`data` with the named entry's header fields (method, flags, size: the inflated size) rewritten in both
    its local header and the central directory: a ZIP that says what an attacker wants."""
    local = {"flags": 6, "method": 8, "size": 22}
    central = {"flags": 8, "method": 10, "size": 24}
    out, key = bytearray(data), name.encode()
    for sig, offsets, name_at in ((b"PK\x03\x04", local, 30), (b"PK\x01\x02", central, 46)):
        at = out.find(sig)
        while at >= 0 and out[at + name_at:at + name_at + len(key)] != key:
            at = out.find(sig, at + 1)
        assert at >= 0, name
        for field, value in fields.items():
            fmt = "<I" if field == "size" else "<H"
            struct.pack_into(fmt, out, at + offsets[field], value)
    return bytes(out)


def _bomb(name: str, *, mib: int, declared: int, others: dict[str, bytes] | None = None) -> bytes:
    """A ZIP whose `name` inflates to `mib` MiB but whose directory declares `declared` bytes."""
    data = _zip({**(others or {}), name: _deflated_zeros(mib)}, method=zipfile.ZIP_STORED)
    return _patch(data, name, method=zipfile.ZIP_DEFLATED, size=declared)


# ------------------------------------------------------------------------------------------- the reader
def test_a_member_stops_at_its_cap_by_what_it_inflates_not_what_it_declares():
    honest = _bomb("clip.wav", mib=256, declared=256 * MB)
    with peak_growth_mb(os.getpid()) as grown:
        t0 = time.perf_counter()
        with Archive(honest, CAPS) as zf, pytest.raises(ArchiveRefused) as refused:
            zf.read("clip.wav", limit=512 * KB, kind="a voice clip")
        took = time.perf_counter() - t0
    assert str(refused.value) == ("The test archive's 'clip.wav' is more than 524,288 bytes inflated; the limit for "
                                  "a voice clip is 512 KB.")
    assert took < 0.5 and grown["mb"] < 16, (took, grown)


def test_a_member_that_declares_less_than_it_holds_is_refused_unread_past_its_declared_size():
    liar = _bomb("chapter.xhtml", mib=256, declared=5_000)
    with peak_growth_mb(os.getpid()) as grown:
        t0 = time.perf_counter()
        with Archive(liar, CAPS) as zf, pytest.raises(ArchiveRefused) as refused:
            zf.read("chapter.xhtml")
        took = time.perf_counter() - t0
    assert str(refused.value) == ("The test archive's 'chapter.xhtml' cannot be read: its contents do not match "
                                  "its checksum (damaged, or larger than its directory says).")
    assert took < 0.5 and grown["mb"] < 16, (took, grown)


def test_the_total_counts_every_byte_read():
    data = _zip({f"{n}.bin": os.urandom(900 * KB) for n in range(5)})
    with Archive(data, CAPS) as zf:
        for name in zf.names[:4]:
            assert len(zf.read(name)) == 900 * KB
        with pytest.raises(ArchiveRefused, match=r"inflates to over 4 MB, the limit for what is read from it "
                                                 r"\(at '4.bin'\)"):
            zf.read("4.bin")


def test_a_pile_of_entries_is_refused_before_zipfile_lists_them():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for n in range(50_000):
            z.writestr(zipfile.ZipInfo(f"{n:x}", date_time=DATE), b"")
    data = out.getvalue()
    with peak_growth_mb(os.getpid()) as grown:
        t0 = time.perf_counter()
        with pytest.raises(ArchiveRefused, match="lists more than 20 files; at most 20 are accepted"):
            Archive(data, CAPS)
        took = time.perf_counter() - t0
    assert took < 1.0 and grown["mb"] < 8, (took, grown)  # zipfile's own listing: 26 MB, 0.4 s


def test_names_are_the_plain_files_and_a_missing_one_is_named():
    with Archive(_zip({"a/": b"", "a/b.txt": b"hello"}), CAPS) as zf:
        assert zf.names == ["a/b.txt"] and "a/b.txt" in zf
        assert zf.read("a/b.txt") == b"hello"
        with pytest.raises(ArchiveRefused, match="names 'a/c.txt', which it does not contain"):
            zf.read("a/c.txt")


LINK = (stat.S_IFLNK | 0o777) << 16
DEVICE = (stat.S_IFCHR | 0o644) << 16


@pytest.mark.parametrize("data, message", [
    (b"not a zip at all", "The file is not a valid test archive: it is not a ZIP archive, or it is damaged."),
    (_zip({"a.txt": b"x" * 1000})[:-30], "The file is not a valid test archive: it is not a ZIP archive, or it is "
                                         "damaged."),
    (_zip({"../evil.txt": b"x"}), "The test archive holds '../evil.txt', an unsafe path; only relative names are "
                                  "accepted."),
    (_zip({"/etc/passwd": b"x"}), "The test archive holds '/etc/passwd', an unsafe path; only relative names are "
                                  "accepted."),
    (_zip({"C:/x.txt": b"x"}), "The test archive holds 'C:/x.txt', an unsafe path; only relative names are "
                               "accepted."),
    (_zip({"link": b"/etc/passwd"}, attrs={"link": LINK}), "The test archive's 'link' is a symbolic link; only plain "
                                                           "files are accepted."),
    (_zip({"dev": b""}, attrs={"dev": DEVICE}), "The test archive's 'dev' is not a plain file."),
    (_patch(_zip({"a.txt": b"secret"}), "a.txt", flags=1), "The test archive's 'a.txt' is encrypted; export it again "
                                                           "without a password."),
    (_zip({"a.txt": b"x" * 100}, method=zipfile.ZIP_BZIP2), "The test archive's 'a.txt' uses a compression method the "
                                                            "studio does not read; only stored and deflated files "
                                                            "are accepted."),
    (_zip({"a.txt": b"x" * 100}, method=zipfile.ZIP_LZMA), "The test archive's 'a.txt' uses a compression method the "
                                                           "studio does not read; only stored and deflated files "
                                                           "are accepted."),
], ids=["not a zip", "truncated", "traversal", "absolute", "drive", "symlink", "device", "encrypted", "bzip2",
        "lzma"])
def test_a_bad_directory_is_one_sentence(data, message):
    with pytest.raises(ArchiveRefused) as refused:
        Archive(data, CAPS)
    assert str(refused.value) == message


def test_a_name_listed_twice_is_refused():
    out = io.BytesIO()
    with pytest.warns(UserWarning), zipfile.ZipFile(out, "w") as z:
        z.writestr(zipfile.ZipInfo("a.txt", date_time=DATE), b"one")
        z.writestr(zipfile.ZipInfo("a.txt", date_time=DATE), b"two")
    with pytest.raises(ArchiveRefused, match="The test archive lists 'a.txt' twice."):
        Archive(out.getvalue(), CAPS)


def test_a_bomb_by_its_ratio_is_refused_unread():
    with pytest.raises(ArchiveRefused, match=r"'zeros' inflates 1,0\d\d× its packed size \(the limit is 100×\); "
                                             r"this looks like a ZIP bomb"):
        Archive(_zip({"zeros": bytes(MB)}), Caps("test archive", 20, 4 * MB, 4 * MB, ratio=100))


def test_damaged_compressed_data_is_a_sentence():
    data = bytearray(_zip({"a.txt": os.urandom(4000)}))
    body = data.index(b"a.txt") + len("a.txt")
    data[body:body + 200] = bytes(200)  # the deflate stream's start, zeroed
    with Archive(bytes(data), CAPS) as zf, pytest.raises(ArchiveRefused) as refused:
        zf.read("a.txt")
    assert str(refused.value).startswith("The test archive's 'a.txt' cannot be read: ")
    assert "Error" not in str(refused.value)


# ------------------------------------------------------------------------------------------- EPUBs
CONTAINER = (b'<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
             b'<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
             b'</rootfiles></container>')
LAUGHS = b'<?xml version="1.0"?><!DOCTYPE package [<!ENTITY lol "lol">' + b"".join(
    b'<!ENTITY lol%d "%s">' % (n + 1, (b"&lol%d;" % n if n else b"&lol;") * 10) for n in range(9)) + b"]>"


def _package(manifest: dict[str, str], spine: list[str], *, head: bytes = b"", title: bytes = b"Hostile") -> bytes:
    """An OPF: `manifest` maps ids to XHTML hrefs; `spine` lists ids in reading order."""
    items = b"".join(b'<item id="%s" href="%s" media-type="application/xhtml+xml"/>' % (i.encode(), h.encode())
                     for i, h in manifest.items())
    refs = b"".join(b'<itemref idref="%s"/>' % i.encode() for i in spine)
    return (head + b'<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">'
            b'<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">hostile-1</dc:identifier>'
            b"<dc:title>" + title + b"</dc:title><dc:language>en</dc:language></metadata>"
            b"<manifest>" + items + b"</manifest><spine>" + refs + b"</spine></package>")


def _epub(documents: dict[str, bytes], package: bytes) -> dict[str, bytes]:
    """An EPUB's members: `documents` (names under OEBPS/) and the package, beside the mimetype and container."""
    return {"mimetype": b"application/epub+zip", "META-INF/container.xml": CONTAINER, "OEBPS/content.opf": package,
            **{f"OEBPS/{name}": data for name, data in documents.items()}}


def _chapter(size: int) -> bytes:
    """XHTML of about `size` bytes: paragraphs of words that repeat every ~16 KB, so it deflates ~60×, as the
    hostile book did (a 1 MB chapter in a 16 KiB EPUB), but under the 100× a bomb is named by."""
    words = [f"w{n * 7919 % 100_003:x}" for n in range(2_000)]
    cycle = "".join(f"<p>{' '.join(words[i:i + 12])}.</p>\n" for i in range(0, len(words), 12)).encode()
    body = cycle * (size // len(cycle) + 1)
    return b"<html><body><h1>The sea</h1>" + body[:size] + b"</body></html>"


def test_an_epub_member_inflating_past_what_it_declares_is_refused_fast_in_little_memory():
    """A chapter whose directory says 5,000 bytes inflates to 512 MiB: refused at its declared size."""
    members = _epub({}, _package({"c1": "c1.xhtml"}, ["c1"]))
    data = _bomb("OEBPS/c1.xhtml", mib=512, declared=5_000, others=members)
    with peak_growth_mb(os.getpid()) as grown:
        t0 = time.perf_counter()
        with pytest.raises(ImportRefused) as refused:
            importing.from_file("book.epub", data)
        took = time.perf_counter() - t0
    assert str(refused.value) == ("The EPUB's 'OEBPS/c1.xhtml' cannot be read: its contents do not match its "
                                  "checksum (damaged, or larger than its directory says).")
    assert took < 0.5 and grown["mb"] < 16, (took, grown)


def test_an_epub_text_file_stops_at_its_cap():
    big = os.urandom(10 * MB).hex().encode()  # 20 MB that deflates only 2×: no ratio gives it away
    data = _zip(_epub({"c1.xhtml": big}, _package({"c1": "c1.xhtml"}, ["c1"])))
    with peak_growth_mb(os.getpid()) as grown:
        with pytest.raises(ImportRefused) as refused:
            importing.from_file("book.epub", data)
    assert str(refused.value) == ("The EPUB's 'OEBPS/c1.xhtml' is more than 16,777,216 bytes inflated; the limit for "
                                  "one text file is 16 MB.")
    assert grown["mb"] < 60, grown


@pytest.fixture
def parses(monkeypatch):
    """The names of the documents the importer parses, in order."""
    names, parse = [], importing._document_text
    monkeypatch.setattr(importing, "_document_text", lambda content, name: names.append(name) or parse(content, name))
    return names


def test_a_spine_repeating_one_chapter_reads_it_once(parses):
    """A 16 KiB EPUB whose spine lists one 1 MB chapter 150 times: one chapter, parsed once."""
    data = _zip(_epub({"c1.xhtml": _chapter(MB)}, _package({"c1": "c1.xhtml"}, ["c1"] * 150)))
    assert len(data) < 24 * KB
    with peak_growth_mb(os.getpid()) as grown:
        t0 = time.perf_counter()
        book = importing.from_file("book.epub", data)
        took = time.perf_counter() - t0
    assert [c.title for c in book.chapters] == ["The sea"] and parses == ["c1.xhtml"]
    assert "The reading order lists 'c1.xhtml' 150 times; it is read once." in book.notes
    assert took < 3.0 and grown["mb"] < 60, (took, grown)  # before: 150 parses, 31 s, +145 MB


def test_a_spine_naming_one_file_under_many_ids_reads_it_once(parses):
    manifest = {f"c{n}": "c1.xhtml" for n in range(150)}
    data = _zip(_epub({"c1.xhtml": _chapter(MB)}, _package(manifest, list(manifest))))
    t0 = time.perf_counter()
    book = importing.from_file("book.epub", data)
    assert len(book.chapters) == 1 and parses == ["c1.xhtml"]
    assert time.perf_counter() - t0 < 3.0  # before: 150 parses, 35 s


def test_a_spine_over_its_cap_is_refused_before_a_document_is_parsed():
    manifest = {f"c{n}": "c1.xhtml" for n in range(5_001)}
    data = _zip(_epub({"c1.xhtml": b"<html><body><p>Hi.</p></body></html>"}, _package(manifest, list(manifest))))
    with pytest.raises(ImportRefused, match=r"^The EPUB's reading order \(spine\) lists 5,001 documents; at most "
                                            r"5,000 are accepted\.$"):
        importing.from_file("book.epub", data)


def test_text_is_counted_before_the_next_document_is_parsed(parses):
    """Twenty distinct 1 MB chapters against a 2,000,000-character limit: refused after the third."""
    manifest = {f"c{n}": f"c{n}.xhtml" for n in range(20)}
    data = _zip(_epub({f"c{n}.xhtml": _chapter(MB) for n in range(20)}, _package(manifest, list(manifest))))
    t0 = time.perf_counter()
    with pytest.raises(ImportRefused, match=r"^The book is at least 2,\d{3},\d{3} characters; a project holds at most "
                                            r"2,000,000 \(--project-max-chars\)\."):
        importing.from_file("book.epub", data)
    assert parses == ["c0.xhtml", "c1.xhtml", "c2.xhtml"]
    assert time.perf_counter() - t0 < 3.0  # before: all 20 parsed, 5.7 s


def test_more_text_files_than_the_total_cap_are_refused_as_they_inflate():
    manifest = {f"c{n}": f"c{n}.xhtml" for n in range(40)}
    data = _zip(_epub({f"c{n}.xhtml": _chapter(MB) for n in range(40)}, _package(manifest, list(manifest))))
    with peak_growth_mb(os.getpid()) as grown:
        with pytest.raises(ImportRefused, match=r"^The EPUB inflates to over 32 MB, the limit for what is read from "
                                                r"it \(at 'OEBPS/c3\d.xhtml'\); is it a ZIP bomb\?$"):
            importing.from_file("book.epub", data)
    assert grown["mb"] < 80, grown


def test_images_fonts_and_media_are_never_inflated():
    """Three 12 MiB images (36 MiB, over the 32 MiB the text may inflate to): unread, the book imports."""
    images = {f"img{n}.png": os.urandom(12 * MB) for n in range(3)}
    package = _package({"c1": "c1.xhtml"}, ["c1"]).replace(b"</manifest>", b"".join(
        b'<item id="i%d" href="%s" media-type="image/png"/>' % (n, name.encode()) for n, name in enumerate(images))
        + b"</manifest>")
    data = _zip(_epub({"c1.xhtml": b"<html><body><p>Hello there.</p></body></html>", **images}, package),
                method=zipfile.ZIP_STORED)
    with peak_growth_mb(os.getpid()) as grown:
        book = importing.from_file("book.epub", data)
    assert book.chapters[0].text == "Hello there." and grown["mb"] < 12, grown


def test_billion_laughs_in_the_package_is_refused_with_a_sentence():
    package = _package({"c1": "c1.xhtml"}, ["c1"], head=LAUGHS, title=b"&lol9;")
    data = _zip(_epub({"c1.xhtml": b"<html><body><p>Hello there.</p></body></html>"}, package))
    with pytest.raises(ImportRefused) as refused:
        importing.from_file("book.epub", data)
    assert str(refused.value) == ("The EPUB's 'OEBPS/content.opf' declares XML entities (<!ENTITY …>), which books "
                                  "never need and XML bombs are made of; it is refused.")


@pytest.mark.parametrize("package", [
    b'<package xmlns="http://www.idpf.org/2007/opf" version="3.0"><metadata/></package>',
    b"<package><broken",
    b"\xff\xfe not xml",
], ids=["no manifest", "truncated", "binary"])
def test_a_malformed_package_is_one_sentence_without_internal_text(package):
    data = _zip(_epub({"c1.xhtml": b"<html><body><p>Hi.</p></body></html>"}, package))
    with pytest.raises(ImportRefused) as refused:
        importing.from_file("book.epub", data)
    assert str(refused.value) == ("The EPUB could not be read: its package (META-INF/container.xml and the .opf file "
                                  "it names) is missing or malformed. Export it again from its source, or paste its "
                                  "text.")


def test_a_cover_over_its_cap_is_left_out_with_a_note():
    package = _package({"c1": "c1.xhtml"}, ["c1"]).replace(
        b"</manifest>", b'<item id="cover" href="cover.jpg" media-type="image/jpeg" properties="cover-image"/>'
                        b"</manifest>")
    data = _zip(_epub({"c1.xhtml": b"<html><body><p>Hello there.</p></body></html>",
                       "cover.jpg": b"\xff\xd8" + os.urandom(11 * MB)}, package), method=zipfile.ZIP_STORED)
    book = importing.from_file("book.epub", data)
    assert book.cover is None and book.chapters[0].text == "Hello there."
    assert ("The EPUB's 'OEBPS/cover.jpg' is more than 10,485,760 bytes inflated; the limit for a cover image is "
            "10 MB. The book was imported without its cover.") in book.notes


def test_the_projects_api_answers_hostile_epubs_with_a_400_sentence_in_little_memory(demo_studio):
    """Rows 1 and 16 through `POST /v1/projects` on a running studio, its RSS measured around each upload."""
    liar = _bomb("OEBPS/c1.xhtml", mib=512, declared=5_000, others=_epub({}, _package({"c1": "c1.xhtml"}, ["c1"])))
    laughs = _zip(_epub({"c1.xhtml": b"<html><body><p>Hi.</p></body></html>"},
                        _package({"c1": "c1.xhtml"}, ["c1"], head=LAUGHS, title=b"&lol9;")))
    pid = server_pid(demo_studio.url)
    with httpx.Client(base_url=demo_studio.url, timeout=60) as client:
        for data, message in ((liar, "The EPUB's 'OEBPS/c1.xhtml' cannot be read: its contents do not match"),
                              (laughs, "The EPUB's 'OEBPS/content.opf' declares XML entities")):
            with peak_growth_mb(pid) as grown:
                r = client.post("/v1/projects", files={"file": ("book.epub", data, "application/epub+zip")})
            assert r.status_code == 400 and r.json()["error"]["message"].startswith(message), r.text
            assert grown["mb"] < 40, grown  # before: +1.0 GB for the liar
