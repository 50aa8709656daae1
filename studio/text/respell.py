"""How pronunciation rules find their words (studio/text/pronounce.py holds the rules, their files and store): words
looked up in a table, regular expressions run by RE2 (linear in the text whatever the pattern), in one pass in
which every rule reads the text as written, never another rule's respelling.

    check_regex(rule)                        # Rule.make: PronunciationError naming a pattern RE2 cannot run
    matcher = Matcher(rules)                 # the rules in scope, in the dictionary's order, compiled once
    spoken, fired = matcher.respell(text)    # control tags left as they are; refused past the growth limit

Where matches overlap, the words and phrases come first (at each word start the longest that fits: "New York"
before "New"), then each regular expression in the dictionary's order; a match overlapping one already taken is
left as written. A word matches whole (no word character, Unicode's as in Python's `\\w`, touches either end)
and in any case, folded character by character as RE2 and Python's regular expressions fold it.

Regular expressions are RE2's syntax (https://github.com/google/re2/wiki/Syntax): no backreferences or
lookarounds, and `\\b`, `\\w`, `\\d`, `\\s` are ASCII (`\\pL` is any letter, `\\p{Nd}` any digit). A replacement
names groups as `\\1` or `\\g<name>`; `\\\\` is a backslash.
"""

from __future__ import annotations

import functools
import re
import time
import unicodedata
from bisect import bisect_right, insort
from collections.abc import Sequence

import re2

from engine.tokenizer import TAG_RE

MAX_REGEX_RULES = 200  # regular expressions in one dictionary: with RULE_MAX_MEM, at most 50 MiB of RE2 state
# (a project's take uses the owner's dictionary and the project's: 100 MiB)
# RE2's memory for one rule, its program and its match caches: a larger pattern is refused. 256 KiB holds ~14,000
# instructions (`\pL{12}` in any case), compiled in 10 ms, which RE2 does holding the GIL; 200 rules of 4,000
# instructions compile in 0.7 s and run over 4,096 characters in 0.2 s (measured on 2 shared cores).
RULE_MAX_MEM = 256 * 1024
MAX_GROWTH_FACTOR = 4  # the spoken text is at most 4× the text as written ...
MAX_GROWTH_CHARS = 10_000  # ... or 10,000 characters more, whichever is larger (a short line, a long respelling)
CHAR_CACHE = 65_536  # characters whose word class and case fold are kept (the texts' alphabets; bounded all the same)

# A word character, as the `regex` module's Unicode `\w` has it (letters, marks, decimal digits, letter numbers,
# connectors, joiners, circled letters; the two differ only on code points this Python's Unicode leaves
# unassigned): a word rule needs a character outside these, or the text's edge, on either side.
_WORD_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "Pc"})
_WORD_RANGES = (("\u200c", "\u200d"), ("\u24b6", "\u24e9"), ("\U0001f130", "\U0001f149"), ("\U0001f150", "\U0001f169"),
                ("\U0001f170", "\U0001f189"))
_TEMPLATE_REF = re.compile(r"\\(?:(\d{1,2})|g<(\w+)>|(\\))")  # \1, \g<name> or \g<1>, \\ in a replacement
_ANY_BYTE = re.compile(r"(?<!\\)(?:\\\\)*\\C")  # RE2's \C matches one byte, which can split a character


class PronunciationError(ValueError):
    """A rule or a dictionary file that cannot be used, with a sentence saying what to change."""


def _options(case_sensitive: bool) -> re2.Options:
    options = re2.Options()
    options.case_sensitive = case_sensitive
    options.max_mem = RULE_MAX_MEM
    options.log_errors = False  # a refused pattern is answered with a sentence, not logged to stderr
    return options


# RE2 compiles holding the GIL (2-3 ms for a 4,000-instruction pattern), which every other thread, the event loop
# included, waits out: a dictionary's patterns, checked when it is sent, read back from its file and applied,
# compile once (at most 2 × MAX_REGEX_RULES × RULE_MAX_MEM kept), and the GIL is offered to the others after each.
@functools.lru_cache(maxsize=2 * MAX_REGEX_RULES)  # a project's take: the owner's patterns and the project's
def _compiled(pattern: str, case_sensitive: bool):
    try:
        return re2.compile(pattern, _options(case_sensitive))
    finally:
        time.sleep(0)  # 200 compiles in a row held /health 0.3 s on 2 busy cores; with this, under 0.1 s


def compile_pattern(pattern: str, case_sensitive: bool):
    """A regex rule's pattern as RE2 runs it, or PronunciationError with a sentence naming it."""
    where = f"The pattern /{pattern}/"
    if _ANY_BYTE.search(pattern):
        raise PronunciationError(f"{where} uses \\C (any byte), which can split a character; use . instead.")
    try:
        return _compiled(pattern, case_sensitive)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else ""
    if "too large" in reason:
        raise PronunciationError(f"{where} is too large: compiled, it needs more than the {RULE_MAX_MEM // 1024} KiB "
                                 "a rule may take. Repeat less (a class such as \\pL costs ~1,200 steps each time).")
    unsupported = _unsupported(reason, pattern)
    if unsupported:
        raise PronunciationError(f"{where} uses {unsupported[0]}, which RE2 (the linear-time engine rules run on) "
                                 f"does not support; {unsupported[1]}.")
    raise PronunciationError(f"{where} is not a valid regular expression in RE2's syntax ({reason}).")


def _unsupported(reason: str, pattern: str) -> tuple[str, str] | None:
    """What a pattern RE2 refused uses that RE2 leaves out by design, from RE2's message; and what to do instead."""
    if reason.startswith(("invalid perl operator: (?<=", "invalid perl operator: (?<!")):
        return "a lookbehind ((?<=…) or (?<!…))", "match the text before it too and put it back with a group (\\1)"
    if reason.startswith(("invalid perl operator: (?=", "invalid perl operator: (?!")):
        return "a lookahead ((?=…) or (?!…))", "match the text after it too and put it back with a group (\\1)"
    escape = reason.removeprefix("invalid escape sequence: \\")
    if (escape != reason and escape[:1] in tuple("123456789gk")) or (reason.endswith("(?P") and "(?P=" in pattern):
        return "a backreference (like \\1 or (?P=name))", "write the repeated text out"
    return None


def template(respelling: str, compiled) -> tuple:
    """A regex rule's replacement as pieces: text, or the number of the group whose match goes there."""
    pieces, cursor = [], 0
    for ref in _TEMPLATE_REF.finditer(respelling):
        pieces.append(respelling[cursor:ref.start()])
        number, name, backslash = ref.groups()
        if backslash:
            pieces.append("\\")
        else:
            group = int(number or name) if (number or name.isdigit()) else compiled.groupindex.get(name, -1)
            if not 0 <= group <= compiled.groups:
                raise PronunciationError(f"The respelling {respelling!r} names a group that /{compiled.pattern}/ "
                                         "does not have.")
            pieces.append(group)
        cursor = ref.end()
    pieces.append(respelling[cursor:])
    return tuple(p for p in pieces if p != "")


def check_regex(rule) -> None:
    """Rule.make's check of a regex rule: RE2 runs it, its replacement's groups exist, it never matches nothing."""
    compiled = compile_pattern(rule.word, rule.case_sensitive)
    template(rule.respelling, compiled)
    if compiled.search("") is not None:
        raise PronunciationError(f"The pattern /{rule.word}/ matches empty text, so it would apply everywhere; "
                                 "make it match a word.")


def _name(rule) -> str:
    return f"/{rule.word}/" if rule.regex else repr(rule.word)


@functools.lru_cache(maxsize=CHAR_CACHE)
def _is_word(char: str) -> bool:
    return unicodedata.category(char) in _WORD_CATEGORIES or any(a <= char <= b for a, b in _WORD_RANGES)


class _Fold(dict):
    """A `str.translate` table that folds case one character to one (RE2's and `regex`'s simple folding: "ẞ" is
    "ß", not "ss"), so a folded text keeps its offsets. Filled as characters are met."""

    def __missing__(self, code: int) -> int:
        char = chr(code)
        folded = next((f for f in (char.casefold(), char.lower()) if len(f) == 1), char)
        if len(self) < CHAR_CACHE:
            self[code] = ord(folded)
        return ord(folded)


_FOLD = _Fold()


def fold(text: str) -> str:
    """`text` with its case folded, character by character: how word rules compare text in any case."""
    return text.translate(_FOLD)


class Matcher:
    """The rules in scope for one voice and language, compiled once: the words and phrases as a table by their
    folded text (and the lengths to try at a word start), and the regular expressions in the dictionary's order."""

    def __init__(self, rules: Sequence, patterns: dict | None = None):
        """`rules` in the dictionary's order; `patterns` (rule → compiled) shares compiled regex rules between
        the scopes of one dictionary."""
        patterns = {} if patterns is None else patterns
        self.lookup: dict[tuple[bool, str], object] = {}
        # Later rules win over earlier ones, a scoped rule over an unscoped one (a stable sort keeps the order).
        for rule in sorted((r for r in rules if not r.regex), key=lambda r: r.scoped):
            self.lookup[(rule.case_sensitive, rule.word if rule.case_sensitive else fold(rule.word))] = rule
        self.folded = {fold(word) for _, word in self.lookup}  # what a word start is tried against
        self.firsts = {word[0] for word in self.folded}
        self.lengths = sorted({len(word) for word in self.folded}, reverse=True)
        self.patterns = []
        for rule in (r for r in rules if r.regex):
            if rule not in patterns:
                compiled = compile_pattern(rule.word, rule.case_sensitive)
                patterns[rule] = (compiled, template(rule.respelling, compiled))
            self.patterns.append((rule, *patterns[rule]))

    def respell(self, text: str) -> tuple[str, list]:
        """(`text` as it will be spoken, the rules that fired, in no set order). PronunciationError when the
        spoken text would outgrow the limit, naming the rule that adds most."""
        added: dict[object, int] = {}
        pieces, cursor = [], 0
        for tag in [*TAG_RE.finditer(text), None]:
            end = tag.start() if tag is not None else len(text)
            if end > cursor:
                pieces.append(self._piece(text[cursor:end], added))
            if tag is not None:
                pieces.append(tag.group())
                cursor = tag.end()
        spoken = "".join(pieces)
        limit = max(MAX_GROWTH_FACTOR * len(text), len(text) + MAX_GROWTH_CHARS)
        if len(spoken) > limit:
            worst = max(added, key=added.get)
            raise PronunciationError(
                f"The pronunciation rules would make this text {len(spoken):,} characters long from {len(text):,}; "
                f"the limit is {MAX_GROWTH_FACTOR}× the text or {MAX_GROWTH_CHARS:,} characters more, whichever is "
                f"larger. Most of it comes from the rule {_name(worst)}: shorten its respelling or narrow it.")
        return spoken, list(added)

    def _words(self, piece: str):
        """(start, end, rule) of each word rule's match in `piece`, left to right: at each word start the longest
        word that ends where a word ends. A case-sensitive word met in another case matches with rule None: it is
        left as written, and no shorter word is tried there."""
        folded, n = fold(piece), len(piece)
        edge = [i == 0 or not _is_word(piece[i - 1]) for i in range(n + 1)]  # no word character just before i
        start = 0
        while start < n:
            end = None
            if edge[start] and folded[start] in self.firsts:
                end = next((start + length for length in self.lengths if start + length <= n
                            and (start + length == n or edge[start + length + 1])
                            and folded[start:start + length] in self.folded), None)
            if end is None:
                start += 1
                continue
            yield start, end, self.lookup.get((True, piece[start:end])) or self.lookup.get((False, folded[start:end]))
            start = end

    def _piece(self, piece: str, added: dict) -> str:
        """One stretch of text between control tags, respelled."""
        starts: list[int] = []
        taken: dict[int, tuple[int, str]] = {}  # start → (end, respelling)

        def take(start: int, end: int, respelling: str, rule) -> None:
            at = bisect_right(starts, start)
            if (at and taken[starts[at - 1]][0] > start) or (at < len(starts) and starts[at] < end):
                return  # overlaps a match already taken
            insort(starts, start)
            taken[start] = (end, respelling)
            added[rule] = added.get(rule, 0) + len(respelling) - (end - start)

        for start, end, rule in self._words(piece):
            if rule is not None:
                take(start, end, rule.respelling, rule)
        for rule, pattern, pieces in self.patterns:
            for match in pattern.finditer(piece):
                if match.end() > match.start():
                    take(*match.span(), _expand(pieces, match), rule)
        out, cursor = [], 0
        for start in starts:
            end, respelling = taken[start]
            out += (piece[cursor:start], respelling)
            cursor = end
        out.append(piece[cursor:])
        return "".join(out)


def _expand(pieces: tuple, match) -> str:
    return "".join(p if isinstance(p, str) else match.group(p) or "" for p in pieces)


__all__ = ["MAX_GROWTH_CHARS", "MAX_GROWTH_FACTOR", "MAX_REGEX_RULES", "Matcher", "PronunciationError",
           "check_regex", "compile_pattern", "fold", "template"]
