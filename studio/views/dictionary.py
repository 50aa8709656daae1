"""The pronunciation dictionary's editor, a small accordion under the Studio tab: the owner's rules as an editable
table, import (TSV, JSON, PLS) and export (TSV), and a sentence tried "as it will be spoken". Thin over
studio/text/pronounce.py and the service's store; only the owner sees, changes or tries rules of their own (a visitor
tries a sentence with the saved rules at most: rules of one's own cost the server what they like).
"""

from __future__ import annotations

from pathlib import Path

import gradio as gr

from engine.normalize import AUTO, normalize_text
from studio.text.pronounce import TSV_COLUMNS, Dictionary, Rule, merged, parse_file, to_tsv
from studio.views.toasts import warns

OWNER_ONLY_TRIAL = ("Only the studio's owner can try rules of their own here. Log in with the studio's key, or use "
                    "POST /v1/dictionary/apply with `Authorization: Bearer <key>`.")
HELP = ("Respelling rules for words the voice gets wrong (`Nguyen` → `Win`), applied to every take after numbers "
        "and dates are written out. A word matches whole and in any case, unless *case_sensitive*; with *regex* "
        "it is a regular expression in RE2's syntax, without lookarounds or backreferences (`\\1` in the respelling "
        "names a group). *voice* and *language* (a code such as `en`) limit a rule to one voice or language.")


# Gradio's Dataframe (6.x) turns a key typed on a selected cell into edit mode but drops that key, and the editor
# then starts from the cell's old text, so typing "Nguyen" on a filled cell gave "oldguyen". A plain
# gr.Dataframe does the same; nothing in this table's settings causes it. Until Gradio fixes it, the first key
# is caught before the table sees it, edit mode is opened as a double click opens it, and the key replaces the
# text, as in a spreadsheet. Enter, F2 and a double click still edit the text as it is.
TYPE_TO_REPLACE = """
let pending = null;  // {cell, typed, enter}: the keys typed while the cell's editor opens
const OPEN_WITHIN_MS = 5000;  // a busy machine takes seconds to open the editor: the keys wait for it
// The cell last clicked, for a moment: the table can hand the focus back to the cell it has just saved after
// the click (an edit ended with Enter, then a quick click on the next cell), and the keys are for the cell
// clicked. A key that moves (an arrow, Tab) ends that moment.
const CLICKED_FOR_MS = 1000;
let clicked = null;  // {row, col, at}
const GRID = '#dictionary-rules [role=gridcell]';
document.addEventListener('pointerdown', (event) => {
  const cell = event.target.closest && event.target.closest(GRID);
  clicked = cell ? {row: cell.dataset.row, col: cell.dataset.col, at: performance.now()} : null;
}, true);
const cellAt = (row, col) => document.querySelector(`${GRID}[data-row="${row}"][data-col="${col}"]`);
function target(event) {
  const focused = event.target.closest && event.target.closest(GRID);
  if (event.key.length !== 1) { clicked = null; return focused; }
  if (!focused || !clicked || performance.now() - clicked.at > CLICKED_FOR_MS) return focused;
  return cellAt(clicked.row, clicked.col) || focused;
}
document.addEventListener('keydown', (event) => {
  const cell = target(event);
  if (!cell) return;
  const held = pending !== null;  // the editor of pending.cell is opening: every key in the table is for it
  if (held && event.key === 'Enter') {  // typed fast: Enter ends the edit once the keys are in the editor
    event.preventDefault();
    event.stopImmediatePropagation();
    pending.enter = true;
    return;
  }
  if (event.key.length !== 1 || event.ctrlKey || event.metaKey || event.altKey) return;
  if (!held && (event.target.tagName === 'TEXTAREA' || cell.querySelector('input[type=checkbox]'))) return;
  event.preventDefault();
  event.stopImmediatePropagation();
  if (held) { pending.typed += event.key; return; }
  pending = {cell, typed: event.key, enter: false};
  cell.dispatchEvent(new MouseEvent('dblclick', {bubbles: true}));
  const deadline = performance.now() + OPEN_WITHIN_MS;
  let seen = 0;
  const {row, col} = cell.dataset;
  const fill = () => {  // the cell again each frame: the table may draw its row anew while the editor opens
    const now = cell.isConnected ? cell : cellAt(row, col);
    const box = now && now.querySelector('textarea:not([readonly])');
    seen = box && document.activeElement === box ? seen + 1 : 0;
    if (seen < 3) {  // the editor is open, focused and settled for a few frames before it takes the keys
      if (performance.now() < deadline) requestAnimationFrame(fill); else pending = null;
      return;
    }
    const {typed, enter} = pending;
    pending = null;
    box.value = typed;
    box.setSelectionRange(box.value.length, box.value.length);
    box.dispatchEvent(new Event('input', {bubbles: true}));
    if (enter) box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', code: 'Enter', bubbles: true}));
  };
  requestAnimationFrame(fill);
}, true);
"""


def rows_of(dictionary: Dictionary) -> list[list]:
    return [[r.word, r.respelling, r.regex, r.case_sensitive, r.voice or "", r.language or ""]
            for r in dictionary.rules]


def dictionary_of(rows) -> Dictionary:
    """The table's rows → a checked dictionary; rows without a word are skipped."""
    rules = []
    for n, row in enumerate(rows or [], 1):
        row = list(row) + [""] * (len(TSV_COLUMNS) - len(row))
        if not str(row[0] or "").strip():
            continue
        try:
            rules.append(Rule.make(row[0], row[1], regex=_flag(row[2]), case_sensitive=_flag(row[3]),
                                   voice=row[4] or None, language=row[5] or None))
        except ValueError as exc:
            raise ValueError(f"Row {n}: {exc}") from None
    return Dictionary(rules)


def _flag(value) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "1", "x")


class DictionaryView:
    """Builds the accordion and handles its events."""

    def __init__(self, service, access, out_dir: Path):
        self.service, self.access, self.out_dir = service, access, Path(out_dir)

    def build(self) -> None:
        with gr.Accordion("Pronunciation dictionary", open=False, elem_id="dictionary"):
            gr.Markdown(HELP)
            self.table = gr.Dataframe(headers=list(TSV_COLUMNS), datatype=["str", "str", "bool", "bool", "str", "str"],
                                      type="array", interactive=True, column_count=len(TSV_COLUMNS), row_count=3,
                                      label="Rules", elem_id="dictionary-rules")
            with gr.Row():
                save = gr.Button("Save rules", variant="primary", elem_id="dictionary-save")
                upload = gr.UploadButton("Import TSV / JSON / PLS", elem_id="dictionary-import",
                                         file_types=[".tsv", ".txt", ".json", ".pls", ".xml"])
                self.export = gr.DownloadButton("Export TSV", elem_id="dictionary-export")
            with gr.Row(equal_height=True):
                trial = gr.Textbox(label="Try a sentence", scale=2, elem_id="dictionary-try",
                                   placeholder="Nguyen paid $5 on 2024-03-01.")
                try_it = gr.Button("Try it", scale=0, min_width=100, elem_id="dictionary-try-button")
                spoken = gr.Textbox(label="As it will be spoken", interactive=False, scale=2,
                                    elem_id="dictionary-spoken")
            self.status = gr.Markdown("", elem_id="dictionary-status")
            gr.HTML("", js_on_load=TYPE_TO_REPLACE, padding=False, elem_id="dictionary-keys")
        outputs = [self.table, self.export, self.status]
        owner = self.access.owner_only
        save.click(owner(warns(3)(self.save)), [self.table], outputs, api_visibility="private")
        upload.upload(owner(warns(3)(self.import_file)), [upload, self.table], outputs, api_visibility="private")
        trial.submit(self.trial, [trial, self.table], spoken, api_visibility="private")
        try_it.click(self.trial, [trial, self.table], spoken, api_visibility="private")

    # ------------------------------------------------------------------ handlers

    def load(self, request: gr.Request):
        """The page load: the owner's rules and their export; nothing for a visitor."""
        if not self.access.is_owner(request) or self.service.dictionary is None:
            return [], None, ""
        return self._shown(self.service.rules(), "")

    def save(self, rows):
        return self._shown(self._replace(dictionary_of(rows)), "Saved.")

    def import_file(self, file, rows):
        """The file's rules added after the table's, and saved."""
        path = Path(file if isinstance(file, str) else file.name)
        imported, notes = parse_file(path.name, path.read_bytes())
        saved = self._replace(merged(dictionary_of(rows), imported))
        return self._shown(saved, f"Imported {len(imported.rules)} rules. " + "; ".join(notes))

    def trial(self, text, rows, request: gr.Request = None):
        """`text` with the table's rules (saved or not), as the model will read it. Rules other than the saved
        ones are the owner's to try, like Save and Import: refused before they are compiled or run."""
        written = [row for row in rows or [] if row and str(row[0] or "").strip()]
        if written and not self.access.is_owner(request) and not self._saved(written, rows):
            raise gr.Error(OWNER_ONLY_TRIAL)
        return self._respelled(text, rows)

    @warns(1)
    def _respelled(self, text, rows):
        """As a take reads it: numbers, dates and units written out (English), then the rules, which match the
        words spoken ("$5" is "five dollars" by the time a rule sees it)."""
        return self.service.respell(normalize_text(text or "", AUTO), only=dictionary_of(rows))

    def _saved(self, written: list, rows) -> bool:
        """Whether the table's rules are the saved ones (a visitor may try those)."""
        saved = self.service.rules()
        if len(written) != len(saved.rules):
            return False
        try:
            return dictionary_of(rows) == saved
        except ValueError:
            return False

    def _replace(self, dictionary: Dictionary) -> Dictionary:
        if self.service.dictionary is None:
            raise ValueError("This studio keeps no pronunciation dictionary (it has no studio folder).")
        return self.service.dictionary.replace(dictionary)

    def _shown(self, dictionary: Dictionary, note: str):
        path = self.out_dir / "dictionary.tsv"
        path.write_text(to_tsv(dictionary), encoding="utf-8")
        status = f"{len(dictionary.rules)} rules (version `{dictionary.version or '—'}`). {note}"
        return rows_of(dictionary), str(path), status.strip()
