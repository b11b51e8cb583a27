"""Subtitle files (WebVTT, SRT) into timed cues, read with webvtt-py.

A well-formed file is read by webvtt-py as it is. Real files break it in many small ways: BOMs
and line ends (dealt with while decoding), hour-less or one-digit timestamps, cues without a
blank line between them, blank lines inside cues, non-standard header blocks, arrows in cue
text. webvtt-py refuses some of those files and silently misreads others, so they are first
repaired: rewritten into a file it reads as intended (_repaired).
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import webvtt
from webvtt.errors import MalformedCaptionError, MalformedFileError

from pipeline.errors import BadInputError

log = logging.getLogger(__name__)

Format = Literal["vtt", "srt"]

# Timestamps as real files write them: hours optional, fields of one digit (MS Teams), a comma
# (SRT) or no fraction at all.
_TS = r"(?:\d+:)?\d{1,2}:\d{1,2}(?:[.,]\d+)?"
_TS_PARTS = re.compile(r"(?:(\d+):)?(\d{1,2}):(\d{1,2})(?:[.,](\d+))?")
_TIMING = re.compile(rf"^[ \t]*({_TS})[ \t]*-->[ \t]*({_TS})(?=\s|$)", re.MULTILINE)
# A line that means to be a timing (digits before the arrow), readable or not; any other line
# with an arrow inside a cue is text (e.g. an HTML comment, "<!-- ... -->").
_TIMING_LIKE = re.compile(r"^[ \t]*[\d:.,]+[ \t]*-->")
# A timestamp inside cue text, e.g. YouTube's word timings (``<00:00:01.360>``).
INLINE_TIMESTAMP = re.compile(r"<((?:\d+:)?\d{1,2}:\d{1,2}\.\d+)>")
# Blocks that hold no cue text, wherever they are.
_NON_CUE_BLOCK = re.compile(r"^(?:NOTE|STYLE|REGION)(?:[ \t]|$)")

# Larger files are refused: parsing takes about 1 s and 50 MB of memory per MB of captions,
# and real ones stay far below (ten hours of YouTube auto captions are a few MB).
MAX_SUBTITLE_BYTES = 16 * 1024 * 1024


def check_size(n_bytes: int) -> None:
    """BadInputError for a subtitle file over MAX_SUBTITLE_BYTES."""
    if n_bytes > MAX_SUBTITLE_BYTES:
        raise BadInputError(f"subtitle file is {n_bytes / 2**20:.1f} MB, over the "
                            f"{MAX_SUBTITLE_BYTES / 2**20:.0f} MB limit")


@dataclass(frozen=True)
class Cue:
    """One cue of a file: its span in seconds and its text."""

    start_s: float
    end_s: float
    text: str  # the raw payload: lines joined by "\n", tags kept



def decode_subtitle_bytes(data: bytes) -> str:
    """Text of a subtitle file: by its BOM, else UTF-8, else cp1252 (latin-1 as a last resort),
    with LF line ends and no NULs."""
    boms = (
        (b"\xff\xfe\x00\x00", "utf-32-le"), (b"\x00\x00\xfe\xff", "utf-32-be"),
        (b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"),
    )
    for bom, encoding in boms:  # UTF-32 LE first: its BOM starts with UTF-16 LE's
        if data.startswith(bom):
            # A BOM settles the encoding; a stray bad byte should not cost the whole file.
            return _clean_text_file(data[len(bom):].decode(encoding, errors="replace"))
    for encoding in ("utf-8", "cp1252"):
        try:
            return _clean_text_file(data.decode(encoding))
        except UnicodeDecodeError:
            continue
    return _clean_text_file(data.decode("latin-1"))  # every byte is a latin-1 character


def _clean_text_file(text: str) -> str:
    # NULs are what is left of UTF-16 without a BOM read as 8-bit text.
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    return text.removeprefix("\ufeff")


def read_cues(source: str | Path | bytes, fmt: Format | None = None) -> list[Cue]:
    """Cues of a WebVTT or SRT file, in file order. ``source`` is a path, the file's bytes, or
    its text (a one-line string naming an existing file is read as a path). ``fmt`` None:
    detected. Raises BadInputError when the text is not subtitles or no cue can be read."""
    text = _source_text(source)
    if not text.strip():
        raise BadInputError("subtitle file is empty")
    fmt = fmt or _detect_format(text)
    captions = _as_is(text, fmt)
    if captions is None:  # not well-formed: repaired, then read
        repaired, count = _repaired(text, fmt)
        if not count:
            return []
        try:
            captions = _webvtt(repaired, fmt, strict=False)
        except (MalformedFileError, MalformedCaptionError) as exc:
            raise BadInputError(f"unreadable {fmt} subtitles: {exc}") from None
    cues = []
    for caption in captions:
        start = caption.start_time.in_milliseconds() / 1000
        end = caption.end_time.in_milliseconds() / 1000
        if end < start:
            log.warning("dropped a cue that ends before it starts: %s --> %s",
                        caption.start, caption.end)
            continue
        cues.append(Cue(start, end, caption.raw_text))
    return cues


def _as_is(text: str, fmt: Format) -> list[webvtt.Caption] | None:
    """Captions of a well-formed file, read by webvtt-py as it is; None when webvtt-py refuses
    the file, or would read it otherwise than its repair does (see _repaired)."""
    blocks = re.split(r"\n{2,}", text.rstrip("\n"))
    if fmt == "srt":
        well_formed = all(_SRT_CUE.fullmatch(block) for block in blocks)
    else:
        well_formed = _vtt_blocks_are_cues(blocks)
    if not well_formed:
        return None
    try:
        captions = _webvtt(text, fmt, strict=True)
    except (MalformedFileError, MalformedCaptionError):
        return None
    # Each arrow must be the timing line of a cue webvtt-py read, and one _repaired reads as a
    # timing too: webvtt-py skips a cue whose timing it cannot read, or takes it as a NOTE's.
    if fmt == "vtt" and not text.count("-->") == len(captions) == len(_TIMING.findall(text)):
        return None
    return captions


# SRT by the book: index, timing (hh:mm:ss,mmm), lines of text, blank lines between cues.
# webvtt-py's SRT reader has no strict mode and reads other SRT otherwise than _repaired: an
# hour-less timing starts no cue, "07,5" is 5 ms, a timing after no blank line stays text.
_SRT_TIME = r"[0-9]{2}:[0-5][0-9]:[0-5][0-9],[0-9]{3}"
_SRT_CUE = re.compile(rf"[0-9]+\n{_SRT_TIME} --> {_SRT_TIME}(?:\n(?![^\n]*-->)[^\n]*\S[^\n]*)*")


def _vtt_blocks_are_cues(blocks: list[str]) -> bool:
    """Whether every block (lines up to a blank line) after the first cue is a cue or a NOTE,
    STYLE or REGION block. webvtt-py drops any other block, where _repaired keeps it as text of
    the cue before (a blank line inside a cue), or an identifier line with inline timestamps."""
    seen_cue = "-->" in blocks[0]
    for block in blocks[1:]:
        lines = block.split("\n", 2)
        if "-->" in lines[0]:
            seen_cue = True
        elif len(lines) > 1 and "-->" in lines[1]:
            if INLINE_TIMESTAMP.search(lines[0]):
                return False
            seen_cue = True
        elif seen_cue and not _NON_CUE_BLOCK.match(lines[0]):
            return False
    return True


def _webvtt(text: str, fmt: Format, strict: bool) -> list[webvtt.Caption]:
    if fmt == "vtt":
        return webvtt.from_string(text, strict=strict).captions
    return webvtt.from_buffer(io.StringIO(text), format="srt").captions  # (no strict mode)


def _source_text(source: str | Path | bytes) -> str:
    if isinstance(source, bytes):
        check_size(len(source))
        return decode_subtitle_bytes(source)
    if isinstance(source, Path) or _names_file(source):
        check_size(Path(source).stat().st_size)
        return decode_subtitle_bytes(Path(source).read_bytes())
    check_size(len(source))
    return _clean_text_file(source)


def _names_file(text: str) -> bool:
    try:
        return "\n" not in text and "\r" not in text and Path(text).is_file()
    except (OSError, ValueError):  # too long for a path, or a NUL in it: text, not a path
        return False


def _detect_format(text: str) -> Format:
    if text.lstrip().startswith("WEBVTT"):
        return "vtt"
    timing = _TIMING.search(text)
    if timing is None:
        raise BadInputError("not a subtitle file: no WEBVTT header and no cue timings "
                            f"(hh:mm:ss.mmm --> hh:mm:ss.mmm); it starts {text[:40]!r}")
    before = text[:timing.start()].rstrip("\n").rsplit("\n", 1)[-1]
    return "srt" if "," in timing.group(0) or before.strip().isdigit() else "vtt"


def timestamp_ms(timestamp: str) -> int | None:
    """A timestamp as real files write it (see _TS) in milliseconds; None when it is no valid
    time."""
    parts = _TS_PARTS.fullmatch(timestamp)
    if parts is None or int(parts[2]) > 59 or int(parts[3]) > 59:
        return None
    hours, minutes, seconds, fraction = parts.groups()
    # A fraction is read like a decimal: ".5" is 500 ms, extra digits are dropped.
    millis = int((fraction or "0")[:3].ljust(3, "0"))
    return ((int(hours or 0) * 60 + int(minutes)) * 60 + int(seconds)) * 1000 + millis


def _format_ms(ms: int, separator: str) -> str:
    seconds, millis = divmod(ms, 1000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{separator}{millis:03d}"


def _repaired(text: str, fmt: Format) -> tuple[str, int]:
    """``text`` rewritten as a file webvtt-py reads as intended, and its number of cues: the
    repair of a file _as_is does not take.

    Only cue timings and cue text survive: headers ("Kind:", "Style:", "##", X-TIMESTAMP-MAP),
    NOTE/STYLE/REGION blocks and cue identifiers are left out, timestamps are written in full
    (hh:mm:ss.mmm), and every cue is followed by one blank line. A timing line always starts a
    new cue, even with no blank line before it. A line after a blank line that starts no cue
    still belongs to the cue before: files saved with trailing whitespace stripped turn
    YouTube's " " placeholder lines into blank lines, which would end the cue early and lose
    the words after it; the blank comes back as " "."""
    lines = text.split("\n")
    cues: list[tuple[int, int, list[str]]] = []
    bad: list[str] = []
    payload: list[str] | None = None  # the current cue's lines; None before any cue
    after_blank = False
    in_other_block = False
    for i, line in enumerate(lines):
        if "-->" in line and (payload is None or _TIMING_LIKE.match(line)):
            timing = _TIMING.match(line)
            times = (timestamp_ms(timing[1]), timestamp_ms(timing[2])) if timing else None
            if times is None or None in times:
                bad.append(line.strip())
                payload = None  # the block's text belongs to no cue
                continue
            payload = []
            cues.append((times[0], times[1], payload))
            after_blank = in_other_block = False
            continue
        # An arrow in cue text would read as a timing to webvtt-py; its entity reads back as it.
        line = line.replace("-->", "--&gt;")
        if not line:
            after_blank = True
            in_other_block = False
            continue
        if payload is None or in_other_block:
            continue
        starts_cue = i + 1 < len(lines) and "-->" in lines[i + 1]
        if after_blank:
            if starts_cue and not INLINE_TIMESTAMP.search(line):
                continue  # a cue identifier
            if _NON_CUE_BLOCK.match(line):
                in_other_block = True
                continue
            payload.append(" ")
            after_blank = False
        elif fmt == "srt" and starts_cue and line.strip().isdigit():
            continue  # an SRT index with no blank line before it
        payload.append(line)
    if bad:
        log.warning("skipped %d cue(s) with unreadable timings, first: %r", len(bad), bad[0])
        if not cues:
            raise BadInputError(f"no readable cue timings, e.g. {bad[0]!r}")
    if fmt == "srt":
        # webvtt-py's SRT reader ends a cue at a whitespace-only line and drops cues without text.
        cues = [(start, end, kept) for start, end, body in cues
                if (kept := [line for line in body if line.strip()])]
    separator = "." if fmt == "vtt" else ","
    blocks = [
        ("" if fmt == "vtt" else f"{n}\n")
        + f"{_format_ms(start, separator)} --> {_format_ms(end, separator)}\n"
        + "".join(f"{line}\n" for line in body)
        for n, (start, end, body) in enumerate(cues, start=1)
    ]
    return ("WEBVTT\n\n" if fmt == "vtt" else "") + "\n".join(blocks), len(blocks)
