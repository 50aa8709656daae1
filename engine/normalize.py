"""Text normalisation for speech: numbers, dates, times, currency, units and common abbreviations become
the words a reader would say ("$3.50" → "three dollars and fifty cents"), so the model never has to guess
how to read "10:30" or "70 °F" (PRODUCT §4 item 14; Higgs' own examples tell users to do this by hand).

English only, through `num2words`; text in any other language is returned unchanged, since reading rules
(decimal commas, date order, unit names) differ per language and a wrong reading is worse than none. With
language "auto" (the planner's default) a text is normalised when it reads as English (`looks_english`).
Control tags (`<|…|>`) are never touched. Pure functions, no model.
"""

from __future__ import annotations

import re
from datetime import date

from num2words import num2words

from .tokenizer import TAG_RE

ENGLISH = ("en", "english")
AUTO = "auto"
# The most frequent function words of English and of the languages most often pasted beside it (French,
# German, Spanish, Italian, Portuguese), none of them an English word. English function words make up
# ~40% of running English text; a text reads as English when they are at least ENGLISH_SHARE of its words
# and outnumber the others. No model, no dictionary: it only decides whether to normalise.
_ENGLISH_WORDS = frozenset(("the and of to a in is it that was for on with as he she you i at be this have "
                            "from or by not are but we they his her had were will would there their what so "
                            "if my me your an do all one can").split())
_OTHER_WORDS = frozenset(("le la les et est un une des du de que qui dans pour pas sur au avec il elle nous vous "
                          "ils ce ne se der das und ist nicht ein eine zu den mit sich auf für im dem ich el los "
                          "las y por con para lo del al di che per non è os da em uma não é à où très").split())
ENGLISH_SHARE = 0.1
_WORD_RE = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?")

_ABBREVIATIONS = {  # only ones whose reading does not depend on context ("St." is Saint or Street: left alone)
    "Dr.": "Doctor", "Mr.": "Mister", "Mrs.": "Missus", "Ms.": "Miz", "Prof.": "Professor", "Jr.": "Junior",
    "Sr.": "Senior", "vs.": "versus", "etc.": "et cetera", "e.g.": "for example", "i.e.": "that is",
    "approx.": "approximately", "a.m.": "A M", "p.m.": "P M",
}
_CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
               "£": ("pound", "pounds", "penny", "pence")}
# unit → (singular, plural); only symbols that cannot be read another way after a number ("m" could be
# metres, minutes or million, "in" a preposition: left alone).
_UNITS = {
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"), "°C": ("degree Celsius", "degrees Celsius"),
    "°": ("degree", "degrees"), "%": ("percent", "percent"),
    "km/h": ("kilometer per hour", "kilometers per hour"), "mph": ("mile per hour", "miles per hour"),
    "km": ("kilometer", "kilometers"), "cm": ("centimeter", "centimeters"), "mm": ("millimeter", "millimeters"),
    "kg": ("kilogram", "kilograms"), "mg": ("milligram", "milligrams"), "lbs": ("pound", "pounds"),
    "lb": ("pound", "pounds"), "oz": ("ounce", "ounces"), "ft": ("foot", "feet"), "mi": ("mile", "miles"),
    "ml": ("milliliter", "milliliters"), "mL": ("milliliter", "milliliters"), "ms": ("millisecond", "milliseconds"),
    "kHz": ("kilohertz", "kilohertz"), "MHz": ("megahertz", "megahertz"), "GHz": ("gigahertz", "gigahertz"),
    "Hz": ("hertz", "hertz"), "KB": ("kilobyte", "kilobytes"), "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"), "TB": ("terabyte", "terabytes"),
}
_MONTHS = ("January February March April May June July August September October November December").split()

_NUMBER = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)"
_ABBREV_RE = re.compile(r"(?<![\w.])(" + "|".join(re.escape(a) for a in _ABBREVIATIONS) + r")(?!\w)")
_CURRENCY_RE = re.compile(r"([$€£])\s?(" + _NUMBER + r")(\s+(?:thousand|million|billion|trillion)\b)?")
_ISO_DATE_RE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_TIME_RE = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)\b")
_UNIT_RE = re.compile(r"(?<![\w.,])(-?" + _NUMBER + r")\s?(" + "|".join(
    re.escape(u) for u in sorted(_UNITS, key=len, reverse=True)) + r")(?![\w/])")
_ORDINAL_RE = re.compile(r"\b(\d+)(st|nd|rd|th)\b")
_NUMBER_RE = re.compile(r"(?<![\w.,])(-?)(" + _NUMBER + r")(?![\w])")


def looks_english(text: str) -> bool:
    """Whether `text` reads as English: at least ENGLISH_SHARE of its words are common English function
    words, and more of them than of other languages' function words. No words at all counts as English."""
    words = _WORD_RE.findall(TAG_RE.sub(" ", text).lower())
    if not words:
        return True
    english = sum(w in _ENGLISH_WORDS for w in words)
    return english >= ENGLISH_SHARE * len(words) and english > sum(w in _OTHER_WORDS for w in words)


def normalize_text(text: str, language: str = "en") -> str:
    """`text` with numbers, dates, times, currency, units and common abbreviations written out as words,
    when `language` is English ("auto": when the text looks English); any other language is returned
    unchanged. Tags are left as they are."""
    language = language.lower()
    if language not in ENGLISH and not (language == AUTO and looks_english(text)):
        return text
    parts, cursor = [], 0
    for match in TAG_RE.finditer(text):
        parts.append(_english(text[cursor:match.start()]))
        parts.append(match.group())
        cursor = match.end()
    parts.append(_english(text[cursor:]))
    return "".join(parts)


def _english(text: str) -> str:
    # An abbreviation that ends the sentence takes its full stop with it: give the sentence one back.
    text = _ABBREV_RE.sub(lambda m: _ABBREVIATIONS[m.group(1)] + ("." if not m.string[m.end():].strip() else ""),
                          text)
    text = _ISO_DATE_RE.sub(_iso_date, text)
    text = _CURRENCY_RE.sub(_currency, text)
    text = _TIME_RE.sub(_time, text)
    text = _UNIT_RE.sub(_unit, text)
    text = _ORDINAL_RE.sub(lambda m: num2words(int(m.group(1)), to="ordinal"), text)
    return _NUMBER_RE.sub(_number, text)


def _words(value: str) -> str:
    """A number as words, without the commas num2words puts between groups (a comma is a spoken pause)."""
    value = value.replace(",", "")
    if "." in value:
        whole, frac = value.split(".")
        return f"{_words(whole)} point {' '.join(num2words(int(d)) for d in frac)}"
    return num2words(int(value)).replace(",", "")


def _number(m: re.Match) -> str:
    sign, value = m.group(1), m.group(2)
    plain = value.replace(",", "")
    if not sign and "," not in value and "." not in value and len(plain) == 4 and 1100 <= int(plain) <= 2099:
        return num2words(int(plain), to="year")  # "1999" is read as a year: "nineteen ninety-nine"
    return ("minus " if sign else "") + _words(value)


def _iso_date(m: re.Match) -> str:
    try:
        day = date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        return m.group()  # not a calendar date (a code like 2026-13-45): leave it
    return f"{_MONTHS[day.month - 1]} {num2words(day.day, to='ordinal')}, {num2words(day.year, to='year')}"


def _currency(m: re.Match) -> str:
    one, many, cent, cents = _CURRENCIES[m.group(1)]
    value, scale = m.group(2).replace(",", ""), m.group(3)
    if scale:  # "$3.5 million" → "three point five million dollars"
        return f"{_words(value)} {scale.strip()} {many}"
    whole, _, frac = value.partition(".")
    units = int(whole)
    hundredths = int((frac + "00")[:2]) if frac else 0
    spoken = []
    if units or not hundredths:
        spoken.append(f"{_words(whole)} {one if units == 1 else many}")
    if hundredths:
        spoken.append(f"{num2words(hundredths)} {cent if hundredths == 1 else cents}")
    return " and ".join(spoken)


def _time(m: re.Match) -> str:
    hours, minutes = int(m.group(1)), int(m.group(2))
    if minutes == 0:
        return f"{num2words(hours)} o'clock" if hours else "midnight"
    tail = num2words(minutes) if minutes >= 10 else f"oh {num2words(minutes)}"
    return f"{num2words(hours)} {tail}"


def _unit(m: re.Match) -> str:
    value, unit = m.group(1), m.group(2)
    one, many = _UNITS[unit]
    spoken = ("minus " + _words(value[1:])) if value.startswith("-") else _words(value)
    return f"{spoken} {one if value.replace(',', '') in ('1', '1.0') else many}"


__all__ = ["normalize_text", "looks_english", "ENGLISH", "AUTO"]
