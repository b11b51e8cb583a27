"""Subtitles into timed words and sentences, over real WebVTT/SRT files and their traps.

Files whose licence allows it live in tests/data/subtitles; the others (GPL, ACSL, no licence)
are read from ../shared/data/subtitles, and their tests skip when it is absent.
"""

from __future__ import annotations

import itertools
import logging
import random
import re
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, TESTS
from pipeline.config import SentenceConfig
from pipeline.errors import BadInputError
from pipeline.transcribe.segment import Word
from pipeline.transcribe.subtitles import parse
from pipeline.transcribe.subtitles import (
    Cue,
    cue_words,
    decode_subtitle_bytes,
    is_rolling,
    read_cues,
    rolling_words,
    subtitle_sentences,
)

LOCAL = TESTS / "data" / "subtitles"
SHARED = ROOT.parent / "shared" / "data" / "subtitles"

A01 = "a01_yt_auto_zoom_escaper_videogrep.en.vtt"
A02 = "a02_yt_auto_manifesto_audiobook_videogrep.en.vtt"
A03 = "a03_yt_auto_kinetic_bunny_wrolpi.en.vtt"
A04 = "a04_yt_auto_side_projects_simonw.en.vtt"
A05 = "a05_yt_auto_punctuated_ws_stripped_fast_charging_lattifai.en.vtt"
A06 = "a06_yt_auto_oldstyle_2019_style_header_webvtt_py.en.vtt"
A07 = "a07_yt_auto_oldstyle_3line_colors_meow.en.vtt"
A08 = "a08_yt_auto_converted_to_srt_rolling_wrolpi.en.srt"
B01 = "b01_yt_manual_gpt4o_cart_overlapping.en-uYU-mmqFLq8.vtt"
B02 = "b02_yt_manual_sound_descriptions_only_wrolpi.en.vtt"
B03 = "b03_yt_manual_crashcourse_euro_history_1c7.vtt"
B04 = "b04_yt_manual_solid_cue_ids_trailing_spaces_ebarakoji.vtt"
C01 = "c01_kitchen_sink_note_style_region_voice_empty_overlap_pysubs2.vtt"
C02 = "c02_utf8_bom_webvtt_py.vtt"
C03 = "c03_bom_cr_only_line_endings_astisub.vtt"
C04 = "c04_crlf_hoursless_multiline_bold_libwebvtt.vtt"
C05 = "c05_html_entities_nbsp_amp_lt_astisub.vtt"
C06 = "c06_hoursless_inline_timestamps_webvtt_py.vtt"
C07 = "c07_ms_teams_nonstandard_ts_voice_overlap_webvtt_py.vtt"
C08 = "c08_style_block_cue_ids_classes_entities_webvtt_py.vtt"
ALL = [A01, A02, A03, A04, A05, A06, A07, A08, B01, B02, B03, B04,
       C01, C02, C03, C04, C05, C06, C07, C08]
ROLLING = [A01, A02, A03, A04, A05, A06, A07, A08]
CURRENT_LAYOUT = [A01, A02, A03, A04, A05]

CFG = SentenceConfig()


def path(name: str) -> Path:
    for folder in (LOCAL, SHARED):
        if (folder / name).is_file():
            return folder / name
    pytest.skip(f"{name} is only in {SHARED}, which is absent")


def texts(words: list[Word]) -> list[str]:
    return [w.text for w in words]


# ------------------------------------------------- expected words, read simply from the file


def raw_cues(name: str) -> list[tuple[float, float, list[str]]]:
    """(start, end, payload lines) read with a regex, independently of the module."""
    text = path(name).read_bytes().decode("utf-8-sig")
    pieces = re.split(r"^(\d+):(\d\d):(\d\d\.\d+) --> (\d+):(\d\d):(\d\d\.\d+).*$", text,
                      flags=re.MULTILINE)
    out = []
    for i in range(1, len(pieces), 7):
        h1, m1, s1, h2, m2, s2 = pieces[i:i + 6]
        start = int(h1) * 3600 + int(m1) * 60 + float(s1)
        end = int(h2) * 3600 + int(m2) * 60 + float(s2)
        out.append((start, end, pieces[i + 6].strip("\n").split("\n")))
    return out


def untagged_words(line: str) -> list[str]:
    return re.sub(r"<[^>]*>", "", line).split()


def spoken_current_layout(name: str) -> list[str]:
    """Current YouTube layout: every cue but the 10 ms snapshots ends on its new line."""
    words = []
    for start, end, lines in raw_cues(name):
        shown = [line for line in lines if line.strip()]
        if end - start > 0.02 and shown:
            words += untagged_words(shown[-1])
    return words


def spoken_timed_lines(name: str) -> list[str]:
    """Older layout: the lines with inline timestamps, in file order."""
    return [w for _, _, lines in raw_cues(name) for line in lines
            if re.search(r"<\d\d:\d\d:\d\d\.\d+>", line) for w in untagged_words(line)]


# ------------------------------------------------- every file


@pytest.mark.parametrize("name", ALL)
def test_every_file_parses_into_ordered_clean_sentences(name: str) -> None:
    cues = read_cues(path(name))
    assert cues, "no cues"
    assert all(c.end_s >= c.start_s for c in cues)
    sentences, layout = subtitle_sentences(path(name), CFG)
    assert layout == ("rolling" if name in ROLLING else "cues")
    assert sentences or name == B02, "no sentences"  # B02 holds sound descriptions only
    previous_end = 0.0
    for s in sentences:
        assert s.text.strip()
        assert s.start_s >= previous_end
        assert s.end_s - s.start_s > 0.3
        for word in s.words:
            assert word.text and not re.search(r"\s|<[/\w][^>]*>|&#?\w+;|\u00a0", word.text), word
            assert word.end_s >= word.start_s
        previous_end = s.end_s
    starts = [w.start_s for s in sentences for w in s.words]
    assert starts == sorted(starts)


@pytest.mark.parametrize("name", ALL)
def test_path_bytes_and_text_read_the_same(name: str) -> None:
    data = path(name).read_bytes()
    assert read_cues(data) == read_cues(path(name)) == read_cues(decode_subtitle_bytes(data))
    assert read_cues(str(path(name))) == read_cues(data)


# ------------------------------------------------- rolling auto captions


@pytest.mark.parametrize("name", CURRENT_LAYOUT)
def test_current_layout_gives_each_spoken_word_once(name: str) -> None:
    cues = read_cues(path(name))
    assert is_rolling(cues)
    assert texts(rolling_words(cues)) == spoken_current_layout(name)


def test_old_layout_gives_each_spoken_word_once() -> None:
    cues = read_cues(path(A07))
    assert is_rolling(cues)
    assert texts(rolling_words(cues)) == spoken_timed_lines(A07)


def test_old_layout_excerpt_with_untimed_lines_and_no_blank_before_a_timing() -> None:
    cues = read_cues(path(A06))
    # The "what" cue runs straight into the next timing line: still two cues, not one.
    assert [c.start_s for c in cues] == [286.07, 286.47, 304.08, 305.069]
    assert cues[1].text.split("\n")[-1] == "<c.colorCCCCCC>what</c>"
    expected = ["yeah", "what"] + spoken_timed_lines(A06)
    assert texts(rolling_words(cues)) == expected == [
        "yeah", "what", "this", "will", "happen", "is", "I'm", "telling"]


@pytest.mark.parametrize("name", ROLLING)
def test_rolling_word_times_follow_the_inline_timestamps(name: str) -> None:
    words = rolling_words(read_cues(path(name)))
    assert len(words) >= 8  # A06, the shortest, has 8
    for before, after in itertools.pairwise(words):
        assert before.start_s <= before.end_s <= after.start_s
    if name == A05:
        by_text = {w.text: w for w in words[:6]}
        assert by_text["fast"].start_s == 0.56 and by_text["charging"].start_s == 0.8
        assert by_text["Does"].start_s == 0.24


def test_srt_conversion_of_rolling_captions_has_each_line_once() -> None:
    cues = read_cues(path(A08))
    assert is_rolling(cues)
    words = texts(rolling_words(cues))
    assert words == spoken_current_layout(A03)  # the same video as a03
    lines = [" ".join(untagged_words(line)) for _, _, body in raw_cues(A03) for line in body
             if "<" in line]
    assert " ".join(words) == " ".join(lines)


def test_a05_keeps_the_words_after_a_stripped_placeholder_line() -> None:
    words = texts(rolling_words(read_cues(path(A05))))
    assert words[:6] == ["Does", "fast", "charging", "hurt", "the", "battery?"]
    sentences, _ = subtitle_sentences(path(A05), CFG)
    assert sentences[0].text == "Does fast charging hurt the battery?"


def test_a03_keeps_its_last_line_without_a_snapshot_after_it() -> None:
    words = texts(rolling_words(read_cues(path(A03))))
    assert words[-7:] == ["company", "called", "le", "code", "from", "finland", "and"]


def test_a01_keeps_a_word_really_said_twice_and_the_late_inline_timestamp() -> None:
    words = rolling_words(read_cues(path(A01)))
    assert texts(words).count("vbcable") == 2
    # "going" is stamped 00:00:20.480 in a cue that ends at 00:00:20.470.
    going = next(w for w in words if w.text == "going" and w.start_s > 20)
    assert going.start_s == 20.48 and going.end_s >= going.start_s


@pytest.mark.parametrize("name", [A01, A02])
def test_long_unpunctuated_captions_split_into_short_sentences(name: str) -> None:
    sentences, _ = subtitle_sentences(path(name), CFG)
    durations = [s.end_s - s.start_s for s in sentences]
    assert len(sentences) > 10
    assert statistics.median(durations) < 8
    assert max(durations) <= CFG.max_s + 0.5
    assert max(len(s.words) for s in sentences) <= CFG.max_words


# ------------------------------------------------- author captions


def test_b01_overlapping_cart_captions_have_no_markers_and_no_repeats() -> None:
    sentences, layout = subtitle_sentences(path(B01), CFG)
    assert layout == "cues"
    text = " ".join(s.text for s in sentences)
    for marker in (">>", "&gt;", "[APPLAUSE]", "[LAUGHTER]", "[MUSIC]", "MURATI:", "CHAT GPT:"):
        assert marker not in text
    assert "  " not in text
    words = text.split()
    assert len(words) > 3000
    for i in range(len(words) - 12):
        assert words[i:i + 6] != words[i + 6:i + 12], " ".join(words[i:i + 12])
    assert sentences[0].text == "Hi everyone."


def test_b02_sound_descriptions_only_yields_no_sentences() -> None:
    assert subtitle_sentences(path(B02), CFG) == ([], "cues")
    kept, _ = subtitle_sentences(path(B02), CFG, drop_sound_tags=False)
    assert "(YAWNS)" in kept[0].text


def test_b03_removes_intro_inside_a_cue_but_keeps_the_speech() -> None:
    words = texts(cue_words(read_cues(path(B03))))
    assert "[Intro]" not in words
    i = words.index("population")
    assert words[i - 2:i + 2] == ["town.", "So,", "population", "was"]


def test_b04_nbsp_line_ends_and_numeric_ids() -> None:
    cues = read_cues(path(B04))
    assert len(cues) == 92
    assert all(not c.text.split("\n")[0].strip().isdigit() for c in cues)
    words = texts(cue_words(cues))
    assert words[:4] == ["The", "web", "as", "we"]
    assert not any("\u00a0" in w for w in words)


def test_c01_kitchen_sink() -> None:
    cues = read_cues(path(C01))
    empty = [c for c in cues if c.text == ""]
    assert [(c.start_s, c.end_s) for c in empty] == [(36.159, 37.743)]
    assert cue_words(empty) == []
    sentences, _ = subtitle_sentences(path(C01), CFG)
    text = " ".join(s.text for s in sentences)
    assert "Would you like to get a coffee?" in text
    assert "Sure! I\u2019ve only had one today." in text
    assert "Hello world." in text and "- Hello" not in text
    for junk in ("Fred", "Bill", "Salame", "WikipediaPage", "NOTE", "STYLE", "REGION", "::cue",
                 "X-TIMESTAMP-MAP", "id a", "Title Crawl"):
        assert junk not in text
    assert text.count("Yellow!") == 2  # <u> and the ruby base; the ruby text <rt> is dropped


def test_c02_bom() -> None:
    cues = read_cues(path(C02))
    assert [c.text for c in cues] == [f"Caption text #{i}" for i in range(1, 5)]
    assert cues[-1].end_s == 21.58


def test_c03_cr_only_line_ends() -> None:
    cues = read_cues(path(C03))
    assert [(c.start_s, c.end_s) for c in cues] == [(0.0, 3.766), (3.767, 10.732),
                                                     (10.733, 14.066)]
    assert cues[0].text == ("Did one of the last stories strike you as\n"
                            "more interesting than the other?")


def test_c04_crlf_hourless_timestamps() -> None:
    cues = read_cues(path(C04))
    assert [(c.start_s, c.end_s) for c in cues] == [(11.0, 15.0)]
    assert cues[0].text == "We <b>are</b>\n<b>in</b> New York City"
    assert texts(cue_words(cues)) == ["We", "are", "in", "New", "York", "City"]


def test_c05_entities_and_nbsp_are_gone() -> None:
    words = texts(cue_words(read_cues(path(C05))))
    joined = " ".join(words)
    for junk in ("&nbsp;", "&amp;", "&lt;", "nbsp", "\u00a0"):
        assert junk not in joined
    assert words[:3] == ["The", "man", "in"]
    assert "Go," in words and "then," in words and "<" in words


def test_c06_hourless_inline_timestamps_are_not_youtube_rolling() -> None:
    cues = read_cues(path(C06))
    assert [(c.start_s, c.end_s) for c in cues] == [(16.5, 18.5), (18.5, 20.5), (20.5, 21.5)]
    assert not is_rolling(cues)
    assert texts(cue_words(cues))[-2:] == ["That's", "amore"]


def test_c07_teams_one_digit_timestamps_and_voices() -> None:
    cues = read_cues(path(C07))
    assert [(c.start_s, c.end_s) for c in cues] == [(0.0, 0.57), (0.21, 1.13)]
    assert texts(cue_words(cues)) == ["There", "you", "go.", "Why", "hello", "there,", "Yuri."]


def test_c08_classes_entities_and_filler_cues() -> None:
    words = texts(cue_words(read_cues(path(C08))))
    assert "---" not in words and "-St\u00e9phane" not in words
    assert words[-4:] == ["Euh,", "l\u00e0-bas,", "au", "ch\u00eane."]
    assert "St\u00e9phane?" in words  # French spacing: "?" joins the word before it
    assert "<" in words


# ------------------------------------------------- cue handling


def test_overlapping_roll_up_cues_drop_the_repeated_prefix() -> None:
    cues = [Cue(0.0, 3.0, "so today we are going"), Cue(2.0, 5.0, "we are going\nto talk"),
            Cue(4.0, 6.0, "about it"), Cue(7.0, 8.0, "about it")]
    # The last cue does not overlap, so its repeat is real speech.
    assert " ".join(texts(cue_words(cues))) == "so today we are going to talk about it about it"


def test_cues_ending_before_they_start_are_dropped_and_zero_length_kept(caplog) -> None:
    text = ("WEBVTT\n\n00:00:02.000 --> 00:00:01.000\nbackwards\n\n"
            "00:00:03.000 --> 00:00:03.000\nzero\n\n00:00:04.000 --> 00:00:05.000\nfine\n")
    with caplog.at_level(logging.WARNING, logger="pipeline.transcribe.subtitles"):
        cues = read_cues(text)
    assert [c.text for c in cues] == ["zero", "fine"]
    assert "ends before it starts" in caplog.text


def test_sound_descriptions_and_speakers() -> None:
    cues = [Cue(0, 2, "[Music]"), Cue(2, 4, "♪ la la la ♪"), Cue(4, 6, "(APPLAUSE)"),
            Cue(6, 9, ">> JOHN SMITH: hello (and I mean it) there\n- Yes. >> Ok."),
            Cue(9, 10, "WELL, HERE IS THE THING: IT WORKS.")]
    assert " ".join(texts(cue_words(cues))) == (
        "hello (and I mean it) there Yes. Ok. WELL, HERE IS THE THING: IT WORKS.")
    assert texts(cue_words(cues[:3], drop_sound_tags=False)) == [
        "[Music]", "♪", "la", "la", "la", "♪", "(APPLAUSE)"]


def test_headerless_vtt_and_messy_srt() -> None:
    vtt = "00:01.000 --> 00:02.500\nhello there\n"
    assert read_cues(vtt) == [Cue(1.0, 2.5, "hello there")]
    srt = ("\n1\n0:00:01,000 --> 0:00:02,000\nfirst line\n\nstill the first cue\n"
           "2\n00:00:03,500 --> 00:00:04,000\n<i>second</i>\n")
    cues = read_cues(srt.encode("cp1252"))
    assert [(c.start_s, c.end_s) for c in cues] == [(1.0, 2.0), (3.5, 4.0)]
    assert texts(cue_words(cues)) == ["first", "line", "still", "the", "first", "cue", "second"]


def test_short_sentences_are_extended_or_merged_never_overlapping() -> None:
    text = ("WEBVTT\n\n00:00:01.000 --> 00:00:01.100\nHi.\n\n"
            "00:00:01.100 --> 00:00:03.000\nHow are you today?\n\n"
            "00:00:05.000 --> 00:00:05.050\nBye.\n")
    sentences, _ = subtitle_sentences(text, CFG)
    assert [s.text for s in sentences] == ["Hi. How are you today?", "Bye."]
    assert sentences[-1].end_s - sentences[-1].start_s > 0.3


# ------------------------------------------------- read as it is, or repaired first


def _spy_on_repair(monkeypatch) -> list[str]:
    """The formats of the files rewritten by the repair (parse._repaired) from now on."""
    calls: list[str] = []
    real = parse._repaired
    monkeypatch.setattr(parse, "_repaired", lambda text, fmt: calls.append(fmt) or real(text, fmt))
    return calls


@pytest.mark.parametrize("name", [A04, B03, B04, C02, C03, C04, C05, C06, C08])
def test_a_well_formed_file_is_read_by_webvtt_py_as_it_is(name: str, monkeypatch) -> None:
    calls = _spy_on_repair(monkeypatch)
    assert read_cues(path(name))
    assert calls == []


def test_a_well_formed_srt_is_read_as_it_is(monkeypatch) -> None:
    calls = _spy_on_repair(monkeypatch)
    srt = ("1\n00:00:01,000 --> 00:00:02,500\nhello\nthere\n\n"
           "2\n00:00:03,000 --> 00:00:04,000\n<i>you</i>\n")
    assert read_cues(srt) == [Cue(1.0, 2.5, "hello\nthere"), Cue(3.0, 4.0, "<i>you</i>")]
    assert calls == []


@pytest.mark.parametrize(("text", "expected"), [
    # Text after a blank line inside a cue (a " " line stripped): webvtt-py would drop it.
    ("WEBVTT\n\n00:00:01.000 --> 00:00:02.000\nfirst\n\nsecond\n",
     [Cue(1.0, 2.0, "first\n \nsecond")]),
    # One-digit fields and fraction (MS Teams): webvtt-py's strict mode refuses them.
    ("WEBVTT\n\n0:0:1.5 --> 0:0:2.0\nhi\n", [Cue(1.5, 2.0, "hi")]),
    # A timing with no blank line before it still starts a cue.
    ("WEBVTT\n\n00:01.000 --> 00:02.000\na\n00:03.000 --> 00:04.000\nb\n",
     [Cue(1.0, 2.0, "a"), Cue(3.0, 4.0, "b")]),
    # SRT: webvtt-py reads "07,5" as 7.005 s and skips the hour-less cue.
    ("1\n00:00:07,5 --> 00:00:09,000\nhi\n\n2\n00:10,000 --> 00:11,000\nthere\n",
     [Cue(7.5, 9.0, "hi"), Cue(10.0, 11.0, "there")]),
])
def test_a_malformed_but_repairable_file_is_repaired_then_read(
        text: str, expected: list[Cue], monkeypatch) -> None:
    calls = _spy_on_repair(monkeypatch)
    assert read_cues(text) == expected
    assert len(calls) == 1


@pytest.mark.parametrize("name", [A05, A06, C01, C07])
def test_real_files_webvtt_py_refuses_or_misreads_are_repaired(name: str, monkeypatch) -> None:
    calls = _spy_on_repair(monkeypatch)
    assert read_cues(path(name))
    assert len(calls) == 1


# ------------------------------------------------- bad input and encodings


def test_garbage_bytes_raise_bad_input() -> None:
    garbage = bytes(random.Random(0).randrange(256) for _ in range(4000))
    with pytest.raises(BadInputError, match="not a subtitle file"):
        read_cues(garbage)
    with pytest.raises(BadInputError, match="empty"):
        read_cues(b"")


def test_a_file_without_cues_has_no_sentences() -> None:
    text = b"WEBVTT\nKind: captions\n\nNOTE nothing here\n"
    assert read_cues(text) == []
    assert subtitle_sentences(text, CFG) == ([], "cues")


def test_unreadable_timings_raise_bad_input() -> None:
    with pytest.raises(BadInputError, match="no readable cue timings"):
        read_cues("WEBVTT\n\n00:00:75.000 --> 00:00:76.000\nhi\n")


@pytest.mark.parametrize("codec", ["utf-16", "utf-16-be", "utf-32"])
def test_utf16_and_utf32_with_bom_decode(codec: str) -> None:
    text = path(C03).read_bytes().decode("utf-8-sig")
    data = text.encode(codec) if codec != "utf-16-be" else b"\xfe\xff" + text.encode(codec)
    assert read_cues(data) == read_cues(path(C03))


def test_decode_fallbacks_and_line_ends() -> None:
    assert decode_subtitle_bytes("caf\u00e9\r\nl\u2019\u00e9t\u00e9\r".encode("cp1252")) == (
        "caf\u00e9\nl\u2019\u00e9t\u00e9\n")
    assert decode_subtitle_bytes(b"\x81\x8d\xe9") == "\x81\x8d\u00e9"  # not cp1252 either
    assert decode_subtitle_bytes("WEBVTT\n".encode("utf-16-le")) == "WEBVTT\n"  # no BOM
    assert decode_subtitle_bytes(b"\xef\xbb\xbfA\rB\r\nC\nD") == "A\nB\nC\nD"


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(alphabet=st.sampled_from(list("WEBVT0123456789:.,-> \n\r<c/>[]()&;abNOTE\x00\ufeff")),
            max_size=300),
    st.binary(max_size=300),
))
def test_any_input_reads_or_raises_bad_input(source: str | bytes) -> None:
    try:
        cues = read_cues(source)
    except BadInputError:
        return
    for words in (cue_words(cues), rolling_words(cues)):
        starts = [w.start_s for w in words]
        assert starts == sorted(starts)
        assert all(w.text.strip() for w in words)
