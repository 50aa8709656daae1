// The whole page's script, run once from the page's <head> (studio/views/page.py launch_kwargs): what no single
// component can do for itself. Gradio renders its components after this runs and re-renders them at will, so each
// fix is applied again whenever the page changes.
//  - Gradio's own controls: a name where a screen reader finds none (the player's captions button) or one that
//    does not match what the control shows, a role for the empty player's placeholder (a label is not allowed on
//    a plain <div>), and no Tab stop on a dropdown's list.
//  - Each table cell carries its column's name (data-label): on a phone, studio.css shows a table's rows as
//    cards, a cell's name before its value, so no table is wider than the screen.
//  - The skip link puts the keyboard in the text box (on the Studio tab, from any tab).
(() => {
  const NAMES = {'button[data-testid="subtitles-toggle"]': 'CC: captions on or off'};

  function nameControls(root) {
    for (const [selector, name] of Object.entries(NAMES)) {
      root.querySelectorAll(`${selector}:not([aria-label])`).forEach((el) => el.setAttribute('aria-label', name));
    }
    // A name must start from what the control shows (speech input users say what they see): the speed button
    // shows "1x" but was named after the next speed; the upload area's content names it better than its label.
    root.querySelectorAll('button.playback').forEach((el) => {
      const name = `${el.innerText.trim()} playback speed`;
      if (el.getAttribute('aria-label') !== name) el.setAttribute('aria-label', name);
    });
    root.querySelectorAll('button.upload-container[aria-label]').forEach((el) => el.removeAttribute('aria-label'));
    root.querySelectorAll('div.empty[aria-label]:not([role])').forEach((el) => el.setAttribute('role', 'img'));
    // A dropdown's open list scrolls, and Chromium gives the Tab key every scroller: Tab out of a dropdown landed
    // on its list, which closes as the box loses the focus, and the focus fell to <body>. The arrow keys move in it.
    root.querySelectorAll('ul.option-list:not([tabindex])').forEach((el) => { el.tabIndex = -1; });
  }

  function labelCells(root) {
    for (const grid of root.querySelectorAll('[role=grid]')) {
      const names = Array.from(grid.querySelectorAll('th[data-heading]'),
        (th) => th.innerText.replace('⋮', '').trim());
      grid.querySelectorAll('[role=gridcell][data-col]').forEach((cell) => {
        const name = names[+cell.dataset.col];
        if (name && cell.dataset.label !== name) cell.dataset.label = name;
      });
    }
  }

  // The names at once, before anything reads the page again (a screen reader, or axe in a test, may read it in the
  // next task); the table cells once per frame at most: Gradio changes the page in bursts.
  let queued = false;
  function tidy() {
    nameControls(document);
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      labelCells(document);
    });
  }

  // Attributes too: Gradio sets its own labels back when a control changes (the speed button's, at each click).
  new MutationObserver(tidy).observe(document.documentElement,
    {childList: true, subtree: true, characterData: true, attributes: true, attributeFilter: ['aria-label']});
  tidy();

  document.addEventListener('click', (ev) => {
    if (!ev.target.closest('a.hs-skip')) return;
    const box = document.querySelector('#text textarea');
    if (!box) return;
    ev.preventDefault();
    if (!box.getClientRects().length) {  // another tab is open: the text box is on the Studio tab
      document.querySelector('[role=tab][data-tab-id="studio"]')?.click();
    }
    requestAnimationFrame(() => box.focus());
  });
})();
