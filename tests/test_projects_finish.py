"""A project finished like a single take: captions per chapter and for the book (each segment's cue at its exact
sample offset), the pronunciation dictionary (the owner's and the project's; a changed rule makes exactly the
segments holding its word stale and only those render again), the ACX report per chapter, the ACX export
preset and exports levelled to a loudness target. Tiny random checkpoint, in process (tests/test_projects.py's
fixtures)."""

from __future__ import annotations

import io
import json
import subprocess
import zipfile

import numpy as np
import pyloudnorm
import pytest
import soundfile as sf
import srt
import webvtt

from studio.audio.formats import ffmpeg_path
from studio.projects import importing
from studio.projects.library import Projects
from studio.text.pronounce import Dictionary, DictionaryStore, Rule
from studio.takes.service import StudioService
from tests.helpers import PROJECT_SETTINGS, projects_client, running_projects, store_released_without, wait_job

pytestmark = pytest.mark.demo_threads  # the demo engine in process, as the app runs it (conftest.py)

SR = 24_000
# Chapter One's second paragraph holds two sentences in one segment (its second cue's start is estimated).
BOOK = ("# The book\n\n## One\n\nThe boat left at dawn.\n\nThe sea was calm. Gulls cried.\n\n"
        "## Two\n\nGulls followed it out.\n\nBy noon the wind had turned.\n\n## Three\n\nNobody spoke of the sea.")


class Prompts:
    """The engine, with the text of every prompt a job builds (one per segment rendered; a cut-short take's
    retry reuses its prompt)."""

    def __init__(self, engine):
        self.engine, self.texts = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def build_prompt(self, text, **kwargs):
        self.texts.append(text)
        return self.engine.build_prompt(text, **kwargs)


@pytest.fixture(scope="module")
def service(shared_engine, tiny_checkpoint):
    service = StudioService(shared_engine(tiny_checkpoint, precision="fp32", max_batch=2), None, None)
    yield service
    service.close()


@pytest.fixture(scope="module")
def studio(service, tmp_path_factory):
    """One store for the file: renders are keyed by what makes them, so each test's new copy of the book
    finds the first one's renders and renders nothing (only what a test changes is made)."""
    with running_projects(service, tmp_path_factory.mktemp("finish") / "projects") as studio:
        yield studio


@pytest.fixture
def rendered(studio):
    projects, runner = studio
    project = projects.create("owner", importing.from_text(BOOK, markdown=True), PROJECT_SETTINGS)
    assert wait_job(runner, runner.render(project.id).id)["state"] == "done"
    return project


def _segment_starts(cues) -> dict[int, float]:
    starts = {}
    for cue in cues:
        starts.setdefault(cue.segment, cue.start)
    return starts


# ------------------------------------------------------------------------------------------- captions
def test_chapter_captions_start_each_segment_at_its_sample_offset_and_parse_back(studio, service, rendered):
    projects, _ = studio
    audio = projects.chapter_audio(rendered.id, 0)
    pcm = projects.chapter_pcm(rendered.id, 0)
    segments = projects.chapter_view(rendered.id, 0)["segments"]
    pauses = [round(p.pause_after * SR) for p in projects.planned(rendered.id) if p.chapter == 0]
    # the spans are the assembled chapter's: each segment's samples, then exactly its pause of silence
    assert len(audio.spans) == len(segments) == 2 and audio.spans[0][0] == 0
    for i, (start, end) in enumerate(audio.spans):
        following = audio.spans[i + 1][0] if i + 1 < len(audio.spans) else audio.samples
        assert following == end + pauses[i] and not pcm[end:following].any()

    found = projects.captions(rendered.id, 0)
    starts = _segment_starts(found.cues)
    assert [starts[i] for i in range(2)] == pytest.approx([s / SR for s, _ in audio.spans], abs=1e-3)
    assert [c.text for c in found.cues] == ["The boat left at dawn.", "The sea was calm.", "Gulls cried."]
    assert [c.estimated for c in found.cues] == [False, True, True] and "estimated" in found.note
    assert all(a.end == b.start for a, b in zip(found.cues, found.cues[1:])) and found.cues[-1].end == audio.samples / SR

    subs = list(srt.parse(found.srt()))
    assert [s.start.total_seconds() for s in subs] == pytest.approx([c.start for c in found.cues], abs=1e-3)
    vtt = webvtt.from_buffer(io.StringIO(found.vtt()))
    assert [c.text for c in vtt.captions] == [c.text for c in found.cues]
    assert [c.identifier for c in vtt.captions] == ["1", "2 estimated", "3 estimated"]


def test_the_books_captions_continue_across_chapters_as_the_m4b_does(studio, service, rendered):
    projects, _ = studio
    book = projects.captions(rendered.id)
    offsets, at = [], 0
    for n in range(3):
        audio = projects.chapter_audio(rendered.id, n)
        offsets += [(at + start) / SR for start, _ in audio.spans]
        at += audio.samples
    starts = _segment_starts(book.cues)
    assert [starts[i] for i in range(len(offsets))] == pytest.approx(offsets, abs=1e-3)
    assert book.cues[-1].end == pytest.approx(at / SR) and book.cues[-1].text == "Nobody spoke of the sea."
    projects.patch(rendered.id, {"chapters": [{"index": 1, "skip": True}]})  # a skipped chapter is not in the book
    assert "Gulls followed it out." not in [c.text for c in projects.captions(rendered.id).cues]


def test_the_captions_route_serves_srt_vtt_and_json(service, studio, rendered):
    client = projects_client(service, studio)
    base = f"/v1/projects/{rendered.id}/captions"
    r = client.get(base, params={"format": "vtt", "chapter": 0})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/vtt")
    assert r.headers["x-captions-estimated"] == "true" and "attachment" in r.headers["content-disposition"]
    assert len(webvtt.from_buffer(io.StringIO(r.text)).captions) == 3
    r = client.get(base)  # the whole book, SRT
    assert r.status_code == 200 and len(list(srt.parse(r.text))) == 6
    cues = client.get(base, params={"format": "json", "chapter": 2}).json()["cues"]
    assert cues == [{"text": "Nobody spoke of the sea.", "start_time": 0.0, "end_time": cues[0]["end_time"],
                     "segment": 0, "estimated": False}]
    assert client.get(base, params={"format": "ass"}).status_code == 400
    assert client.get(base, params={"level": "letter"}).status_code == 400
    assert client.get(base, params={"chapter": 9}).status_code == 400
    fresh = client.post("/v1/projects", json={"text": "Not rendered.", "settings": PROJECT_SETTINGS}).json()
    r = client.get(f"/v1/projects/{fresh['id']}/captions")
    assert r.status_code == 400 and "not rendered yet" in r.json()["error"]["message"]


# ------------------------------------------------------------------------------------------- dictionary
def _states(projects, project_id) -> list[list[str]]:
    """Each chapter's segment states; a take cut at the tiny book's frame cap is rendered ("done")."""
    return [["done" if s["state"].startswith("cut short") else s["state"]
             for s in projects.chapter_view(project_id, n, acx=False)["segments"]] for n in range(3)]


def test_a_changed_rule_makes_exactly_its_segments_stale_and_only_they_render(studio, service, rendered, tmp_path):
    projects, runner = studio
    keys = [p.key for p in projects.planned(rendered.id)]
    prompts = Prompts(service.engine)
    service.engine = prompts
    service.dictionary = DictionaryStore(tmp_path / "dictionary.json")
    try:
        projects.patch(rendered.id, {"dictionary": {"rules": [{"word": "sea", "respelling": "see"}]}})
        after = [p.key for p in projects.planned(rendered.id)]
        assert [a != b for a, b in zip(keys, after)] == [False, True, False, False, True]
        assert _states(projects, rendered.id) == [["done", "stale"], ["done", "done"], ["stale"]]
        assert [c["state"] for c in projects.view(rendered.id)["chapters"]] == ["stale", "done", "stale"]
        assert projects.chapter_view(rendered.id, 2)["segments"][0]["spoken"] == "Nobody spoke of the see."
        job = wait_job(runner, runner.render(rendered.id).id)
        assert job["rendered"] == 2 and sorted(prompts.texts) == ["Nobody spoke of the see.",
                                                                  "The see was calm. Gulls cried."]
        assert _states(projects, rendered.id) == [["done", "done"], ["done", "done"], ["done"]]

        # the owner's global dictionary too: "gulls" is in two segments, one of them also holds "sea"
        prompts.texts.clear()
        service.dictionary.replace(Dictionary([Rule.make("gulls", "gals")]))
        assert _states(projects, rendered.id) == [["done", "stale"], ["stale", "done"], ["done"]]
        assert wait_job(runner, runner.render(rendered.id).id)["rendered"] == 2
        assert sorted(prompts.texts) == ["The see was calm. gals cried.", "gals followed it out."]

        # the project's rules are replaced as a whole: "sea" is gone, so chapter Three's segment is its first
        # render again (nothing to make), and the project's "gulls" wins over the owner's
        prompts.texts.clear()
        projects.patch(rendered.id, {"dictionary": [{"word": "gulls", "respelling": "gulls"}]})
        assert _states(projects, rendered.id) == [["done", "stale"], ["stale", "done"], ["done"]]
        assert wait_job(runner, runner.render(rendered.id).id)["rendered"] == 2
        assert sorted(prompts.texts) == ["The sea was calm. gulls cried.", "gulls followed it out."]
        assert projects.view(rendered.id)["dictionary"] == {"rules": [Rule.make("gulls", "gulls").to_json()]}
    finally:
        service.engine, service.dictionary = prompts.engine, None
    projects.patch(rendered.id, {"dictionary": []})
    assert [p.key for p in projects.planned(rendered.id)] == keys  # no rule fires: the keys the book had
    assert _states(projects, rendered.id) == [["done", "done"], ["done", "done"], ["done"]]


def test_the_api_takes_a_projects_dictionary_and_refuses_a_bad_rule(service, studio, rendered):
    client = projects_client(service, studio)
    url = f"/v1/projects/{rendered.id}"
    r = client.patch(url, json={"dictionary": {"rules": [{"word": r"(\w)\1", "respelling": "x", "regex": True}]}})
    assert r.status_code == 400 and "backreference" in r.json()["error"]["message"]
    r = client.patch(url, json={"dictionary": {"rules": [{"word": "noon", "respelling": "midday"}]}})
    assert r.status_code == 200 and r.json()["dictionary"]["rules"][0]["respelling"] == "midday"
    assert [c["state"] for c in r.json()["chapters"]] == ["done", "stale", "done"]
    spoken = client.get(f"{url}/chapters/1").json()["segments"][1]["spoken"]
    assert spoken == "By midday the wind had turned."


# ------------------------------------------------------------------------------------------- ACX and loudness
def test_a_chapters_acx_report_is_in_the_api_view_and_measured_once(service, studio, rendered, monkeypatch):
    fresh = Projects(studio[0].store, service)  # no report measured yet (the file's other tests read some)
    client = projects_client(service, (fresh, studio[1]))
    assert all(c["acx"] is None for c in client.get(f"/v1/projects/{rendered.id}").json()["chapters"])
    from studio.projects import outputs

    calls = []
    real = outputs.acx_check
    monkeypatch.setattr(outputs, "acx_check", lambda *a: calls.append(1) or real(*a))
    report = client.get(f"/v1/projects/{rendered.id}/chapters/0").json()["acx"]
    assert [c["name"] for c in report["checks"]] == ["rms", "peak", "noise_floor", "head_room_tone", "tail_room_tone"]
    assert isinstance(report["passed"], bool) and set(report["failed"]) <= {c["name"] for c in report["checks"]}
    for _ in range(3):  # the page's poll and the project's view read the cached report
        client.get(f"/v1/projects/{rendered.id}/chapters/0")
        chapters = client.get(f"/v1/projects/{rendered.id}").json()["chapters"]
    assert calls == [1] and chapters[0]["acx"] == report and chapters[1]["acx"] is None


def _probe(data: bytes) -> dict:
    out = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_name,sample_rate,bit_rate",
                          "-show_entries", "packet=size", "-of", "json", "-"], input=data, capture_output=True,
                         check=True, timeout=30).stdout
    return json.loads(out)


@pytest.mark.skipif(ffmpeg_path() is None, reason="ffmpeg not on PATH")
def test_the_acx_export_is_one_192k_cbr_mp3_at_44k1_per_chapter(service, studio, rendered):
    client = projects_client(service, studio)
    r = client.get(f"/v1/projects/{rendered.id}/export", params={"format": "acx"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        names = zf.namelist()
        assert names == ["01 One.mp3", "02 Two.mp3", "03 Three.mp3", "manifest.json"]
        manifest = json.loads(zf.read("manifest.json"))
        for name in names[:3]:
            facts = _probe(zf.read(name))
            assert facts["streams"][0] == {"codec_name": "mp3", "sample_rate": "44100", "bit_rate": "192000"}
            assert {int(p["size"]) for p in facts["packets"]} <= {626, 627}  # every frame the same size: CBR
    assert manifest["preset"] == "acx" and all("passed" in c["acx"] and c["acx"]["file_seconds"] > c["seconds"]
                                               for c in manifest["chapters"])
    one = client.get(f"/v1/projects/{rendered.id}/export", params={"format": "acx", "chapter": 1})
    assert one.status_code == 200 and one.headers["content-type"] == "audio/mpeg"
    assert _probe(one.content)["streams"][0]["sample_rate"] == "44100"
    r = client.get(f"/v1/projects/{rendered.id}/export", params={"format": "acx", "loudness": "audiobook"})
    assert r.status_code == 400 and "ACX" in r.json()["error"]["message"]


def test_an_export_levels_each_chapter_to_the_loudness_asked(service, studio, rendered):
    client = projects_client(service, studio)
    url = f"/v1/projects/{rendered.id}/export"
    meter = pyloudnorm.Meter(SR)
    for n in range(2):
        r = client.get(url, params={"format": "wav", "chapter": n, "loudness": "-18", "true_peak": "-2"})
        assert r.status_code == 200
        audio, _ = sf.read(io.BytesIO(r.content), dtype="float32")
        assert len(audio) == studio[0].chapter_audio(rendered.id, n).samples
        assert meter.integrated_loudness(audio.astype(np.float64)) == pytest.approx(-18, abs=0.5)
    book = client.get(url, params={"format": "wav", "loudness": "broadcast"})
    audio, _ = sf.read(io.BytesIO(book.content), dtype="float32")
    first = studio[0].chapter_audio(rendered.id, 0).samples
    assert meter.integrated_loudness(audio[:first].astype(np.float64)) == pytest.approx(-23, abs=0.5)
    for bad in ({"loudness": "loud"}, {"loudness": "-18", "true_peak": "3"}, {"true_peak": "x"}):
        r = client.get(url, params={"format": "wav", **bad})
        assert r.status_code == 400, bad


# ------------------------------------------------------------------------------------------- the tab
def test_the_tab_downloads_captions_and_checks_acx_on_demand_never_on_its_timer(service, studio, rendered, tmp_path,
                                                                                 monkeypatch):
    from studio.projects import outputs
    from studio.views.projects import ProjectsView

    calls = []
    real = outputs.acx_check
    monkeypatch.setattr(outputs, "acx_check", lambda *a: calls.append(1) or real(*a))
    view = ProjectsView(Projects(studio[0].store, service), studio[1], tmp_path)
    for _ in range(3):
        view.tick(rendered.id, 1, None)  # the one-second timer
    assert calls == []
    assert 'id="acx-verdict"' in view.acx_check(rendered.id, 1) and calls == [1]
    chapter = view.captions_file(rendered.id, "vtt", 1)
    assert chapter.endswith("The book - 01.vtt") and len(webvtt.read(chapter).captions) == 3
    book = view.captions_file(rendered.id, "srt", 0)
    with open(book, encoding="utf-8") as f:
        assert len(list(srt.parse(f.read()))) == 6
    levelled = view.export_file(rendered.id, "wav", 1, "audiobook")
    audio, _ = sf.read(levelled, dtype="float64")
    assert pyloudnorm.Meter(SR).integrated_loudness(audio) == pytest.approx(-18, abs=0.5)
    # the project's own rules, as TSV: saving marks the segment holding the word stale
    assert view.load_rules(rendered.id).startswith("word\trespelling")
    _, chapters, segments, *_ = view.save_rules(rendered.id, "noon\tmidday", 2)
    assert [row[3] for row in chapters] == ["done", "out of date", "done"]
    assert segments[1][1] == "By noon the wind had turned." and segments[1][4] == "out of date"
    assert segments[0][4] != "out of date"
    assert "noon\tmidday" in view.load_rules(rendered.id)


def test_a_store_made_before_project_dictionaries_gains_the_column(tmp_path):
    store = store_released_without(tmp_path, "projects", "dictionary")
    project = store.create_project("owner", title="Old", settings={"seed": 1}, chapters=[])
    assert store.project(project.id).dictionary == []
    store.update_project(project.id, dictionary=[{"word": "a", "respelling": "b"}])
    assert store.project(project.id).dictionary == [{"word": "a", "respelling": "b"}]
    store.close()


def test_with_asr_on_a_chapters_times_inside_a_segment_are_heard(studio, rendered):
    from studio.audio.asr import Transcriber
    from tests.fakes import AsrPipeline

    projects, _ = studio
    pipe = AsrPipeline([[("The", 0.0), ("sea", 0.02), ("was", 0.04), ("calm.", 0.06), ("Gulls", 0.1),
                          ("cried.", 0.12)]])
    found = projects.captions(rendered.id, 0, transcriber=Transcriber("fake", make_pipeline=lambda m, d: pipe))
    start, end = projects.chapter_audio(rendered.id, 0).spans[1]
    assert len(pipe.calls) == 1  # only the segment with two sentences is heard, and only its own samples
    assert pipe.calls[0][0] == pytest.approx((end - start) * 16000 / SR, abs=2)
    assert found.cues[2].text == "Gulls cried." and found.cues[2].start == pytest.approx(start / SR + 0.1, abs=1e-3)
    assert not found.estimated and found.note is None
