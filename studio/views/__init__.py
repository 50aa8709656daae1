"""The page's views, one module per part of the page; `studio/views/page.py` assembles them into the Blocks.

    studio.py    the Studio tab: text, tags, style, voice, clone panel, sampling, and its events
    takes.py     the session's takes: live player, metrics, take, downloads, side-by-side takes, history
    voices.py    the Voices tab over the owner's library
    private.py   the Voices tab when voices are private to each visitor (kept in their browser)
    longform.py  the Long form tab
    toasts.py    handlers whose ValueError becomes a warning toast
"""

GPU_QUEUE = "gpu"  # concurrency_id shared by the events that use the engine one at a time (voices, long form)
TAKES_QUEUE = "takes"  # Generate: as many at once as the service has batch slots (the engine batches them)
