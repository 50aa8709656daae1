"""The one reader for every ZIP the studio accepts (EPUBs, voice bundles): a member is inflated only by
`Archive.read`, which streams it and counts the bytes it actually inflates, so a member that lies about its
size, a bomb, or a pile of members stops at a stated cap, not at the machine's memory.

    caps = Caps(noun="voice bundle", members=801, total=256 * MB, member=2 * MB)
    with Archive(data, caps) as zf:               # the directory is checked here, nothing is inflated
        for name in zf.names:                     # plain files with safe relative names
            wav = zf.read(name, limit=2 * MB, kind="a voice clip")

Every refusal is an `ArchiveRefused` whose message is a sentence naming the member and the limit.
"""

from __future__ import annotations

import io
import re
import stat
import zipfile
import zlib
from dataclasses import dataclass

KB, MB = 2 ** 10, 2 ** 20
CHUNK = 64 * KB  # inflated per step: the most a read holds beyond its cap
# zipfile inflates bzip2 and LZMA a whole compressed block at a time (4 KB of bzip2 can be gigabytes), so only
# these two are read; EPUBs and our own bundles use nothing else.
READABLE = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED}
_DIRECTORY_ENTRY = b"PK\x01\x02"  # starts every central-directory entry
_DRIVE = re.compile(r"[A-Za-z]:")


class ArchiveRefused(ValueError):
    """An archive, or one of its members, that is not read; the message says which and why."""


@dataclass(frozen=True)
class Caps:
    """What one kind of archive may hold. `member` caps any one read unless the read names a tighter limit;
    `ratio` (inflated / packed bytes of a member, None for no check) names a ZIP bomb by its directory."""
    noun: str  # how messages name the archive: "EPUB", "voice bundle"
    members: int  # entries in its directory, folders included
    total: int  # inflated bytes, every read together
    member: int  # inflated bytes of one member
    ratio: int | None = None


class Archive:
    """A ZIP whose directory has been checked: at most `caps.members` entries, every one a folder or a plain
    file with a safe relative name, stored or deflated, not encrypted, listed once."""

    def __init__(self, data: bytes | bytearray | memoryview, caps: Caps):
        self.caps, self.inflated = caps, 0
        # Counted before zipfile builds its directory (300,000 entries cost it 160 MB and 2 s): zipfile checks
        # that every entry starts with this signature, so the count is never below the number it would list.
        data = data if isinstance(data, (bytes, bytearray)) else bytes(data)
        if data.count(_DIRECTORY_ENTRY) > caps.members:
            raise ArchiveRefused(f"The {caps.noun} lists more than {caps.members:,} files; at most "
                                 f"{caps.members:,} are accepted.")
        try:
            self._zip = zipfile.ZipFile(io.BytesIO(data))
            entries = self._zip.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError):
            raise ArchiveRefused(f"The file is not a valid {caps.noun}: it is not a ZIP archive, or it is "
                                 "damaged.") from None
        self._files: dict[str, zipfile.ZipInfo] = {}
        seen = set()
        for info in entries:
            self._check(info)
            if info.filename in seen:
                raise ArchiveRefused(f"The {caps.noun} lists {info.filename!r} twice.")
            seen.add(info.filename)
            if not info.is_dir():
                self._files[info.filename] = info
        self.names = list(self._files)

    def _check(self, info: zipfile.ZipInfo) -> None:
        name, noun, mode = info.filename, self.caps.noun, info.external_attr >> 16
        if not name or name.startswith("/") or "\\" in name or "\0" in name or _DRIVE.match(name) or \
                any(part in ("..", ".") for part in name.rstrip("/").split("/")):
            raise ArchiveRefused(f"The {noun} holds {name!r}, an unsafe path; only relative names are accepted.")
        if stat.S_ISLNK(mode):
            raise ArchiveRefused(f"The {noun}'s {name!r} is a symbolic link; only plain files are accepted.")
        if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):  # 0: the archiver recorded no type
            raise ArchiveRefused(f"The {noun}'s {name!r} is not a plain file.")
        if info.flag_bits & 0x1:
            raise ArchiveRefused(f"The {noun}'s {name!r} is encrypted; export it again without a password.")
        if info.compress_type not in READABLE:
            raise ArchiveRefused(f"The {noun}'s {name!r} uses a compression method the studio does not read; "
                                 "only stored and deflated files are accepted.")
        ratio = self.caps.ratio
        if ratio and info.file_size > ratio * max(info.compress_size, KB):
            raise ArchiveRefused(f"The {noun}'s {name!r} inflates {info.file_size // max(info.compress_size, 1):,}× "
                                 f"its packed size (the limit is {ratio}×); this looks like a ZIP bomb and is "
                                 "refused.")

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def read(self, name: str, *, limit: int | None = None, kind: str = "one file") -> bytes:
        """The member's bytes, inflated a chunk at a time and counted as they come: refused as soon as they pass
        `limit` (at most `caps.member`; `kind` names it in the message) or the archive's total passes
        `caps.total`, whatever the directory declares."""
        noun, caps = self.caps.noun, self.caps
        info = self._files.get(name)
        if info is None:
            raise ArchiveRefused(f"The {noun} names {name!r}, which it does not contain.")
        limit = caps.member if limit is None else min(limit, caps.member)
        out = bytearray()
        try:
            with self._zip.open(info) as member:
                while chunk := member.read(CHUNK):
                    out += chunk
                    self.inflated += len(chunk)
                    if len(out) > limit:
                        raise ArchiveRefused(f"The {noun}'s {name!r} is more than {limit:,} bytes inflated; "
                                             f"the limit for {kind} is {size(limit)}.")
                    if self.inflated > caps.total:
                        raise ArchiveRefused(f"The {noun} inflates to over {size(caps.total)}, the limit for "
                                             f"what is read from it (at {name!r}); is it a ZIP bomb?")
        except ArchiveRefused:
            raise
        except zipfile.BadZipFile as exc:
            why = ("its contents do not match its checksum (damaged, or larger than its directory says)"
                   if "CRC" in str(exc) else "its entry is damaged")
            raise ArchiveRefused(f"The {noun}'s {name!r} cannot be read: {why}.") from None
        except (zlib.error, EOFError, OSError, ValueError, RuntimeError, NotImplementedError):
            raise ArchiveRefused(f"The {noun}'s {name!r} cannot be read: its compressed data is damaged or cut "
                                 "short.") from None
        return bytes(out)

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def size(n: int) -> str:
    """A byte count as a person reads it: "16 MB", "64 KB", "900 bytes"."""
    if n >= MB:
        return f"{n / MB:.3g} MB"
    return f"{n / KB:.3g} KB" if n >= KB else f"{n:,} bytes"


__all__ = ["Archive", "ArchiveRefused", "Caps", "CHUNK", "KB", "MB", "size"]
