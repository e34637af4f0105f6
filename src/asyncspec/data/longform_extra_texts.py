"""Five more long-form recordings (`--set longform-large`: these with the three of
`longform_texts.py`, about 2.5 times the words). One set of 1,150 words cannot tell a 0.3-point WER
difference from the few words any change of arithmetic moves, so quality comparisons between
precisions are run on this one.

Every text is in the public domain: Melville (Moby-Dick, 1851), Wells (The War of the Worlds,
1898), Stevenson (Treasure Island, 1883), Thoreau (Walden, 1854), Conan Doyle (A Study in Scarlet,
1887), Lincoln (the Gettysburg Address, 1863; the second inaugural, 1865), the Declaration of
Independence (1776), Carroll (Alice's Adventures in Wonderland, 1865), Poe (The Tell-Tale Heart,
1843), Twain (Adventures of Huckleberry Finn, 1884), Charlotte Bronte (Jane Eyre, 1847), Mary
Shelley (Frankenstein, 1818) and Aesop's fables, retold. What is spoken is the text given here, and
it is the reference; where it departs from an edition, the recording follows this text. The voices
are the ones `longform_texts.py` describes, plus espeak-ng's Lancaster, West Midlands and New York
accents and its female variant (`+f3`).
"""

from __future__ import annotations

from asyncspec.data.longform_texts import Piece

OPENINGS = (
    Piece(
        "slt",
        "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my "
        "purse, and nothing particular to interest me on shore, I thought I would sail about a little and see "
        "the watery part of the world. It is a way I have of driving off the spleen and regulating the "
        "circulation.",
        0.4,
    ),
    Piece(
        "espeak:en-gb-x-rp",
        "Whenever I find myself growing grim about the mouth; whenever it is a damp, drizzly November in my "
        "soul; then, I account it high time to get to sea as soon as I can.",
        1.5,
    ),
    Piece(
        "kal",
        "No one would have believed in the last years of the nineteenth century that this world was being "
        "watched keenly and closely by intelligences greater than man's and yet as mortal as his own; that as "
        "men busied themselves about their various concerns they were scrutinised and studied, perhaps almost "
        "as narrowly as a man with a microscope might scrutinise the transient creatures that swarm and "
        "multiply in a drop of water.",
        3.0,
    ),
    Piece(
        "espeak:en-us",
        "Squire Trelawney, Doctor Livesey, and the rest of these gentlemen having asked me to write down the "
        "whole particulars about Treasure Island, from the beginning to the end, keeping nothing back but the "
        "bearings of the island, and that only because there is still treasure not yet lifted, I take up my "
        "pen and go back to the time when my father kept the Admiral Benbow inn.",
        0.8,
    ),
    Piece(
        "espeak:en-gb-x-gbclan",
        "I remember him as if it were yesterday, as he came plodding to the inn door, his sea chest following "
        "behind him in a hand barrow; a tall, strong, heavy, nut brown man, his tarry pigtail falling over "
        "the shoulder of his soiled blue coat.",
        2.2,
    ),
    Piece(
        "slt",
        "When I wrote the following pages, or rather the bulk of them, I lived alone, in the woods, a mile from "
        "any neighbor, in a house which I had built myself, on the shore of Walden Pond, in Concord, "
        "Massachusetts, and earned my living by the labor of my hands only. I lived there two years and two "
        "months. At present I am a sojourner in civilized life again.",
        0.6,
    ),
    Piece(
        "kal",
        "I went to the woods because I wished to live deliberately, to front only the essential facts of life, "
        "and see if I could not learn what it had to teach, and not, when I came to die, discover that I had "
        "not lived.",
        1.0,
    ),
)

# Holmes (kal) and Watson (espeak:en-gb) meet; Stamford (slt) introduces them, a narrator (en-us+f3)
# sets the scene.
_HOLMES, _WATSON, _STAMFORD, _NARRATOR = "kal", "espeak:en-gb", "slt", "espeak:en-us+f3"
MEETING = (
    Piece(
        _NARRATOR,
        "A Study in Scarlet. The laboratory of the hospital, on a quiet afternoon. A tall young man is bending "
        "over a distant table, absorbed in his work.",
        1.6,
    ),
    Piece(_STAMFORD, "Doctor Watson, Mister Sherlock Holmes.", 0.4),
    Piece(_HOLMES, "How are you? You have been in Afghanistan, I perceive.", 0.5),
    Piece(_WATSON, "How on earth did you know that?", 0.3),
    Piece(
        _HOLMES,
        "Never mind. The question now is about blood. I have found a reagent which is precipitated by "
        "hemoglobin, and by nothing else. It is the most practical medical discovery for years. Do you not see "
        "that it gives us an infallible test for blood stains?",
        0.6,
    ),
    Piece(_WATSON, "It seems to be a very delicate test indeed.", 0.4),
    Piece(
        _HOLMES,
        "Criminal cases are continually hinging upon that one point. A man is suspected of a crime months "
        "perhaps after it has been committed. His linen or clothes are examined, and brownish stains "
        "discovered upon them. Are they blood stains, or mud stains, or rust stains? That is a question which "
        "has puzzled many an expert, and why? Because there was no reliable test. Now we have the test, and "
        "there will no longer be any difficulty.",
        0.5,
    ),
    Piece(_STAMFORD, "You seem to be a walking calendar of crime.", 0.4),
    Piece(_HOLMES, "We came here on business. My friend here wants to take diggings.", 0.3),
    Piece(
        _WATSON,
        "I am looking for rooms that I can share with someone. I keep a bull pup, and I object to rows, because "
        "my nerves are shaken, and I get up at all sorts of ungodly hours, and I am extremely lazy.",
        0.7,
    ),
    Piece(
        _HOLMES,
        "I have my eye on a suite in Baker Street which would suit us down to the ground. You don't mind the "
        "smell of strong tobacco, I hope? I generally have chemicals about, and occasionally do experiments. "
        "Would that annoy you?",
        0.4,
    ),
    Piece(_WATSON, "By no means.", 0.5),
    Piece(
        _HOLMES,
        "Let me see, what are my other shortcomings. I get in the dumps at times, and don't open my mouth for "
        "days on end. You must not think I am sulky when I do that. Just let me alone, and I'll soon be right.",
        3.0,
    ),
    Piece(
        _NARRATOR,
        "They agreed to meet at noon the next day and to look at the rooms together. On the way home, Watson "
        "asked his friend how the stranger had known about Afghanistan.",
        1.0,
    ),
    Piece(
        _STAMFORD,
        "That is just his little peculiarity. A good many people have wanted to know how he finds things out.",
        0.8,
    ),
)

SPEECHES = (
    Piece(
        "kal",
        "Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived "
        "in Liberty, and dedicated to the proposition that all men are created equal.",
        0.5,
    ),
    Piece(
        "slt",
        "Now we are engaged in a great civil war, testing whether that nation, or any nation so conceived "
        "and so dedicated, can long endure. We are met on a great battle field of that war. We have come to "
        "dedicate a portion of that field, as a final resting place for those who here gave their lives that "
        "that nation might live. It is altogether fitting and proper that we should do this.",
        1.2,
    ),
    Piece(
        "espeak:en-us-nyc",
        "But, in a larger sense, we can not dedicate, we can not consecrate, we can not hallow this ground. "
        "The brave men, living and dead, who struggled here, have consecrated it, far above our poor power to "
        "add or detract. The world will little note, nor long remember what we say here, but it can never "
        "forget what they did here.",
        3.5,
    ),
    Piece(
        "slt",
        "When in the course of human events, it becomes necessary for one people to dissolve the political "
        "bands which have connected them with another, and to assume among the powers of the earth, the "
        "separate and equal station to which the Laws of Nature and of Nature's God entitle them, a decent "
        "respect to the opinions of mankind requires that they should declare the causes which impel them to "
        "the separation.",
        0.9,
    ),
    Piece(
        "espeak:en-gb-x-gbcwmd",
        "We hold these truths to be self-evident, that all men are created equal, that they are endowed by "
        "their Creator with certain unalienable Rights, that among these are Life, Liberty and the pursuit of "
        "Happiness.",
        2.0,
    ),
    Piece(
        "kal",
        "With malice toward none, with charity for all, with firmness in the right as God gives us to see the right,",
        0.3,
    ),
    Piece(
        "espeak:en-us",
        "let us strive on to finish the work we are in, to bind up the nation's wounds, to care for him who "
        "shall have borne the battle and for his widow and his orphan, to do all which may achieve and cherish "
        "a just and lasting peace among ourselves and with all nations.",
        0.5,
    ),
)

TALES = (
    Piece(
        "espeak:en-us+f3",
        "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to "
        "do: once or twice she had peeped into the book her sister was reading, but it had no pictures or "
        "conversations in it, and what is the use of a book, thought Alice, without pictures or conversations?",
        0.7,
    ),
    Piece(
        "slt",
        "So she was considering in her own mind, as well as she could, for the hot day made her feel very sleepy "
        "and stupid, whether the pleasure of making a daisy chain would be worth the trouble of getting up and "
        "picking the daisies, when suddenly a White Rabbit with pink eyes ran close by her.",
        3.2,
    ),
    Piece(
        "espeak:en-gb-scotland",
        "True! Nervous, very, very dreadfully nervous I had been and am; but why will you say that I am mad? "
        "The disease had sharpened my senses, not destroyed, not dulled them. Above all was the sense of hearing "
        "acute. I heard all things in the heaven and in the earth. How, then, am I mad? Hearken! and observe how "
        "healthily, how calmly I can tell you the whole story.",
        1.4,
    ),
    Piece(
        "kal",
        "You don't know about me without you have read a book by the name of The Adventures of Tom Sawyer; but "
        "that ain't no matter. That book was made by Mister Mark Twain, and he told the truth, mainly.",
        0.4,
    ),
    Piece("espeak:en-us-nyc", "There was things which he stretched, but mainly he told the truth.", 0.9),
    Piece(
        "espeak:en-029",
        "There was no possibility of taking a walk that day. We had been wandering, indeed, in the leafless "
        "shrubbery an hour in the morning; but since dinner the cold winter wind had brought with it clouds so "
        "sombre, and a rain so penetrating, that further outdoor exercise was now out of the question.",
        1.9,
    ),
    Piece(
        "slt",
        "You will rejoice to hear that no disaster has accompanied the commencement of an enterprise which you "
        "have regarded with such evil forebodings. I arrived here yesterday, and my first task is to assure my "
        "dear sister of my welfare and increasing confidence in the success of my undertaking.",
        0.6,
    ),
)

# Short fables in alternating voices with a pause after every sentence or two: many short
# segments, so a transcriber meets a boundary every few seconds.
FABLES = (
    Piece("espeak:en-gb-x-rp", "The Fox and the Grapes.", 1.0),
    Piece("kal", "One hot summer's day a fox was strolling through an orchard.", 0.5),
    Piece(
        "slt", "He came to a bunch of grapes just ripening on a vine which had been trained over a lofty branch.", 0.4
    ),
    Piece("kal", "Just the thing to quench my thirst, said he.", 0.6),
    Piece(
        "slt",
        "Drawing back a few paces, he took a run and a jump, and just missed the bunch. Turning round again with "
        "a one, two, three, he jumped up, but with no greater success.",
        0.5,
    ),
    Piece("kal", "Again and again he tried after the tempting morsel, but at last had to give it up.", 0.4),
    Piece("espeak:en-us", "I am sure they are sour, he said, and walked away with his nose in the air.", 1.2),
    Piece("espeak:en-gb-x-rp", "It is easy to despise what you cannot get.", 3.0),
    Piece("espeak:en-gb-x-rp", "The Tortoise and the Hare.", 1.0),
    Piece(
        "slt",
        "The hare was once boasting of his speed before the other animals. I have never yet been beaten, said "
        "he, when I put forth my full speed. I challenge any one here to race with me.",
        0.6,
    ),
    Piece("espeak:en-gb-x-gbcwmd", "I accept your challenge, said the tortoise, quietly.", 0.4),
    Piece(
        "kal",
        "That is a good joke, said the hare. I could dance round you all the way. Keep your boasting till you "
        "have beaten me, answered the tortoise. Shall we race?",
        0.8,
    ),
    Piece(
        "slt",
        "So a course was fixed and a start was made. The hare darted almost out of sight at once, but soon "
        "stopped and, to show his contempt for the tortoise, lay down to have a nap.",
        0.5,
    ),
    Piece(
        "espeak:en-us-nyc",
        "The tortoise plodded on and plodded on, and when the hare awoke from his nap, he saw the tortoise just "
        "near the winning post and could not run up in time to save the race.",
        1.1,
    ),
    Piece("espeak:en-gb-x-rp", "Slow and steady wins the race.", 3.5),
    Piece("espeak:en-gb-x-rp", "The Boy Who Cried Wolf.", 1.0),
    Piece(
        "kal",
        "There was once a young shepherd boy who tended his sheep at the foot of a mountain near a dark forest. "
        "It was rather lonely for him all day, so he thought upon a plan by which he could get a little company "
        "and some excitement.",
        0.5,
    ),
    Piece(
        "slt",
        "He rushed down towards the village calling out, wolf, wolf, and the villagers came out to meet him, "
        "and some of them stopped with him for a considerable time.",
        0.4,
    ),
    Piece(
        "espeak:en-029",
        "This pleased the boy so much that a few days afterwards he tried the same trick, and again the "
        "villagers came to his help. But shortly after this a wolf actually did come out from the forest.",
        0.7,
    ),
    Piece(
        "kal",
        "Of course he cried out, wolf, wolf, still louder than before. But this time the villagers, who had been "
        "fooled twice before, thought the boy was again deceiving them, and nobody stirred to come to his help.",
        0.9,
    ),
    Piece("espeak:en-gb-x-rp", "A liar will not be believed, even when he speaks the truth.", 0.5),
)

EXTRA_RECORDINGS = {"openings": OPENINGS, "meeting": MEETING, "speeches": SPEECHES, "tales": TALES, "fables": FABLES}
