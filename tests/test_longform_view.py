"""The "Long form" tab (studio/views/longform.py) on the demo checkpoint: its handlers directly, then its
events through gradio_client on a served Blocks: four paragraphs fill the segment table, one row is
generated again, and the downloaded take has the new audio in that row only."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from studio.takes.service import StudioService
from studio.views.longform import LongFormView, parse_voices_map

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

PARAGRAPHS = "\n\n".join(
    f"Paragraph {n} begins here, calm and slow. It goes on for a while about the sea and the sky. "
    f"Then it ends with a short remark." for n in ("one", "two", "three", "four"))


@pytest.fixture(scope="module")
def service(shared_engine):
    service = StudioService(shared_engine())
    yield service
    service.close()


def test_the_voices_map_reads_lines_and_says_what_is_wrong():
    assert parse_voices_map("Alice = Narrator\n\n[S2] =\n") == {"Alice": "Narrator", "[S2]": None}
    assert parse_voices_map("  ") is None
    with pytest.raises(ValueError, match="line 2 .* `Speaker = voice name`"):
        parse_voices_map("Alice = Narrator\nBob Narrator")


def test_handlers_plan_generate_and_regenerate_one_row(service, tmp_path):
    view = LongFormView(service, tmp_path)
    rows, _spoken, summary = view.preview(PARAGRAPHS, "", "", True)
    assert len(rows) >= 4 and all(r[2] == "planned" for r in rows) and "segments" in summary
    outputs = list(view.generate(PARAGRAPHS, "", "", "", True, 5))
    take, rows, progress, path, spoken = outputs[-1]
    assert len(rows) == len(take.segments) and all(r[2] != "waiting" for r in rows)
    assert next(o[2] for o in outputs[:-1]).startswith("1 of ") and progress.startswith("Done")
    assert ".;" not in progress and "repeat_guard" not in progress and "max_frames" not in progress
    assert spoken == "\n\n".join(s.text for s in take.segments)
    assert [r[4] for r in rows] == [f"{s.pause_after:.2f} s" if s.pause_after else "" for s in take.segments]
    first = sf.read(path)[0]
    spans = take.spans()
    take, rows, _, path = view.regenerate(take, 3, 777, "")
    second = sf.read(path)[0]
    for i, ((a, b), (c, d)) in enumerate(zip(spans, take.spans())):
        assert np.array_equal(first[a:b], second[c:d]) == (i != 2), i
    assert "between 1 and" in view.regenerate(take, 99, -1, "")[2]  # said in the progress line, the rest kept


def test_a_failed_generate_keeps_the_table_and_the_player_and_says_why(service, tmp_path):
    import gradio as gr

    view = LongFormView(service, tmp_path)
    outputs = list(view.generate("Alice: Hi.\n\nBob: Hello.", "", "", "Alice =", True, 5))
    assert len(outputs) == 1  # before the fix nothing was yielded: Gradio then blanked every output
    take, rows, progress, audio, spoken = outputs[0]
    assert take == rows == audio == spoken == gr.skip()
    assert progress.startswith("Not generated:") and "'Bob'" in progress


@pytest.mark.slow
def test_the_tab_through_gradio_client(service, tmp_path):
    import gradio as gr

    gradio_client = pytest.importorskip("gradio_client")
    from tests.studio_server import free_port

    with gr.Blocks() as blocks, gr.Tab("Long form"):
        LongFormView(service, tmp_path).build("gpu")
    port = free_port()
    blocks.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = gradio_client.Client(f"http://127.0.0.1:{port}", verbose=False)
        rows, progress, path, _spoken = client.predict(PARAGRAPHS, "", "", "", True, 8, api_name="/long_generate")
        assert len(rows["data"]) >= 4 and progress.startswith("Done")
        first = sf.read(path)[0]
        # The session's take (a gr.State) is what the regenerate event works on.
        rows, progress, path = client.predict(2, 4242, "", api_name="/long_regenerate")
        assert "Row 2" in progress and rows["data"][1][7] in ("4242", "4243")
        second = sf.read(path)[0]
        differs = np.flatnonzero(first[:min(len(first), len(second))] != second[:len(first)])
        assert len(differs) or len(first) != len(second)
        assert not len(differs) or differs[0] > 0.5 * 24000  # row 1 (a sentence and its pause) is untouched
    finally:
        blocks.close()
