"""Hostile ZIPs: the shared reader (studio/archive.py) stops every member at a cap by the bytes it actually
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

import pytest

from studio.archive import KB, MB, Archive, ArchiveRefused, Caps
from tests.probes import peak_growth_mb

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
    assert took < 0.2 and grown["mb"] < 8, (took, grown)  # zipfile's own listing: 0.4 s, 26 MB


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
