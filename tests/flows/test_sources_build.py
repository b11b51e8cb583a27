"""The YouTube sources through `vlcorpus build` as typed: the howto100m starter's searches (the
`search` source, `ytsearchN:`) and a channel's videos tab (the `playlist` source of the
apartment_tour starter), listed by yt-dlp's own YouTube extractors over HTTPS from
tests/youtubekit.py's YouTube on 127.0.0.1 (www.youtube.com resolved there by
tests/resolverkit.py, its test CA trusted), with the filters on duration and upload date, the
configured user agent, and the health limits on what discover lists. The starter's 4 queries
and the channel list 13 videos: 1 twice, 4 filtered out, 3 past the channel's max_videos."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
import pytest
import yaml

from conftest import SCRIPT, build_json, vlcorpus
from resolverkit import shared
from youtubekit import youtube_site
from pipeline.corpus.storage import Corpus

pytestmark = pytest.mark.slow

CHANNEL = "https://www.youtube.com/@SomeRealtor/videos"
AGENT = "vlcorpus-tests/1.0 (sources build)"
# Of the saved answers (tests/data/ytdlp/youtube.json): each kept video's source and query.
KEPT = {"Bk7tire01aQ": "how to change a bike tire", "Rp2plant1xZ": "how to change a bike tire",
        "Sd4bread01c": "how to make sourdough bread", "Kn0tbowl02g": "how to tie a bowline knot",
        "Rp2plant02h": "how to repot a houseplant",
        "Ap7tour01aA": CHANNEL, "Ap7tour02bB": CHANNEL, "Ap7tour03cC": CHANNEL}
DROPPED = {"too_short": 1, "too_long": 1, "uploaded_before_range": 1, "uploaded_after_range": 1}


def test_youtube_searches_and_a_channel_are_listed_filtered_and_judged(tmp_path, monkeypatch):
    done = vlcorpus("init", "my_corpus", "--style", "howto100m", cwd=tmp_path, timeout=120, launcher=(SCRIPT,))
    assert done.returncode == 0, done.stderr[-3000:]
    config = tmp_path / "my_corpus.yaml"
    starter = yaml.safe_load(config.read_text())
    search = starter["sources"][0]
    queries = [q.format(task=t) for q in search["queries"] for t in search["vars"]["task"]]
    starter["sources"].append({"type": "playlist", "name": "channels", "urls": [CHANNEL], "max_videos": 3})
    download = starter["download"]
    download.pop("preset")  # yt-dlp's `-t sleep` pacing is for YouTube itself
    download |= {"rate_limit": None, "user_agent": AGENT,
                 # YouTube lists a video's age only ("3 years ago"): yt-dlp dates it on request.
                 "extractor_args": ["youtubetab:approximate_date"]}
    today = datetime.now(UTC).date()
    starter["filters"] |= {"upload_date_after": str(today - timedelta(days=8 * 365)),
                           "upload_date_before": str(today - timedelta(days=120))}
    starter["health"] = {"min_found_videos": 14}
    config.write_text(yaml.safe_dump(starter, sort_keys=False))
    root = tmp_path / starter["root"]

    with youtube_site(tmp_path) as youtube, shared(tmp_path / "resolver.json", monkeypatch,
                                                   hosts=youtube.hosts, trusted=youtube.bundle):
        code, summary, stderr = build_json(config, "--until", "discover")
        discover = summary["stages"]["discover"]
        assert (discover["found"], discover["duplicates"], discover["added"]) == (13, 1, 8), discover
        assert discover["dropped"] == DROPPED
        # Found fewer than health.min_found_videos: unhealthy, its work committed all the same.
        assert code == 1 and not summary["health"]["healthy"]
        assert summary["health"]["problems"] == ["the sources listed 13 videos (at least 14 expected)"]
        assert "the sources listed 13 videos (at least 14 expected)" in " ".join(stderr.split())
        assert sorted(youtube.searched()) == sorted(queries)
        agents = {r.headers.get("User-Agent") for r in youtube.requests}
        assert agents == {AGENT}, agents

        videos = {r["video_id"]: r for r in Corpus(str(root)).read("videos").to_pylist()}
        assert set(videos) == {f"youtube-{v}" for v in KEPT}
        for ident, query in KEPT.items():
            row = videos[f"youtube-{ident}"]
            assert row["url"] == f"https://www.youtube.com/watch?v={ident}" and row["extractor"] == "youtube"
            assert (row["source"], row["query"]) == ("playlist" if query == CHANNEL else "search", query)
            assert row["title"] and 30 <= row["duration_s"] <= 2000
            assert today - timedelta(days=8 * 365) <= row["upload_date"] <= today - timedelta(days=120)
        assert videos["youtube-Bk7tire01aQ"]["uploader"] == "Trail Bike Tips"
        assert videos["youtube-Sd4bread01c"]["upload_date"].year == today.year - 5

        # The same sources again, as one stage: every video known, none new.
        starter["health"] = {"min_found_videos": 13, "min_new_videos": 1}
        config.write_text(yaml.safe_dump(starter, sort_keys=False))
        code, summary, _ = build_json(config, "--stage", "discover")
    assert set(summary["stages"]) == {"discover"}
    assert (summary["stages"]["discover"]["found"], summary["stages"]["discover"]["added"]) == (13, 0)
    assert code == 1 and summary["health"]["problems"] == ["discover added 0 new videos (at least 1 expected)"]
    assert sorted(youtube.searched()[len(queries):]) == sorted(queries)
    assert Corpus(str(root)).read("videos").num_rows == len(KEPT)
