// The tag palette: runs once when it mounts, as the gr.HTML component's js_on_load (`element` is the palette).
// A click inserts the tag at the text box's cursor and fires `input` so Gradio sees the new value. sfx tags
// get no trailing space (the onomatopoeia must follow immediately); the others get one.
// For the keyboard the palette is one stop (render.py gives only one button tabindex 0): the arrow keys, Home
// and End move among the 43 buttons, Enter or Space inserts, and Tab leaves for the next control.
/* global element */

const buttons = () => Array.from(element.querySelectorAll('button[data-tag]'));

function rove(to) {
  buttons().forEach((b) => { b.tabIndex = b === to ? 0 : -1; });
}

element.addEventListener('click', (ev) => {
  const btn = ev.target.closest('button[data-tag]');
  if (!btn) return;
  rove(btn);  // Tab back into the palette returns to the tag used last
  const ta = document.querySelector('#text textarea');
  if (!ta) return;
  const tag = btn.dataset.tag;
  const ins = tag.startsWith('<|sfx:') ? tag : tag + ' ';
  const s = ta.selectionStart ?? ta.value.length, e = ta.selectionEnd ?? s;
  ta.value = ta.value.slice(0, s) + ins + ta.value.slice(e);
  ta.selectionStart = ta.selectionEnd = s + ins.length;
  ta.dispatchEvent(new Event('input', {bubbles: true}));
  ta.focus();
});

const STEP = {ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1};

element.addEventListener('keydown', (ev) => {
  const all = buttons();
  const at = all.indexOf(document.activeElement);
  if (at < 0) return;
  let next;
  if (ev.key in STEP) next = (at + STEP[ev.key] + all.length) % all.length;
  else if (ev.key === 'Home') next = 0;
  else if (ev.key === 'End') next = all.length - 1;
  else return;
  ev.preventDefault();  // the arrows would scroll the page
  rove(all[next]);
  all[next].focus();
});
