"""The scripts of the long-form evaluation set (`longform_set.py` builds them): which voice says
what, in order, and the silence after each piece.

Every text is in the public domain: Dickens (A Tale of Two Cities, 1859; A Christmas Carol, 1843),
Austen (Emma, 1815; Persuasion, 1817; Sense and Sensibility, 1811, in the LibriVox reading),
Wilde (The Importance of Being Earnest, 1895, Act I, the lines only) and Shakespeare (Sonnet 18,
Hamlet, Macbeth). None is the development set's Pride and Prejudice. The real recordings are
Debian's pocketsphinx-testdata: a LibriVox reader, CMU's card-game and command speakers.

A voice is "slt" or "kal" (Festival's HTS and diphone voices), "espeak:<voice>" (espeak-ng), or
"file:<path under the pocketsphinx test data>" for a real recording, whose text is its own
transcription (so `text` stays empty there). Pauses run from 0.3 s (between dialogue lines) to
4 s (a scene break): Whisper's no-speech and seek rules meet both.
"""

from __future__ import annotations

from dataclasses import dataclass

LIBRIVOX = "file:librivox/sense_and_sensibility_01_austen_64kb-"


@dataclass(frozen=True)
class Piece:
    voice: str
    text: str  # what is spoken; empty for a "file:" recording (its transcription is used)
    pause_s: float  # silence after it


READERS = (
    Piece(
        "slt",
        "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
        "it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had "
        "everything before us, we had nothing before us, we were all going direct to Heaven, we were all "
        "going direct the other way. In short, the period was so far like the present period, that some of "
        "its noisiest authorities insisted on its being received, for good or for evil, in the superlative "
        "degree of comparison only.",
        1.2,
    ),
    Piece(LIBRIVOX + "0870.wav", "", 0.4),
    Piece(LIBRIVOX + "0880.wav", "", 0.3),
    Piece(LIBRIVOX + "0890.wav", "", 3.5),
    Piece(
        "espeak:en-gb-x-rp",
        "There were a king with a large jaw and a queen with a plain face, on the throne of England; there "
        "were a king with a large jaw and a queen with a fair face, on the throne of France. In both countries "
        "it was clearer than crystal to the lords of the State preserves of loaves and fishes, that things in "
        "general were settled for ever.",
        0.8,
    ),
    Piece(
        "kal",
        "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to "
        "unite some of the best blessings of existence; and had lived nearly twenty-one years in the world "
        "with very little to distress or vex her. She was the youngest of the two daughters of a most "
        "affectionate, indulgent father; and had, in consequence of her sister's marriage, been mistress of "
        "his house from a very early period.",
        2.0,
    ),
    Piece(LIBRIVOX + "0920.wav", "", 0.5),
    Piece(LIBRIVOX + "0930.wav", "", 1.5),
    Piece(
        "espeak:en-us",
        "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own amusement, never "
        "took up any book but the Baronetage; there he found occupation for an idle hour, and consolation in "
        "a distressed one.",
        0.6,
    ),
    Piece(
        "slt",
        "Her mother had died too long ago for her to have more than an indistinct remembrance of her "
        "caresses; and her place had been supplied by an excellent woman as governess, who had fallen little "
        "short of a mother in affection.",
        0.5,
    ),
)

# Algernon (kal) and Lane (slt) alternate line by line; Jack (espeak) joins after a scene break.
_ALGERNON, _LANE, _JACK = "kal", "slt", "espeak:en-gb-x-rp"
DIALOGUE = (
    Piece("espeak:en-gb", "The Importance of Being Earnest. Act one. Morning room in Algernon's flat.", 1.5),
    Piece(_ALGERNON, "Did you hear what I was playing, Lane?", 0.4),
    Piece(_LANE, "I didn't think it polite to listen, sir.", 0.5),
    Piece(
        _ALGERNON,
        "I'm sorry for that, for your sake. I don't play accurately, any one can play accurately, but I play "
        "with wonderful expression. As far as the piano is concerned, sentiment is my forte. I keep science "
        "for Life.",
        0.3,
    ),
    Piece(_LANE, "Yes, sir.", 0.6),
    Piece(
        _ALGERNON,
        "And, speaking of the science of Life, have you got the cucumber sandwiches cut for Lady Bracknell?",
        0.4,
    ),
    Piece(_LANE, "Yes, sir.", 2.2),
    Piece(
        _ALGERNON,
        "Oh! By the way, Lane, I see from your book that on Thursday night, when Lord Shoreman and Mr. "
        "Worthing were dining with me, eight bottles of champagne are entered as having been consumed.",
        0.5,
    ),
    Piece(_LANE, "Yes, sir; eight bottles and a pint.", 0.7),
    Piece(
        _ALGERNON,
        "Why is it that at a bachelor's establishment the servants invariably drink the champagne? I ask "
        "merely for information.",
        0.4,
    ),
    Piece(
        _LANE,
        "I attribute it to the superior quality of the wine, sir. I have often observed that in married "
        "households the champagne is rarely of a first-rate brand.",
        0.3,
    ),
    Piece(_ALGERNON, "Good heavens! Is marriage so demoralising as that?", 0.5),
    Piece(
        _LANE,
        "I believe it is a very pleasant state, sir. I have had very little experience of it myself up to "
        "the present. I have only been married once. That was in consequence of a misunderstanding between "
        "myself and a young person.",
        1.0,
    ),
    Piece(_ALGERNON, "I don't know that I am much interested in your family life, Lane.", 0.4),
    Piece(_LANE, "No, sir; it is not a very interesting subject. I never think of it myself.", 0.6),
    Piece(_ALGERNON, "Very natural, I am sure. That will do, Lane, thank you.", 0.3),
    Piece(_LANE, "Thank you, sir.", 4.0),
    Piece(
        _ALGERNON,
        "Lane's views on marriage seem somewhat lax. Really, if the lower orders don't set us a good example, "
        "what on earth is the use of them? They seem, as a class, to have absolutely no sense of moral "
        "responsibility.",
        2.5,
    ),
    Piece(_LANE, "Mr. Ernest Worthing.", 1.0),
    Piece(_ALGERNON, "How are you, my dear Ernest? What brings you up to town?", 0.5),
    Piece(_JACK, "Oh, pleasure, pleasure! What else should bring one anywhere? Eating as usual, I see, Algy!", 0.6),
    Piece(
        _ALGERNON,
        "I believe it is customary in good society to take some slight refreshment at five o'clock. Where "
        "have you been since last Thursday?",
        0.4,
    ),
    Piece(_JACK, "In the country.", 0.5),
    Piece(_ALGERNON, "What on earth do you do there?", 0.6),
    Piece(
        _JACK,
        "When one is in town one amuses oneself. When one is in the country one amuses other people. It is "
        "excessively boring.",
        1.0,
    ),
)

CARDS = "file:cards/"
MIXED = (
    Piece(
        "slt",
        "Shall I compare thee to a summer's day? Thou art more lovely and more temperate: rough winds do "
        "shake the darling buds of May, and summer's lease hath all too short a date; sometime too hot the "
        "eye of heaven shines, and often is his gold complexion dimmed; and every fair from fair sometime "
        "declines, by chance or nature's changing course untrimmed.",
        2.5,
    ),
    Piece(CARDS + "001.wav", "", 0.8),
    Piece(CARDS + "002.wav", "", 1.2),
    Piece(CARDS + "003.wav", "", 0.6),
    Piece(CARDS + "004.wav", "", 1.5),
    Piece(CARDS + "005.wav", "", 3.0),
    Piece(
        "espeak:en-gb-scotland",
        "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the slings and "
        "arrows of outrageous fortune, or to take arms against a sea of troubles, and by opposing end them.",
        1.0,
    ),
    Piece("file:goforward.raw", "", 1.5),
    Piece("file:tidigits/dhd.2934z.raw", "", 2.0),
    Piece(
        "kal",
        "Marley was dead: to begin with. There is no doubt whatever about that. The register of his burial was "
        "signed by the clergyman, the clerk, the undertaker, and the chief mourner. Scrooge signed it: and "
        "Scrooge's name was good upon 'Change, for anything he chose to put his hand to. Old Marley was as "
        "dead as a door-nail.",
        4.0,
    ),
    Piece(
        "slt",
        "Tomorrow, and tomorrow, and tomorrow, creeps in this petty pace from day to day, to the last "
        "syllable of recorded time; and all our yesterdays have lighted fools the way to dusty death. Out, "
        "out, brief candle! Life's but a walking shadow, a poor player, that struts and frets his hour upon "
        "the stage, and then is heard no more. It is a tale told by an idiot, full of sound and fury, "
        "signifying nothing.",
        0.7,
    ),
    Piece(
        "espeak:en-029",
        "Scrooge knew he was dead? Of course he did. How could it be otherwise? Scrooge and he were partners "
        "for I don't know how many years.",
        1.8,
    ),
    Piece(
        "kal",
        "But thy eternal summer shall not fade, nor lose possession of that fair thou owest; nor shall Death "
        "brag thou wanderest in his shade, when in eternal lines to time thou growest: so long as men can "
        "breathe or eyes can see, so long lives this, and this gives life to thee.",
        0.5,
    ),
)

RECORDINGS = {"readers": READERS, "dialogue": DIALOGUE, "mixed": MIXED}
