"""Offline demo corpus: narrated "room tour" videos with captions, served over HTTP.

``make_demo_media(out_dir, n_videos, seed)`` writes, deterministically from ``seed``::

    media/tour-<i>.mp4         H.264 + AAC, 320x240, 25 fps, 15-30 s, 3-6 scenes
    media/broken.mp4           the first 30 % of a remuxed tour-0 (no moov atom: unreadable)
    subs/tour-<i>.en.vtt       author-style captions: punctuated, about one sentence a cue
    subs/tour-<i>.auto.en.vtt  YouTube auto-caption layout as yt-dlp saves it (rolling lines)
    pages/tour-<i>.html        one <video> with its <source> and two caption <track>s
    pages/broken.html          points at media/broken.mp4
    pages/gone.html            points at media/gone.mp4, which does not exist (HTTP 404)
    index.html                 links every page
    manifest.json              ground truth: scenes, objects, sentences and word timings

Each scene shows one object as a big coloured shape (a red sofa is a red rectangle, a blue
lamp a blue circle, ...) while a voice says one or two sentences about it, so pictures match
what is said. Speech comes from libespeak-ng (the library behind the espeak-ng command),
called through ctypes: one synthesis per sentence keeps natural prosody for ASR, and the
library's word events give each word's exact sample offset, so word timings in the captions
and the manifest are those of the audio (to the sample, then rounded to the millisecond).

Caption tracks: both tracks sit on the same page. yt-dlp's generic extractor keys subtitles by
``srclang``, so the author track is ``en`` and the auto-style track is ``en-auto``; asking
yt-dlp for ``subtitleslangs: ["en"]`` fetches only the author track, ``["en-auto"]`` only the
auto one. The generic extractor has no notion of automatic captions, so a consumer that wants
to treat ``en-auto`` as auto captions must do so by this key (or by the rolling layout).

``serve_demo(site_dir)`` serves the directory on 127.0.0.1 (a random free port by default)
and writes ``urls.txt`` with every page URL for that server, broken and gone pages included.
The server does not answer HTTP Range requests with 206; yt-dlp does not need it.

Command line: ``vlcorpus demo-site make DIR --videos N --seed S [--quiet]`` and
``vlcorpus demo-site serve DIR [--host H] [--port P]``.

Modules, in the order a video is made:
- model.py: the site, its videos, scenes, sentences and words; manifest.json read back
- scenes.py: scenes planned from the seed, then laid out on the timeline with the narration
- speech.py: libespeak-ng through ctypes, one fresh process per video
- sound.py: a spoken sentence trimmed to its sound with each word's samples; the intro music
- pictures.py: frame size and rate, colours, object shapes, one PPM still per scene
- captions.py: author and YouTube-auto-style WebVTT; pages.py: the HTML pages
- encode.py: the mp4 and the broken copy, through media.process.run_ffmpeg
- site.py: make_demo_media; serve.py: serve_demo
"""

from pipeline.demo.captions import author_vtt, auto_vtt
from pipeline.demo.model import BadPage, DemoSite, DemoVideo, Scene, Sentence, Word
from pipeline.demo.pictures import COLOURS, HEIGHT, OBJECT_SHAPES, WIDTH
from pipeline.demo.serve import serve_demo
from pipeline.demo.site import check_tools, make_demo_media

__all__ = ["COLOURS", "HEIGHT", "OBJECT_SHAPES", "WIDTH", "BadPage", "DemoSite", "DemoVideo", "Scene",
           "Sentence", "Word", "author_vtt", "auto_vtt", "check_tools", "make_demo_media", "serve_demo"]
