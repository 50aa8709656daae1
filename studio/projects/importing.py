"""A book in: pasted text, a `.txt`, a `.md` (headings → chapters) or an `.epub` (ebooklib) → chapter drafts.

Pure functions of the bytes, checked against `Limits` before anything is stored, so a refused file leaves
nothing behind. An EPUB is a ZIP read through `studio.files.archive`: its directory is checked first (entry count,
names, compression ratio: a ZIP bomb is refused unread), then only its text files are inflated, each counted
against a cap as it inflates, and the cover last. DRM (an `encryption.xml` over the text) is named as such;
entity declarations and XML nested deeper than `MAX_XML_DEPTH` are refused. Chapters come from the spine in
reading order, each document once, titled from the table of contents (else the document's first heading),
the text counted against the limits before the next document is parsed; front matter (cover, title page,
copyright, contents …) is imported with `skip` set, so the owner can tick it back in.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from ebooklib import ITEM_COVER, ITEM_DOCUMENT, ITEM_IMAGE, epub
from lxml import etree, html

from studio.files.archive import MB, Archive, ArchiveRefused, Caps
from studio.projects.headings import split_chapters
from studio.text.clean import clean_text

MAX_PROJECT_CHARS = 2_000_000  # ~35 hours of speech: a long novel (--project-max-chars)
MAX_CHAPTERS = 500  # --project-max-chapters
MAX_IMPORT_BYTES = 50 * MB  # an uploaded book file (--project-max-upload-mb)
MAX_EPUB_MEMBERS = 5000  # files in an EPUB's ZIP directory, folders included
MAX_EPUB_INFLATED = 32 * MB  # its text files and cover inflated, all together: 5× the markup of a 2 M-char book
MAX_EPUB_DOCUMENT = 16 * MB  # one XHTML / XML file inflated; a whole novel in one file is 2-6 MB
MAX_EPUB_COVER = 10 * MB  # the cover image; a print-quality cover is 1-5 MB
MAX_SPINE_ENTRIES = 5000  # documents in the reading order (the spine); at most one per file
MAX_COMPRESSION_RATIO = 100  # text deflates ~3-10×; a bomb inflates thousands of times
MAX_XML_DEPTH = 200  # nesting of one document's markup
EPUB = Caps(noun="EPUB", members=MAX_EPUB_MEMBERS, total=MAX_EPUB_INFLATED, member=MAX_EPUB_DOCUMENT,
            ratio=MAX_COMPRESSION_RATIO)
# Images, fonts, styles and media are never inflated (the cover is read by name at the end); anything else is
# read as text, under the caps, so a document with an odd name still gives its chapter.
_MEDIA_FILE = re.compile(r"\.(jpe?g|png|gif|webp|bmp|tiff?|svg|ttf|otf|woff2?|eot|css|js|mp3|m4a|aac|ogg|oga|opus|"
                         r"wav|mp4|m4v|webm)$", re.IGNORECASE)
_XML_FILE = re.compile(r"\.(xml|opf|ncx)$", re.IGNORECASE)  # parsed by ebooklib as XML, where entities would live
MAX_TITLE_CHARS = 200
FRONT_MATTER = re.compile(r"cover|title-?page|copyright|imprint|toc|contents|dedication|acknowledg|halftitle|"
                          r"colophon|frontmatter|front-matter|also-?by|praise", re.IGNORECASE)
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_FENCE = re.compile(r"^[ \t]*(```|~~~)")
_BLOCKS = {"p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "li", "blockquote", "section", "article", "tr", "br",
           "dd", "dt", "pre", "figcaption", "aside"}


class ImportRefused(ValueError):
    """A book that cannot be imported; the message says why and what to do."""


@dataclass(frozen=True)
class Limits:
    max_chars: int = MAX_PROJECT_CHARS
    max_chapters: int = MAX_CHAPTERS
    max_bytes: int = MAX_IMPORT_BYTES


@dataclass(frozen=True)
class Draft:
    title: str
    text: str
    skip: bool = False


@dataclass(frozen=True)
class Book:
    """What an import found: metadata (empty where the file says nothing), chapters, a cover, and notes for
    the owner (sections dropped as empty, front matter unticked)."""
    title: str
    chapters: list[Draft]
    author: str = ""
    language: str = ""
    cover: bytes | None = None
    cover_type: str = "image/jpeg"
    extra: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def from_text(text: str, *, title: str = "", markdown: bool = False, limits: Limits = Limits(),
              fallback: str = "") -> Book:
    """Pasted or uploaded text: a chapter per heading line ("Chapter 1", "Part II": studio/projects/headings.py)
    or with `markdown` per `#` heading, else one chapter. The title: `title`, else the one the text gives
    (a `# Title` over `##` chapters, a first line before "Chapter 1"), else `fallback` (a file's name)."""
    if not isinstance(text, str) or not text.strip():
        raise ImportRefused("The text is empty: paste the book's text or upload a .txt, .md or .epub file.")
    if len(text) > limits.max_chars:
        raise ImportRefused(f"The text is {len(text):,} characters; a project holds at most {limits.max_chars:,} "
                            "(--project-max-chars). Split the book into several projects.")
    found = split_chapters(text)  # "Chapter 1", "Part II" … on lines of their own
    if markdown and _has_headings(text) or found is None and markdown:
        heading, chapters, notes = _markdown_chapters(text)
        return checked(Book(title or heading or fallback or "Untitled", chapters, notes=notes), limits)
    if found is None:
        name = title or fallback
        return checked(Book(name or "Untitled", [Draft(name or "Chapter 1", text.strip())]), limits)
    chapters = [Draft(_title(name), body) for name, body in found.chapters]
    return checked(Book(title or found.title or fallback or "Untitled", chapters, author=found.author), limits)


def _has_headings(text: str) -> bool:
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and _HEADING.match(line):
            return True
    return False


def from_file(name: str, data: bytes, *, title: str = "", limits: Limits = Limits()) -> Book:
    """An uploaded file, by its extension: .txt, .md / .markdown, .epub."""
    if len(data) > limits.max_bytes:
        raise ImportRefused(f"The file is {len(data) / 2 ** 20:.1f} MB; the limit is {limits.max_bytes / 2 ** 20:.0f} "
                            "MB (--project-max-upload-mb).")
    ext = posixpath.splitext(name.lower())[1]
    if ext == ".epub":
        return from_epub(data, limits=limits, title=title)
    if ext not in (".txt", ".md", ".markdown", ""):
        raise ImportRefused(f"Cannot import {ext} files: upload a .txt, .md or .epub file (or paste the text).")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ImportRefused(f"The file is not UTF-8 text (byte {exc.start}); save it as UTF-8 and upload it "
                            "again.") from None
    stem = posixpath.splitext(posixpath.basename(name))[0]
    return from_text(text, title=title, markdown=ext in (".md", ".markdown"), limits=limits, fallback=stem)


def checked(book: Book, limits: Limits) -> Book:
    """`book` if it fits the limits and has something to say; ImportRefused with the reason otherwise."""
    chapters = [c for c in book.chapters if c.text.strip()]
    if not chapters:
        raise ImportRefused("The book has no text to speak (every chapter is empty).")
    _within(len(chapters), sum(len(c.text) for c in chapters), limits)
    return book


def _within(chapters: int, chars: int, limits: Limits, *, more: str = "") -> None:
    """ImportRefused if `chapters` chapters of `chars` characters in all (`more`: "at least " while still reading) pass
    the limits."""
    if chapters > limits.max_chapters:
        raise ImportRefused(f"The book has {more}{chapters} chapters; a project holds at most {limits.max_chapters} "
                            "(--project-max-chapters).")
    if chars > limits.max_chars:
        raise ImportRefused(f"The book is {more}{chars:,} characters; a project holds at most {limits.max_chars:,} "
                            "(--project-max-chars). Split it into several projects.")


# ------------------------------------------------------------------------------------------- markdown
def _markdown_chapters(text: str) -> tuple[str, list[Draft], list[str]]:
    """(the book's title heading or "", chapters, notes). Chapters start at the top heading level used more
    than once (a lone `# Title` over `## Chapter` headings is the book's title); text before the first
    chapter is a chapter of its own."""
    lines = text.splitlines()
    headings, fenced = [], False
    for n, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := _HEADING.match(line)):
            headings.append((n, len(m.group(1)), m.group(2).strip()))
    levels = sorted({level for _, level, _ in headings})
    book_title = ""
    level = next((lv for lv in levels if sum(1 for _, x, _ in headings if x == lv) > 1), levels[0] if levels else 0)
    tops = [h for h in headings if h[1] < level]
    if len(tops) == 1:
        book_title = tops[0][2]
    cuts = [h for h in headings if h[1] == level]
    if not book_title and cuts and not clean_text("\n".join(lines[:cuts[0][0]])).strip():
        # The first heading opens the file: the book's title when it is the only one of its level, or has no text
        # of its own before the next (`# Title` over `# One`, `# Two`).
        end = cuts[1][0] if len(cuts) > 1 else len(lines)
        if len(cuts) == 1 or not clean_text("\n".join(lines[cuts[0][0] + 1:end])).strip():
            book_title = cuts[0][2]
    sections = []
    start, name = 0, ""
    for n, _, title in cuts:
        sections.append((name, lines[start:n]))
        start, name = n + 1, title
    sections.append((name, lines[start:]))
    chapters, notes = [], []
    for i, (name, body) in enumerate(sections):
        body = [line for line in body if not (book_title and _HEADING.match(line)
                                              and _HEADING.match(line).group(2).strip() == book_title)]
        spoken = clean_text("\n".join(body)).strip()
        if not spoken:
            if name and name != book_title:
                notes.append(f"The section {name!r} has no text and was left out.")
            continue
        chapters.append(Draft(_title(name or book_title or f"Chapter {i + 1}"), spoken))
    return book_title, chapters, notes


def _title(text: str) -> str:
    text = " ".join(text.split())
    return text[:MAX_TITLE_CHARS] or "Untitled"


# ------------------------------------------------------------------------------------------- epub
def from_epub(data: bytes, *, limits: Limits = Limits(), title: str = "") -> Book:
    """An EPUB 2 or 3: metadata, cover, and the spine's documents as chapters."""
    try:
        with Archive(data, EPUB) as archive:
            return _read_epub(archive, limits, title)
    except ArchiveRefused as exc:
        raise ImportRefused(str(exc)) from None


def _read_epub(archive: Archive, limits: Limits, title: str) -> Book:
    if "META-INF/container.xml" not in archive:
        raise ImportRefused("The file is a ZIP but not an EPUB (no META-INF/container.xml).")
    _refuse_drm(archive)
    reader = _Reader(archive)
    try:
        book = reader.load()
    except (ArchiveRefused, ImportRefused):
        raise
    except Exception:  # ebooklib raises many kinds for a broken package; all mean the same to the owner
        raise ImportRefused("The EPUB could not be read: its package (META-INF/container.xml and the .opf file it "
                            "names) is missing or malformed. Export it again from its source, or paste its "
                            "text.") from None
    if len(book.spine) > MAX_SPINE_ENTRIES:
        raise ImportRefused(f"The EPUB's reading order (spine) lists {len(book.spine):,} documents; at most "
                            f"{MAX_SPINE_ENTRIES:,} are accepted.")
    titles = _toc_titles(book.toc)
    chapters, notes, read, repeated, chars = [], [], set(), {}, 0
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        if item is None or item.get_type() != ITEM_DOCUMENT or isinstance(item, epub.EpubNav):
            continue  # the navigation document is the table of contents, not part of the book
        if item.get_name() in read:  # a spine may name a document twice (an EPUB error), or 5,000 times
            repeated[item.get_name()] = repeated.get(item.get_name(), 1) + 1
            continue
        read.add(item.get_name())
        _within(len(chapters), chars, limits, more="at least ")  # before parsing one more document
        text, heading = _document_text(item.content or b"", item.get_name())
        name = titles.get(item.get_name()) or heading
        if not text.strip():
            continue
        chars += len(text)
        front = bool(FRONT_MATTER.search(f"{item.get_name()} {idref} {name or ''}"))
        chapter = Draft(_title(name or f"Chapter {len(chapters) + 1}"), text, skip=front)
        if front:
            notes.append(f"{chapter.title!r} looks like front matter: it is unticked (tick it to include it).")
        chapters.append(chapter)
    notes += [f"The reading order lists {name!r} {times:,} times; it is read once." for name, times in repeated.items()]
    if not chapters:
        raise ImportRefused("The EPUB has no text in its spine (only images or empty pages?); nothing to speak.")
    meta = {key: _dc(book, key) for key in ("title", "creator", "language", "identifier", "publisher", "date")}
    cover, cover_type = _cover(archive, reader, book, notes)
    extra = {k: meta[k] for k in ("identifier", "publisher", "date") if meta[k]}
    return checked(Book(title or meta["title"] or "Untitled", chapters, author=meta["creator"],
                        language=meta["language"], cover=cover, cover_type=cover_type, extra=extra, notes=notes),
                   limits)


class _Reader(epub.EpubReader):
    """ebooklib's reader over the capped archive: text files are inflated once each (a manifest may name one
    file many times), media not at all, and package files that declare XML entities are refused."""

    def __init__(self, archive: Archive):
        super().__init__(None, {"ignore_ncx": False})
        self.archive, self.texts = archive, {}

    def _load(self) -> None:  # ebooklib's, less the ZipFile it would open: every read goes through read_file
        self._load_container()
        self._load_opf_file()

    def read_file(self, name: str) -> bytes:
        name = posixpath.normpath(name)
        if name not in self.archive:
            raise KeyError(name)  # as zipfile does: ebooklib's word for a package naming a missing file
        if _MEDIA_FILE.search(name):
            return b""
        if name not in self.texts:
            data = self.archive.read(name, kind="one text file")
            if _XML_FILE.search(name) and b"<!ENTITY" in data:
                raise ImportRefused(f"The EPUB's {name!r} declares XML entities (<!ENTITY …>), which books never "
                                    "need and XML bombs are made of; it is refused.")
            self.texts[name] = data
        return self.texts[name]


def _cover(archive: Archive, reader: _Reader, book, notes: list[str]) -> tuple[bytes | None, str]:
    """(the cover image's bytes or None, its type): the item the package calls the cover, else an image named
    cover. One that cannot be read is left out with a note; the book is still imported."""
    covers = list(book.get_items_of_type(ITEM_COVER)) + [
        i for i in book.get_items_of_type(ITEM_IMAGE) if "cover" in f"{i.get_id()} {i.get_name()}".lower()]
    if not covers:
        return None, "image/jpeg"
    try:
        data = archive.read(posixpath.normpath(posixpath.join(reader.opf_dir, covers[0].get_name())),
                            limit=MAX_EPUB_COVER, kind="a cover image")
    except ArchiveRefused as exc:
        notes.append(f"{exc} The book was imported without its cover.")
        return None, "image/jpeg"
    return data, covers[0].media_type or "image/jpeg"


def _refuse_drm(archive: Archive) -> None:
    """Encrypted content documents mean DRM. Font obfuscation (IDPF / Adobe) also lives in encryption.xml and
    is harmless: only the fonts are scrambled."""
    if "META-INF/encryption.xml" not in archive:
        return
    manifest = archive.read("META-INF/encryption.xml", kind="one text file").decode("utf-8", "replace")
    targets = re.findall(r"URI\s*=\s*[\"']([^\"']+)", manifest)
    fonts_only = all(re.search(r"\.(otf|ttf|woff2?)$", t, re.IGNORECASE) for t in targets)
    if not fonts_only or "META-INF/rights.xml" in archive:
        raise ImportRefused("The EPUB is DRM-protected (its text is encrypted); import a DRM-free copy.")


def _toc_titles(toc) -> dict[str, str]:
    """Document name → the title the table of contents gives it (the first entry that points into it)."""
    out: dict[str, str] = {}
    stack = list(toc)[::-1]
    while stack:
        entry = stack.pop()
        if isinstance(entry, (tuple, list)):
            section, children = entry[0], entry[1]
            stack.extend(list(children)[::-1])
            entry = section
        href, name = getattr(entry, "href", None), getattr(entry, "title", None)
        if href and name:
            out.setdefault(unquote(href.split("#")[0]), name)
    return out


def _document_text(content: bytes, name: str) -> tuple[str, str | None]:
    """(the document's text, paragraphs separated by blank lines; its first heading or None)."""
    try:
        parser = html.HTMLParser(recover=True, no_network=True, remove_comments=True)
        root = html.fromstring(content, parser=parser) if content.strip() else None
    except (etree.ParserError, ValueError):
        raise ImportRefused(f"The EPUB's {name!r} is not readable XHTML; export the book again from its "
                            "source.") from None
    if root is None:
        return "", None
    heading = None
    blocks: list[str] = []
    current: list[str] = []
    depth = 0
    for event, el in etree.iterwalk(root, events=("start", "end")):
        tag = el.tag.rsplit("}", 1)[-1].lower() if isinstance(el.tag, str) else ""
        if event == "start":
            depth += 1
            if depth > MAX_XML_DEPTH:
                raise ImportRefused(f"{name} in the EPUB nests its markup over {MAX_XML_DEPTH} levels deep; this "
                                    "looks malicious and is refused.")
            if tag in ("script", "style", "head"):
                el.text = None
            if tag in _BLOCKS and current:
                blocks.append(" ".join(current))
                current = []
            if el.text and tag not in ("script", "style", "head", "title"):
                current.append(el.text.strip())
        else:
            depth -= 1
            if tag in _BLOCKS and current:
                text = " ".join(t for t in current if t)
                blocks.append(text)
                if heading is None and tag in ("h1", "h2", "h3") and text.strip():
                    heading = text.strip()
                current = []
            if el.tail and el.tail.strip():
                current.append(el.tail.strip())
    if current:
        blocks.append(" ".join(current))
    paragraphs = [" ".join(b.split()) for b in blocks if b.strip()]
    return "\n\n".join(paragraphs), heading


def _dc(book, key: str) -> str:
    values = book.get_metadata("DC", key)
    return " ".join(str(values[0][0]).split()) if values and values[0] and values[0][0] else ""

