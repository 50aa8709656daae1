"""A small SSML subset → the studio's own text: pause markers and control tags (no model, no I/O).

Higgs reads plain text with inline control tags (SPEC D2), so SSML is translated, not interpreted:

* `<speak>` is the root; `<p>` becomes a paragraph break (the long form gives it a paragraph's pause);
* `<break time="1.5s"/>` (or `500ms`, or `strength="strong"`) becomes a `[pause 1.5s]` marker, which the
  long-form planner turns into exactly that much silence (engine/longform.py);
* `<sub alias="…">…</sub>` speaks the alias;
* `<prosody rate="…">` puts the nearest speed tag before its text (the tags are sentence-level: the rate
  holds to the end of that sentence, and the next sentence is at normal speed);
* `<emphasis>` keeps its text with no tag: the model has no word-level stress, and the expressive tags
  would change the whole sentence;
* every other element (`<s>`, `<phoneme>`, `<say-as>`, `<audio>`, `<voice>` …) is dropped and its text
  kept, and the warning names what was dropped.

SSML is known by its root: `<speak>` after any XML prolog (a declaration, comments, processing
instructions). A DOCTYPE is refused before anything is parsed, and the parser is defusedxml's, which
refuses one anywhere else (so every entity declaration: billion laughs, external entities); the input is
refused above MAX_SSML_CHARS and MAX_ELEMENTS, and nesting above MAX_DEPTH, before anything is translated,
so time and memory stay bounded by the size limit.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from xml.etree.ElementTree import Element, ParseError

import defusedxml
import defusedxml.ElementTree as SafeET

from .longform import MAX_PAUSE_SECONDS

MAX_SSML_CHARS = 100_000  # the long form's input limit (studio/takes/limits.py MAX_INPUT_CHARS)
MAX_DEPTH = 16  # <speak><p><s><prosody><emphasis>… real documents nest 4–5 deep
MAX_ELEMENTS = 10_000  # one per ~10 characters of the limit: a break after every word of a chapter
MAX_BREAK_SECONDS = MAX_PAUSE_SECONDS  # the cap SSML services put on one <break>: one [pause] marker's

# SSML's named break strengths (W3C SSML 1.1 §3.2.3 leaves the durations to the processor).
BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.2, "medium": 0.4, "strong": 0.75, "x-strong": 1.25}
# SSML's named rates as factors of the normal rate; "N%" (of normal) and "+N%"/"-N%" are read as well.
RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.35, "x-fast": 2.0}
SPEED_TAGS = ("<|prosody:speed_very_slow|>", "<|prosody:speed_slow|>", "<|prosody:speed_fast|>",
              "<|prosody:speed_very_fast|>")

_ROOT_RE = re.compile(r"<(?:[\w.-]+:)?speak[\s>/]")  # the root element, with or without a namespace prefix
_SPACE_RE = re.compile(r"[\ufeff \t\r\n]*")
_PROLOG_ITEMS = (("<?", "?>"), ("<!--", "-->"))  # what may come before the root: (opens, closes)
_DOCTYPE_RE = re.compile(r"<!DOCTYPE", re.IGNORECASE)
_DTD_REFUSED = ("SSML may not contain a DOCTYPE (a DTD or entities): its declarations can expand without bound "
                "or read files on this server. Remove the <!DOCTYPE …> and write plain characters instead of "
                "entities.")
_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|ms)\s*$", re.IGNORECASE)
_RATE_RE = re.compile(r"^\s*([+-]?)(\d+(?:\.\d+)?)\s*(%?)\s*$")


@dataclass(frozen=True)
class SsmlText:
    """What SSML became: the text to plan or speak, and the notes for the user."""

    text: str
    warnings: list[str] = field(default_factory=list)


def is_ssml(text: str) -> bool:
    """Whether `text` is SSML by its look: its first element is `<speak>`, after any XML prolog. A prolog
    that declares a DOCTYPE counts too, whatever follows it: only an XML document has one, and reading it
    as SSML is what refuses it."""
    if not isinstance(text, str):
        return False
    at, doctype = _after_prolog(text)
    return doctype or _ROOT_RE.match(text, at) is not None


def _after_prolog(text: str) -> tuple[int, bool]:
    """Where `text`'s first element may start once its XML prolog (a byte-order mark, the declaration,
    comments, processing instructions, whitespace) is skipped, and whether a DOCTYPE stands there. Linear in
    the prolog's length: each item's end is found with one `find`."""
    at = _SPACE_RE.match(text).end()
    while (item := next(((o, c) for o, c in _PROLOG_ITEMS if text.startswith(o, at)), None)) is not None:
        opens, closes = item
        end = text.find(closes, at + len(opens))
        if end < 0:
            return at, False
        at = _SPACE_RE.match(text, end + len(closes)).end()
    return at, _DOCTYPE_RE.match(text, at) is not None


def read_text(text: str, ssml: bool | None = None) -> SsmlText:
    """The text a take speaks. `ssml` None decides by `is_ssml`; True reads `text` as SSML (wrapped in
    `<speak>` when it has no root of its own); False leaves it as it is."""
    if ssml is False or (ssml is None and not is_ssml(text)):
        return SsmlText(text)
    return from_ssml(text if is_ssml(text) else f"<speak>{text}</speak>")


def rate_tag(factor: float) -> str:
    """A speaking-rate factor → the speed tag nearest to it ('' for about normal speed). The one mapping of
    the API's `speed` and SSML's `<prosody rate>`."""
    if factor <= 0.6:
        return SPEED_TAGS[0]
    if factor < 0.9:
        return SPEED_TAGS[1]
    if factor >= 1.6:
        return SPEED_TAGS[3]
    if factor > 1.15:
        return SPEED_TAGS[2]
    return ""


def pause_marker(seconds: float) -> str:
    """The plain-text pause the planner reads (engine/longform.py PAUSE_RE)."""
    return f" [pause {f'{seconds:.6f}'.rstrip('0').rstrip('.')}s] "  # never 1e-05: PAUSE_RE reads plain decimals


def from_ssml(ssml: str) -> SsmlText:
    """Translate SSML (a `<speak>` document); ValueError with a sentence when it is too large, too deep,
    not well-formed, or declares a DTD or entities."""
    if len(ssml) > MAX_SSML_CHARS:
        raise ValueError(f"the SSML is {len(ssml)} characters; the limit is {MAX_SSML_CHARS}. Split it.")
    if _DOCTYPE_RE.search(ssml) is not None:  # in text a "<" is written &lt;, so this is always markup
        raise ValueError(_DTD_REFUSED)
    try:
        root = SafeET.fromstring(ssml, forbid_dtd=True)
    except defusedxml.DefusedXmlException:
        raise ValueError(_DTD_REFUSED) from None
    except ParseError as exc:
        raise ValueError(f"the SSML is not well-formed XML ({exc}); check that every tag is closed and that "
                         "& and < in the text are written &amp; and &lt;.") from None
    _check_shape(root)
    if _local(root.tag) != "speak":
        raise ValueError(f"the SSML's root element is <{_local(root.tag)}>; wrap the text in <speak>…</speak>.")
    out: list[str] = []
    dropped: Counter = Counter()
    warnings: list[str] = []
    _render(root, out, dropped, warnings)
    text = "\n\n".join(" ".join(p.split()) for p in "".join(out).split("\n\n"))
    text = "\n\n".join(p for p in text.split("\n\n") if p)
    if dropped:
        warnings.append("SSML elements not supported were dropped (their text kept): "
                        + ", ".join(f"<{name}>" + (f" ×{n}" if n > 1 else "") for name, n in sorted(dropped.items())))
    return SsmlText(text, warnings)


def _check_shape(root: Element) -> None:
    """Depth and element count, walked without recursion (a deep document must not reach Python's stack)."""
    count, stack = 0, [(root, 1)]
    while stack:
        elem, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise ValueError(f"the SSML nests elements more than {MAX_DEPTH} deep; flatten it.")
        if count > MAX_ELEMENTS:
            raise ValueError(f"the SSML has more than {MAX_ELEMENTS} elements; split it.")
        stack.extend((child, depth + 1) for child in elem)


def _local(tag) -> str:
    """An element's name without its namespace (`{http://www.w3.org/2001/10/synthesis}break` → `break`)."""
    return str(tag).rsplit("}", 1)[-1]


def _render(elem: Element, out: list[str], dropped: Counter, warnings: list[str]) -> None:
    """Append `elem`'s translation (its children, then nothing of its tail: the parent adds tails)."""
    name = _local(elem.tag)
    if name == "break":
        out.append(pause_marker(_break_seconds(elem, warnings)))
        return
    if name == "sub":
        alias = elem.get("alias")
        if alias is not None:
            out.append(f" {alias} ")
            return
        warnings.append("an SSML <sub> without alias=\"…\" was read as its text")
    if name == "p":
        out.append("\n\n")
    elif name == "prosody":
        out.append(_prosody_tag(elem, warnings))
    elif name not in ("speak", "emphasis", "sub"):
        dropped[name] += 1
    out.append(elem.text or "")
    for child in elem:
        _render(child, out, dropped, warnings)
        out.append(child.tail or "")
    if name == "p":
        out.append("\n\n")


def _break_seconds(elem: Element, warnings: list[str]) -> float:
    time, strength = elem.get("time"), elem.get("strength")
    if time is not None:
        match = _TIME_RE.match(time)
        if match is None:
            warnings.append(f"<break time={time!r}> is not a time such as \"1.5s\" or \"500ms\"; a medium "
                            "break was used")
            return BREAK_STRENGTHS["medium"]
        seconds = float(match.group(1)) / (1000 if match.group(2).lower() == "ms" else 1)
        if seconds > MAX_BREAK_SECONDS:
            warnings.append(f"<break time={time!r}> is longer than {MAX_BREAK_SECONDS:g} s; "
                            f"{MAX_BREAK_SECONDS:g} s was used")
            seconds = MAX_BREAK_SECONDS
        return seconds
    if strength is not None and strength not in BREAK_STRENGTHS:
        warnings.append(f"<break strength={strength!r}> is none of {', '.join(BREAK_STRENGTHS)}; medium was used")
    return BREAK_STRENGTHS.get(strength or "medium", BREAK_STRENGTHS["medium"])


def _prosody_tag(elem: Element, warnings: list[str]) -> str:
    others = sorted(set(elem.keys()) - {"rate"})
    if others:
        warnings.append(f"<prosody {' '.join(others)}> is not supported (only rate); it was ignored")
    rate = elem.get("rate")
    if rate is None:
        return ""
    factor = RATES.get(rate.strip().lower())
    if factor is None and (match := _RATE_RE.match(rate)) is not None:
        sign, number, percent = match.groups()
        value = float(number) / (100 if percent else 1)
        factor = 1 + value if sign == "+" else 1 - value if sign == "-" else value
    if factor is None or factor <= 0:
        warnings.append(f"<prosody rate={rate!r}> is not a rate such as \"slow\", \"80%\" or \"+20%\"; ignored")
        return ""
    tag = rate_tag(factor)
    return f" {tag}" if tag else ""


__all__ = [
    "BREAK_STRENGTHS",
    "MAX_BREAK_SECONDS",
    "MAX_DEPTH",
    "MAX_ELEMENTS",
    "MAX_SSML_CHARS",
    "RATES",
    "SPEED_TAGS",
    "SsmlText",
    "from_ssml",
    "is_ssml",
    "pause_marker",
    "rate_tag",
    "read_text",
]
