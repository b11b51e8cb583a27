"""A video's scenes: planned from its random generator (a room, an object, a colour and what
is said about them), then laid out on the timeline with the narration's samples."""

from __future__ import annotations

import array
import random
from dataclasses import dataclass, field

from pipeline.demo.model import Scene, Sentence, Word
from pipeline.demo.pictures import COLOURS, FPS, OBJECT_SHAPES
from pipeline.demo.sound import Speech, music
from pipeline.demo.speech import SAMPLE_RATE

FRAME_MS = 1000 // FPS
MIN_SCENE_MS = 3000
MIN_VIDEO_MS, MAX_VIDEO_MS = 15000, 30000

ROOMS = ["living room", "kitchen", "bedroom", "hallway", "study", "dining room", "bathroom"]

ROOM_SENTENCES = [
    "Now we walk into the {room} of this apartment.",
    "Next, let me show you around the {room} here.",
    "This part of the tour takes us to the {room}.",
    "We are standing in the {room} right now.",
]
OBJECT_SENTENCES = [
    "Here you can see {a} {colour} {object} against the wall.",
    "In the middle of the room there is {a} {colour} {object}.",
    "Take a close look at this {colour} {object} over here.",
    "This {colour} {object} is one of my favorite things.",
    "The {object} in this room is painted bright {colour}.",
]
SCENE_SENTENCES = [
    "In the {room} we have {a} {colour} {object} next to the door.",
    "The {room} has {a} {colour} {object} in the corner.",
]


@dataclass
class ScenePlan:
    room: str
    object: str
    colour: str
    texts: list[str]
    lead_ms: int
    tail_ms: int
    pauses_ms: list[int]  # silence after each sentence but the last
    speeches: list[Speech] = field(default_factory=list)  # filled in once synthesized


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _plan_scene(rng: random.Random, room: str, obj: str, colour: str) -> ScenePlan:
    slots = {"room": room, "object": obj, "colour": colour, "a": _article(colour)}
    if rng.random() < 0.5:
        texts = [rng.choice(ROOM_SENTENCES).format(**slots), rng.choice(OBJECT_SENTENCES).format(**slots)]
    else:
        texts = [rng.choice(SCENE_SENTENCES).format(**slots)]
    texts[0] = texts[0][0].upper() + texts[0][1:]
    return ScenePlan(
        room=room,
        object=obj,
        colour=colour,
        texts=texts,
        lead_ms=rng.randrange(300, 520, 20),
        tail_ms=rng.randrange(500, 720, 20),
        pauses_ms=[rng.randrange(350, 470, 10) for _ in texts[1:]],
    )


def _scene_ms(plan: ScenePlan, intro_ms: int) -> int:
    """Scene length: lead, speech and tail, at least MIN_SCENE_MS, rounded up to whole frames."""
    speech = sum(len(s.samples) for s in plan.speeches) * 1000 // SAMPLE_RATE
    total = max(intro_ms + plan.lead_ms + speech + sum(plan.pauses_ms) + plan.tail_ms, MIN_SCENE_MS)
    return -(-total // FRAME_MS) * FRAME_MS


def candidate_scenes(rng: random.Random) -> list[ScenePlan]:
    """Six scenes with distinct rooms and objects; the video uses the first 3 to 6."""
    rooms = rng.sample(ROOMS, 6)
    objects = rng.sample(sorted(OBJECT_SHAPES), 6)
    colours: list[str] = []
    for _ in range(6):
        colours.append(rng.choice([c for c in COLOURS if not colours or c != colours[-1]]))
    return [_plan_scene(rng, r, o, c) for r, o, c in zip(rooms, objects, colours, strict=True)]


def scene_count(rng: random.Random, plans: list[ScenePlan], music_ms: int) -> int:
    """A random 3 to 6, moved as little as needed to keep the video in 15-30 s."""
    lengths = [_scene_ms(p, music_ms if i == 0 else 0) for i, p in enumerate(plans)]
    n = rng.randint(3, 6)
    while n > 3 and sum(lengths[:n]) > MAX_VIDEO_MS:
        n -= 1
    while n < 6 and sum(lengths[:n]) < MIN_VIDEO_MS:
        n += 1
    if not MIN_VIDEO_MS <= sum(lengths[:n]) <= MAX_VIDEO_MS:
        raise RuntimeError(f"demo video length {sum(lengths[:n])} ms is outside 15-30 s")
    return n


def _samples_to_s(samples: int) -> float:
    return round(samples * 1000 / SAMPLE_RATE) / 1000


def lay_out(plans: list[ScenePlan], music_ms: int) -> tuple[list[Scene], array.array]:
    """Place every sentence on the video timeline; returns scenes and the narration track."""
    audio = array.array("h")
    scenes = []
    scene_start_ms = 0
    for index, plan in enumerate(plans):
        intro_ms = music_ms if index == 0 else 0
        length_ms = _scene_ms(plan, intro_ms)
        scene_start = scene_start_ms * SAMPLE_RATE // 1000
        if intro_ms:
            audio.extend(music(intro_ms * SAMPLE_RATE // 1000))
        cursor = scene_start + (intro_ms + plan.lead_ms) * SAMPLE_RATE // 1000
        sentences = []
        for speech, pause_ms in zip(plan.speeches, plan.pauses_ms + [0], strict=True):
            audio.extend([0] * (cursor - len(audio)))
            audio.extend(speech.samples)
            words = [Word(w, _samples_to_s(cursor + a), _samples_to_s(cursor + b)) for w, a, b in speech.words]
            sentences.append(Sentence(speech.text, words[0].start_s, words[-1].end_s, words))
            cursor += len(speech.samples) + pause_ms * SAMPLE_RATE // 1000
        scene_end_ms = scene_start_ms + length_ms
        scene = Scene(
            index=index,
            start_s=scene_start_ms / 1000,
            end_s=scene_end_ms / 1000,
            room=plan.room,
            object=plan.object,
            colour=plan.colour,
            shape=OBJECT_SHAPES[plan.object],
            sentences=sentences,
        )
        scenes.append(scene)
        scene_start_ms = scene_end_ms
    audio.extend([0] * (scene_start_ms * SAMPLE_RATE // 1000 - len(audio)))
    return scenes, audio
