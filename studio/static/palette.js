// The tag palette: runs once when it mounts, as the gr.HTML component's js_on_load (`element` is the palette).
// A click inserts the tag at the text box's cursor and fires `input` so Gradio sees the new value. sfx tags
// get no trailing space (the onomatopoeia must follow immediately); the others get one.
/* global element */

element.addEventListener('click', (ev) => {
  const btn = ev.target.closest('button[data-tag]');
  if (!btn) return;
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
