// The cue list under a take's player (studio/audio/captions.py captions_html): runs once when the list mounts, as
// the gr.HTML component's js_on_load (`element` is the component). The player shows the current cue itself
// (gr.Audio's `subtitles`, in its subtitle display); this marks the same cue in the list, by the player's
// <audio> time where it has one and otherwise by the text the display shows, and keeps it in view.
const TICK_MS = 150;
let last = -1;

function currentIndex(list, player) {
  const items = Array.from(list.querySelectorAll('li[data-start]'));
  const media = player.querySelector('audio');
  if (media && media.currentTime > 0) {
    const t = media.currentTime;
    return items.findIndex((li) => +li.dataset.start <= t && t < +li.dataset.end);
  }
  const shown = player.querySelector('[data-testid="subtitle-display"]');
  const text = shown ? shown.innerText.trim() : '';
  if (!text) return -1;
  const said = (li) => li.innerText.replace(/^\s*\d+:\d\d(\.\d)?\s*/, '').trim();
  // The same sentence may come twice: take the first match from the one marked last.
  for (let i = Math.max(last, 0); i < items.length; i++) if (said(items[i]) === text) return i;
  return items.findIndex((li) => said(li) === text);
}

setInterval(() => {
  const list = element.querySelector('.hs-captions[data-player]');
  const player = list && document.getElementById(list.dataset.player);
  if (!player) return;
  const index = currentIndex(list, player);
  if (index < 0 || index === last) return;
  list.querySelectorAll('li.current').forEach((li) => li.classList.remove('current'));
  const li = list.querySelectorAll('li[data-start]')[index];
  if (li) {
    li.classList.add('current');
    li.scrollIntoView({block: 'nearest'});
  }
  last = index;
}, TICK_MS);
