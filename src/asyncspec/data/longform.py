"""A long real-speech-like recording for the on-demand benchmarks: public-domain prose (the US
Declaration of Independence, 1776, and Lincoln's Gettysburg Address, 1863) spoken by espeak-ng,
alternating voices by paragraph, repeated with other voices until it lasts at least `min_seconds`."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile

from asyncspec.audio import SAMPLE_RATE, load_audio
from asyncspec.errors import InputError

DECLARATION = (
    "When in the Course of human events, it becomes necessary for one people to dissolve the political bands "
    "which have connected them with another, and to assume among the powers of the earth, the separate and "
    "equal station to which the Laws of Nature and of Nature's God entitle them, a decent respect to the "
    "opinions of mankind requires that they should declare the causes which impel them to the separation.",
    "We hold these truths to be self-evident, that all men are created equal, that they are endowed by their "
    "Creator with certain unalienable Rights, that among these are Life, Liberty and the pursuit of Happiness. "
    "That to secure these rights, Governments are instituted among Men, deriving their just powers from the "
    "consent of the governed. That whenever any Form of Government becomes destructive of these ends, it is "
    "the Right of the People to alter or to abolish it, and to institute new Government, laying its "
    "foundation on such principles and organizing its powers in such form, as to them shall seem most likely "
    "to effect their Safety and Happiness.",
    "Prudence, indeed, will dictate that Governments long established should not be changed for light and "
    "transient causes; and accordingly all experience hath shewn, that mankind are more disposed to suffer, "
    "while evils are sufferable, than to right themselves by abolishing the forms to which they are "
    "accustomed. But when a long train of abuses and usurpations, pursuing invariably the same Object evinces "
    "a design to reduce them under absolute Despotism, it is their right, it is their duty, to throw off such "
    "Government, and to provide new Guards for their future security.",
    "Such has been the patient sufferance of these Colonies; and such is now the necessity which constrains "
    "them to alter their former Systems of Government. The history of the present King of Great Britain is a "
    "history of repeated injuries and usurpations, all having in direct object the establishment of an "
    "absolute Tyranny over these States. To prove this, let Facts be submitted to a candid world.",
    "He has refused his Assent to Laws, the most wholesome and necessary for the public good. He has "
    "forbidden his Governors to pass Laws of immediate and pressing importance, unless suspended in their "
    "operation till his Assent should be obtained; and when so suspended, he has utterly neglected to attend "
    "to them. He has refused to pass other Laws for the accommodation of large districts of people, unless "
    "those people would relinquish the right of Representation in the Legislature, a right inestimable to "
    "them and formidable to tyrants only.",
    "He has called together legislative bodies at places unusual, uncomfortable, and distant from the "
    "depository of their public Records, for the sole purpose of fatiguing them into compliance with his "
    "measures. He has dissolved Representative Houses repeatedly, for opposing with manly firmness his "
    "invasions on the rights of the people. He has refused for a long time, after such dissolutions, to "
    "cause others to be elected.",
    "He has endeavoured to prevent the population of these States; for that purpose obstructing the Laws for "
    "Naturalization of Foreigners; refusing to pass others to encourage their migrations hither, and raising "
    "the conditions of new Appropriations of Lands. He has obstructed the Administration of Justice, by "
    "refusing his Assent to Laws for establishing Judiciary powers. He has made Judges dependent on his Will "
    "alone, for the tenure of their offices, and the amount and payment of their salaries.",
    "He has erected a multitude of New Offices, and sent hither swarms of Officers to harrass our people, and "
    "eat out their substance. He has kept among us, in times of peace, Standing Armies without the Consent of "
    "our legislatures. He has affected to render the Military independent of and superior to the Civil power.",
    "In every stage of these Oppressions We have Petitioned for Redress in the most humble terms: Our repeated "
    "Petitions have been answered only by repeated injury. A Prince whose character is thus marked by every "
    "act which may define a Tyrant, is unfit to be the ruler of a free people.",
    "Nor have We been wanting in attentions to our Brittish brethren. We have warned them from time to time of "
    "attempts by their legislature to extend an unwarrantable jurisdiction over us. We have reminded them of "
    "the circumstances of our emigration and settlement here. We have appealed to their native justice and "
    "magnanimity, and we have conjured them by the ties of our common kindred to disavow these usurpations, "
    "which would inevitably interrupt our connections and correspondence. They too have been deaf to the "
    "voice of justice and of consanguinity.",
    "We, therefore, the Representatives of the united States of America, in General Congress, Assembled, "
    "appealing to the Supreme Judge of the world for the rectitude of our intentions, do, in the Name, and by "
    "Authority of the good People of these Colonies, solemnly publish and declare, That these United Colonies "
    "are, and of Right ought to be Free and Independent States. And for the support of this Declaration, "
    "with a firm reliance on the protection of divine Providence, we mutually pledge to each other our Lives, "
    "our Fortunes and our sacred Honor.",
)
GETTYSBURG = (
    "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in "
    "Liberty, and dedicated to the proposition that all men are created equal. Now we are engaged in a great "
    "civil war, testing whether that nation, or any nation so conceived and so dedicated, can long endure. "
    "We are met on a great battle-field of that war. We have come to dedicate a portion of that field, as a "
    "final resting place for those who here gave their lives that that nation might live. It is altogether "
    "fitting and proper that we should do this.",
    "But, in a larger sense, we can not dedicate, we can not consecrate, we can not hallow this ground. The "
    "brave men, living and dead, who struggled here, have consecrated it, far above our poor power to add or "
    "detract. The world will little note, nor long remember what we say here, but it can never forget what "
    "they did here. It is for us the living, rather, to be dedicated here to the unfinished work which they "
    "who fought here have thus far so nobly advanced. It is rather for us to be here dedicated to the great "
    "task remaining before us, that this nation, under God, shall have a new birth of freedom, and that "
    "government of the people, by the people, for the people, shall not perish from the earth.",
)
PARAGRAPHS = DECLARATION + GETTYSBURG
VOICE_ROUNDS = (("en-us", "en-gb"), ("en-gb-x-rp", "en-us"), ("en-gb-scotland", "en-029"))
PAUSE_S = 0.6  # silence between paragraphs, as a reader breathes


def long_recording(path: Path, min_seconds: float = 600.0, words_per_minute: int = 150) -> Path:
    """A WAV of at least `min_seconds` (16 kHz mono); reused when it is already there and long enough."""
    if path.is_file() and soundfile.info(str(path)).duration >= min_seconds:
        return path
    if shutil.which("espeak-ng") is None:
        raise InputError("espeak-ng is not installed (apt-get install espeak-ng)")
    pieces, total = [], 0.0
    pause = np.zeros(int(PAUSE_S * SAMPLE_RATE), dtype=np.float32)
    with tempfile.TemporaryDirectory() as scratch:
        for voices in VOICE_ROUNDS:
            for index, text in enumerate(PARAGRAPHS):
                spoken = _speak(text, voices[index % len(voices)], words_per_minute, Path(scratch) / "p.wav")
                pieces += [spoken, pause]
                total += (len(spoken) + len(pause)) / SAMPLE_RATE
            if total >= min_seconds:
                break
    if total < min_seconds:
        raise InputError(f"the synthesised recording lasts {total:.0f} s, less than {min_seconds:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
    return path


def _speak(text: str, voice: str, words_per_minute: int, scratch: Path) -> np.ndarray:
    command = ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(scratch), text]
    subprocess.run(command, check=True, capture_output=True)
    return load_audio(scratch)


def librivox_recording(path: Path, min_seconds: float = 600.0) -> Path:
    """Real speech: the five LibriVox clips (24.7 s) joined in successive orders until the recording
    lasts at least `min_seconds`, so every 30 s window is continuous read speech by one speaker."""
    from itertools import permutations

    from asyncspec.data.librivox import librivox_clips

    if path.is_file() and soundfile.info(str(path)).duration >= min_seconds:
        return path
    clips = [load_audio(clip.path) for clip in librivox_clips()]
    pieces, total = [], 0.0
    for order in permutations(range(len(clips))):
        pieces += [clips[i] for i in order]
        total += sum(len(clips[i]) for i in order) / SAMPLE_RATE
        if total >= min_seconds:
            break
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
    return path
