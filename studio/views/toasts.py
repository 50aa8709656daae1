"""A page handler's ValueError (a mistake the user can fix) becomes a warning toast that leaves the outputs as
they were; raising gr.Error instead would paint an error overlay over every output component."""

from __future__ import annotations

import functools
import inspect

import gradio as gr


def warns(n_outputs: int):
    """Decorate a handler with `n_outputs` outputs; a generator stays a generator, so Gradio still streams it
    (it stops at the toast, the outputs keep what it had yielded)."""
    def wrap(fn):
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def stream(*args, **kwargs):
                try:
                    yield from fn(*args, **kwargs)
                except ValueError as exc:
                    gr.Warning(str(exc))
            return stream

        @functools.wraps(fn)
        def handler(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ValueError as exc:
                gr.Warning(str(exc))
                return gr.skip() if n_outputs == 1 else (gr.skip(),) * n_outputs
        return handler
    return wrap
