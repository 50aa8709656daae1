"""The pronunciation dictionary: respelling rules applied to the text the model reads.

Every engine reads plain text, so a rule is a respelling (voicebox's choice, ElevenLabs' "alias" rules):
`Nguyen → Win`, `SQL → sequel`. A rule matches a whole word or phrase, case-insensitively unless told
otherwise, or is a regular expression (openedai-speech's `pre_process_map`); it may be scoped to a voice
(id or name) or a language. It applies after normalisation (engine/normalize.py) and before tokenisation,
never inside a control tag, in one pass: every rule reads the text as written, so a respelling is never matched
again, and the spoken text grows by at most MAX_GROWTH_FACTOR× or MAX_GROWTH_CHARS characters (studio/text/respell.py).

    rules = Dictionary([Rule.make("Nguyen", "Win"), Rule.make(r"\\bv(\\d+)\\b", r"version \\1", regex=True)])
    rules.apply("Nguyen shipped v3.")              # "Win shipped version 3."
    rules.affects("Ask Nguyen.")                   # True: projects mark such a segment stale
    rules.fingerprint("Ask Nguyen.")               # a hash of the rules that fire on this text
    changed(old, new, segment_texts)               # indices of the segments a change of rules touches
    merged(studio_rules, project_rules)            # project rules win over the owner's global ones

Regular expressions are RE2's (studio/text/respell.py): linear time in the text whatever the pattern, so none can
hang a worker; a pattern RE2 cannot run (a backreference, a lookaround) or too large for its memory budget is
refused with a sentence naming it, and a dictionary holds at most MAX_REGEX_RULES of them.

`DictionaryStore` keeps the owner's global dictionary in one JSON file beside the voice library (an
fsynced replace under a file lock, studio/files/durable.py). Files: JSON, TSV, and PLS
(the W3C lexicon ElevenLabs imports), of which the `<alias>` entries are read with defusedxml.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from defusedxml import ElementTree
from defusedxml.common import DefusedXmlException

from engine.tokenizer import TAG_RE
from studio.files.durable import file_lock, replace_file
from studio.text import clean_line
from studio.text.respell import MAX_REGEX_RULES, Matcher, PronunciationError, check_regex

FORMAT = "higgs-studio-dictionary/1"
MAX_RULES = 2000
MAX_WORD = 100  # characters of a word or phrase
MAX_PATTERN = 200  # characters of a regular expression
MAX_RESPELLING = 200
MAX_FILE_BYTES = 2 * 1024 * 1024  # an imported TSV, JSON or PLS file
MAX_SCOPES = 8  # compiled scopes kept per dictionary (voices × languages with rules of their own)
TSV_COLUMNS = ("word", "respelling", "regex", "case_sensitive", "voice", "language")
PLS_NS = "{http://www.w3.org/2005/01/pronunciation-lexicon}"
XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"

@dataclass(frozen=True)
class Rule:
    """`word` → `respelling`. `word` is a whole word or phrase, or with `regex` a pattern (its replacement may
    name groups: `\\1`, `\\g<name>`). `voice` (a voice id or name) and `language` (a code such as "en")
    limit where it applies."""

    word: str
    respelling: str
    regex: bool = False
    case_sensitive: bool = False
    voice: str | None = None
    language: str | None = None

    @classmethod
    def make(cls, word, respelling, *, regex: bool = False, case_sensitive: bool = False, voice=None,
             language=None) -> Rule:
        """A checked rule (PronunciationError with a sentence for a bad one)."""
        if not isinstance(regex, bool) or not isinstance(case_sensitive, bool):
            raise PronunciationError("A rule's `regex` and `case_sensitive` must be true or false.")
        word = clean_line(word, "rule's word", MAX_PATTERN if regex else MAX_WORD, required=True,
                          error=PronunciationError)
        respelling = clean_line(respelling, f"respelling of {word!r}", MAX_RESPELLING, required=True,
                                error=PronunciationError)
        if TAG_RE.search(respelling) or "<|" in respelling:
            raise PronunciationError(f"The respelling of {word!r} holds a control tag; a respelling is plain text "
                                     "(put tags in the text itself).")
        voice = clean_line(voice, "rule's voice", 100, error=PronunciationError) or None
        language = _language(clean_line(language, "rule's language", 20, error=PronunciationError)) or None
        rule = cls(word, respelling, regex, case_sensitive, voice, language)
        if regex:
            check_regex(rule)
        return rule

    @property
    def scoped(self) -> bool:
        return self.voice is not None or self.language is not None

    def applies(self, voice: Sequence[str], language: str | None) -> bool:
        """Whether the rule is in scope for a take in one of `voice` (its id and name) and `language`. A text
        of unknown language (None) takes every language's rules: only a known other language leaves one out
        (the studio tells English from the rest, engine/normalize.py, and a short line often reads as neither)."""
        if self.voice is not None and self.voice.casefold() not in {v.casefold() for v in voice if v}:
            return False
        return self.language is None or not language or self.language == _language(language)

    def to_json(self) -> dict:
        return asdict(self)


def _language(code: str | None) -> str:
    """"en-US" → "en": rules are scoped by the primary language subtag."""
    return (code or "").strip().lower().replace("_", "-").split("-")[0]


@dataclass(frozen=True)
class Dictionary:
    """An ordered list of rules, applied in one pass over the text as written. Later rules win over earlier ones
    for the same word, a scoped rule over an unscoped one, a case-sensitive one over a case-insensitive one; where
    matches overlap, the words and phrases come first (longest first), then the regular expressions in order."""

    rules: tuple[Rule, ...] = ()
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __init__(self, rules: Iterable[Rule] = (), *, sets: int = 1):
        """`sets`: how many dictionaries' rules these are, each within the caps (a project's take uses the
        owner's and the project's: 2); the caps are that many times one dictionary's."""
        rules = tuple(rules)
        if len(rules) > MAX_RULES * sets:
            raise PronunciationError(f"A dictionary holds at most {MAX_RULES} rules (got {len(rules)}).")
        if not all(isinstance(r, Rule) for r in rules):
            raise PronunciationError("A dictionary holds Rule values (Rule.make builds them).")
        patterns = sum(r.regex for r in rules)
        if patterns > MAX_REGEX_RULES * sets:
            raise PronunciationError(f"A dictionary holds at most {MAX_REGEX_RULES} regular-expression rules (got "
                                     f"{patterns}); write the others as words or phrases, which cost far less.")
        object.__setattr__(self, "rules", rules)
        object.__setattr__(self, "_cache", {})

    @classmethod
    def from_json(cls, data) -> Dictionary:
        """`{"rules": [...]}` or a bare list of `{"word", "respelling", ...}` objects (`rules_json` writes it)."""
        items = data.get("rules") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise PronunciationError('A dictionary is {"rules": [{"word": ..., "respelling": ...}, ...]}.')
        rules = []
        for n, item in enumerate(items, 1):
            if not isinstance(item, dict):
                raise PronunciationError(f"Rule {n} is not an object with `word` and `respelling`.")
            unknown = set(item) - set(TSV_COLUMNS)
            if unknown:
                raise PronunciationError(f"Rule {n} has unknown fields {sorted(unknown)}; the fields are "
                                         f"{', '.join(TSV_COLUMNS)}.")
            try:
                rules.append(Rule.make(item.get("word"), item.get("respelling"), regex=item.get("regex", False),
                                       case_sensitive=item.get("case_sensitive", False), voice=item.get("voice"),
                                       language=item.get("language")))
            except PronunciationError as exc:
                raise PronunciationError(f"Rule {n}: {exc}") from None
        return cls(rules)

    @property
    def version(self) -> str:
        """A stable hash of the rules (16 hex digits; "" for no rules): the same rules, the same version.
        Hashed once: the rules never change."""
        found = self._cache.get("version")
        if found is None:
            found = self._cache["version"] = digest(self.rules)
        return found

    def apply(self, text: str, *, voice: Sequence[str] = (), language: str | None = None) -> str:
        """`text` as it will be spoken: every rule in scope applied, control tags left as they are."""
        return self.spoken(text, voice=voice, language=language)[0]

    def matches(self, text: str, *, voice: Sequence[str] = (), language: str | None = None) -> list[Rule]:
        """The rules that change `text`, in this dictionary's order."""
        return self.spoken(text, voice=voice, language=language)[1]

    def spoken(self, text: str, *, voice: Sequence[str] = (), language: str | None = None) -> tuple[str, list[Rule]]:
        """(`text` as it will be spoken, the rules that fired on it in this dictionary's order): a dictionary of
        those rules alone speaks `text` the same way (a take's recipe keeps them)."""
        return self._run(text, tuple(voice), language)

    def affects(self, text: str, *, voice: Sequence[str] = (), language: str | None = None) -> bool:
        return bool(self.matches(text, voice=voice, language=language))

    def fingerprint(self, text: str, *, voice: Sequence[str] = (), language: str | None = None) -> str:
        """A hash of the rules that fire on `text` ("" when none do): a segment's cache key takes it, so
        changing a rule changes the key of exactly the segments holding its word."""
        return digest(self.matches(text, voice=voice, language=language))

    # ------------------------------------------------------------------------------------------------

    def _run(self, text: str, voice: tuple[str, ...], language: str | None) -> tuple[str, list[Rule]]:
        if not self.rules or not text:
            return text, []
        spoken, fired = self._matcher(voice, language).respell(text)
        fired = set(fired)
        return spoken, [r for r in dict.fromkeys(self.rules) if r in fired]  # in the rules' order

    def _matcher(self, voice: tuple[str, ...], language: str | None) -> Matcher:
        """The rules in scope, compiled once per scope (scopes with the same rules share one)."""
        key = (tuple(v.casefold() for v in voice if v), _language(language))
        found = self._cache.get(key)
        if found is None:
            in_scope = tuple(r for r in self.rules if r.applies(voice, language))
            found = self._cache.get(in_scope)
            if found is None:
                if len(self._cache) > 2 * MAX_SCOPES:  # a scope's key and its rules' key each
                    self._cache.clear()
                found = self._cache[in_scope] = Matcher(in_scope, self._cache.setdefault("patterns", {}))
            self._cache[key] = found
        return found


def _canonical(rules: Iterable[Rule]) -> str:
    return json.dumps([r.to_json() for r in rules], sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def digest(rules: Sequence[Rule]) -> str:
    """A stable hash of `rules` in their order (16 hex digits; "" for none): a dictionary's version, and the
    fingerprint of the rules that fired on a text."""
    return hashlib.sha256(_canonical(rules).encode()).hexdigest()[:16] if rules else ""


def merged(*dictionaries: Dictionary, sets: int = 1) -> Dictionary:
    """One dictionary of several, the later ones winning (the owner's global rules, then a project's), within
    the caps of `sets` dictionaries: 1 for one that is saved as one (the editor's import), the number of parts
    for one a take uses (each part was held to the caps when it was saved)."""
    return Dictionary((rule for d in dictionaries for rule in d.rules), sets=sets)


def changed(old: Dictionary, new: Dictionary, texts: Sequence[str], *, voice: Sequence[str] = (),
            language: str | None = None) -> list[int]:
    """The indices of `texts` (segments as they will be spoken before the dictionary, i.e. normalised) whose
    firing rules differ between `old` and `new`: the segments to mark stale when the rules change."""
    return [i for i, text in enumerate(texts)
            if old.fingerprint(text, voice=voice, language=language)
            != new.fingerprint(text, voice=voice, language=language)]


# ---------------------------------------------------------------------------------------------- files

def rules_json(dictionary: Dictionary) -> dict:
    return {"format": FORMAT, "version": dictionary.version, "rules": [r.to_json() for r in dictionary.rules]}


def to_tsv(dictionary: Dictionary) -> str:
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow(TSV_COLUMNS)
    for r in dictionary.rules:
        writer.writerow([r.word, r.respelling, "yes" if r.regex else "", "yes" if r.case_sensitive else "",
                         r.voice or "", r.language or ""])
    return out.getvalue()


def from_tsv(text: str) -> Dictionary:
    """Tab-separated `word, respelling[, regex, case_sensitive, voice, language]`, one rule a line; a header
    line of those names, blank lines and lines starting with `#` are skipped; yes/true/1 mean true."""
    rules = []
    for n, row in enumerate(csv.reader(io.StringIO(text), delimiter="\t"), 1):
        if not row or not "".join(row).strip() or row[0].startswith("#"):
            continue
        if n == 1 and [c.strip().lower() for c in row[:2]] == list(TSV_COLUMNS[:2]):
            continue
        if len(row) < 2 or len(row) > len(TSV_COLUMNS):
            raise PronunciationError(f"Line {n} of the TSV has {len(row)} columns; write word<TAB>respelling "
                                     f"(then optionally {', '.join(TSV_COLUMNS[2:])}).")
        row += [""] * (len(TSV_COLUMNS) - len(row))
        try:
            rules.append(Rule.make(row[0], row[1], regex=_yes(row[2]), case_sensitive=_yes(row[3]), voice=row[4],
                                   language=row[5]))
        except PronunciationError as exc:
            raise PronunciationError(f"Line {n} of the TSV: {exc}") from None
    return Dictionary(rules)


def _yes(value: str) -> bool:
    value = value.strip().lower()
    if value in ("", "no", "false", "0"):
        return False
    if value in ("yes", "true", "1", "x"):
        return True
    raise PronunciationError(f"{value!r} is neither yes nor no.")


def from_pls(data: bytes | str) -> tuple[Dictionary, list[str]]:
    """A W3C Pronunciation Lexicon's `<alias>` entries as rules (one per grapheme), and notes on what was
    skipped (`<phoneme>`-only lexemes: the model reads text, not IPA). Parsed with defusedxml: DTDs, entities
    and external references are refused."""
    try:
        root = ElementTree.fromstring(data, forbid_dtd=True)
    except (DefusedXmlException, ElementTree.ParseError) as exc:
        raise PronunciationError(f"The PLS file is not a lexicon this studio reads: {exc}.") from None
    if root.tag not in (f"{PLS_NS}lexicon", "lexicon"):
        raise PronunciationError("The file is XML but not a PLS lexicon (its root is not <lexicon>).")
    ns = PLS_NS if root.tag.startswith("{") else ""
    language = root.get(XML_LANG) or None
    rules, skipped = [], 0
    for lexeme in root.iter(f"{ns}lexeme"):
        alias = lexeme.find(f"{ns}alias")
        if alias is None or not (alias.text or "").strip():
            skipped += 1
            continue
        for grapheme in lexeme.iter(f"{ns}grapheme"):
            try:
                rules.append(Rule.make(grapheme.text, alias.text, language=language))
            except PronunciationError as exc:
                raise PronunciationError(f"Lexeme {grapheme.text!r}: {exc}") from None
    notes = [f"{skipped} lexemes without an <alias> were skipped (phonemes are not read)"] if skipped else []
    return Dictionary(rules), notes


def parse_file(name: str, data: bytes) -> tuple[Dictionary, list[str]]:
    """An uploaded dictionary by its name's suffix: .json, .tsv / .txt, .pls / .xml."""
    if len(data) > MAX_FILE_BYTES:
        raise PronunciationError(f"The dictionary file is {len(data) / 2 ** 20:.1f} MB; the limit is "
                                 f"{MAX_FILE_BYTES // 2 ** 20} MB.")
    suffix = Path(name).suffix.lower()
    if suffix in (".pls", ".xml"):
        return from_pls(data)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise PronunciationError("The dictionary file is not UTF-8 text.") from None
    if suffix == ".json":
        try:
            return Dictionary.from_json(json.loads(text)), []
        except json.JSONDecodeError as exc:
            raise PronunciationError(f"The dictionary file is not valid JSON ({exc}).") from None
    if suffix in (".tsv", ".txt"):
        return from_tsv(text), []
    raise PronunciationError("Upload the dictionary as .tsv, .json or .pls.")


class DictionaryStore:
    """The owner's global dictionary, one JSON file (`<studio folder>/dictionary.json`). Reads follow the file
    (another process may have written it); writes replace it whole, fsynced, under a file lock."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._current = Dictionary()

    @property
    def dictionary(self) -> Dictionary:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return Dictionary()
        with self._lock:
            if self._seen != (stat.st_mtime_ns, stat.st_size):
                try:
                    self._current = Dictionary.from_json(json.loads(self.path.read_text(encoding="utf-8")))
                except (OSError, ValueError) as exc:
                    raise PronunciationError(f"The dictionary file {self.path} is unreadable ({exc}); fix or "
                                             "remove it.") from None
                self._seen = (stat.st_mtime_ns, stat.st_size)
            return self._current

    def replace(self, dictionary: Dictionary) -> Dictionary:
        """Save `dictionary` as the whole global dictionary."""
        data = json.dumps(rules_json(dictionary), ensure_ascii=False, indent=1).encode()
        with self._locked():
            replace_file(self.path.parent, self.path.name, data)
            stat = self.path.stat()
            with self._lock:  # the file now reads as `dictionary`: keep it rather than parse it again
                self._current, self._seen = dictionary, (stat.st_mtime_ns, stat.st_size)
        return dictionary

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(self.path.with_name(self.path.name + ".lock")):
            yield


__all__ = [
    "MAX_RULES",
    "Dictionary",
    "DictionaryStore",
    "PronunciationError",
    "Rule",
    "changed",
    "from_pls",
    "from_tsv",
    "merged",
    "parse_file",
    "rules_json",
    "to_tsv",
]
