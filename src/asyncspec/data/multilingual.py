"""A small multilingual set with references: twelve everyday sentences, written for this project
in English and translated by hand into French, German, Spanish, Italian, Finnish and Russian. A clip
is two consecutive sentences; each language gets six. Italian, Finnish and Russian are spoken by
Festival's voices for them (diphone and unit-selection voices made from recordings of people:
two speakers each for Italian and Finnish, alternated clip by clip), French, German and Spanish by
espeak-ng (Debian has no Festival voice for them), at three rates and two voice variants so that no
two clips of a language sound alike. English is spoken by Festival's English voices. Every clip has
its source text (for transcription WER and language identification) and the English original (for
translation WER and BLEU)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from asyncspec.data.devset import FESTIVAL_VOICES, festival_speak, speak

ENGLISH = (
    "The train to the city leaves at eight o'clock every morning.",
    "My sister works in a small hospital near the river.",
    "We bought bread, cheese and apples at the market yesterday.",
    "The weather will be cold and rainy this weekend.",
    "Children are playing football in the park after school.",
    "Please close the window before you leave the room.",
    "The old library opens again next month after the repairs.",
    "He drinks a cup of coffee and reads the newspaper.",
    "Our neighbours have a big black dog and two cats.",
    "The museum is closed on Mondays and public holidays.",
    "I would like to learn to play the piano this year.",
    "The doctor said that I should sleep more and walk every day.",
)

TRANSLATIONS = {
    "fr": (
        "Le train pour la ville part à huit heures tous les matins.",
        "Ma sœur travaille dans un petit hôpital près de la rivière.",
        "Nous avons acheté du pain, du fromage et des pommes au marché hier.",
        "Le temps sera froid et pluvieux ce week-end.",
        "Les enfants jouent au football dans le parc après l'école.",
        "Fermez la fenêtre avant de quitter la pièce, s'il vous plaît.",
        "La vieille bibliothèque rouvre le mois prochain après les travaux.",
        "Il boit une tasse de café et lit le journal.",
        "Nos voisins ont un grand chien noir et deux chats.",
        "Le musée est fermé le lundi et les jours fériés.",
        "Je voudrais apprendre à jouer du piano cette année.",
        "Le médecin a dit que je devrais dormir plus et marcher tous les jours.",
    ),
    "de": (
        "Der Zug in die Stadt fährt jeden Morgen um acht Uhr ab.",
        "Meine Schwester arbeitet in einem kleinen Krankenhaus am Fluss.",
        "Wir haben gestern auf dem Markt Brot, Käse und Äpfel gekauft.",
        "Das Wetter wird an diesem Wochenende kalt und regnerisch.",
        "Die Kinder spielen nach der Schule im Park Fußball.",
        "Bitte schließen Sie das Fenster, bevor Sie den Raum verlassen.",
        "Die alte Bibliothek öffnet nach den Reparaturen nächsten Monat wieder.",
        "Er trinkt eine Tasse Kaffee und liest die Zeitung.",
        "Unsere Nachbarn haben einen großen schwarzen Hund und zwei Katzen.",
        "Das Museum ist montags und an Feiertagen geschlossen.",
        "Ich möchte dieses Jahr Klavier spielen lernen.",
        "Der Arzt sagte, ich solle mehr schlafen und jeden Tag spazieren gehen.",
    ),
    "es": (
        "El tren a la ciudad sale a las ocho todas las mañanas.",
        "Mi hermana trabaja en un pequeño hospital cerca del río.",
        "Ayer compramos pan, queso y manzanas en el mercado.",
        "El tiempo será frío y lluvioso este fin de semana.",
        "Los niños juegan al fútbol en el parque después de la escuela.",
        "Por favor, cierra la ventana antes de salir de la habitación.",
        "La antigua biblioteca vuelve a abrir el mes que viene después de las reparaciones.",
        "Él bebe una taza de café y lee el periódico.",
        "Nuestros vecinos tienen un perro negro grande y dos gatos.",
        "El museo está cerrado los lunes y los días festivos.",
        "Me gustaría aprender a tocar el piano este año.",
        "El médico dijo que debería dormir más y caminar todos los días.",
    ),
    "it": (
        "Il treno per la città parte alle otto ogni mattina.",
        "Mia sorella lavora in un piccolo ospedale vicino al fiume.",
        "Ieri abbiamo comprato pane, formaggio e mele al mercato.",
        "Il tempo sarà freddo e piovoso questo fine settimana.",
        "I bambini giocano a calcio nel parco dopo la scuola.",
        "Per favore, chiudi la finestra prima di uscire dalla stanza.",
        "La vecchia biblioteca riapre il mese prossimo dopo i lavori.",
        "Lui beve una tazza di caffè e legge il giornale.",
        "I nostri vicini hanno un grande cane nero e due gatti.",
        "Il museo è chiuso il lunedì e nei giorni festivi.",
        "Quest'anno vorrei imparare a suonare il pianoforte.",
        "Il medico ha detto che dovrei dormire di più e camminare ogni giorno.",
    ),
    "fi": (
        "Juna kaupunkiin lähtee joka aamu kello kahdeksan.",
        "Siskoni työskentelee pienessä sairaalassa joen lähellä.",
        "Ostimme eilen torilta leipää, juustoa ja omenoita.",
        "Sää on tänä viikonloppuna kylmä ja sateinen.",
        "Lapset pelaavat jalkapalloa puistossa koulun jälkeen.",
        "Sulje ikkuna, ennen kuin lähdet huoneesta.",
        "Vanha kirjasto avataan uudelleen ensi kuussa korjausten jälkeen.",
        "Hän juo kupin kahvia ja lukee sanomalehteä.",
        "Naapureillamme on iso musta koira ja kaksi kissaa.",
        "Museo on suljettu maanantaisin ja pyhäpäivinä.",
        "Haluaisin oppia soittamaan pianoa tänä vuonna.",
        "Lääkäri sanoi, että minun pitäisi nukkua enemmän ja kävellä joka päivä.",
    ),
    "ru": (
        "Поезд в город отправляется каждое утро в восемь часов.",
        "Моя сестра работает в маленькой больнице у реки.",
        "Вчера мы купили на рынке хлеб, сыр и яблоки.",
        "В эти выходные будет холодно и дождливо.",
        "Дети играют в футбол в парке после школы.",
        "Пожалуйста, закройте окно, прежде чем выйти из комнаты.",
        "Старая библиотека снова откроется в следующем месяце после ремонта.",
        "Он пьёт чашку кофе и читает газету.",
        "У наших соседей большая чёрная собака и две кошки.",
        "Музей закрыт по понедельникам и в праздничные дни.",
        "В этом году я хотел бы научиться играть на пианино.",
        "Врач сказал, что мне нужно больше спать и каждый день гулять.",
    ),
}

ESPEAK_VOICES = {"fr": "fr-fr", "de": "de", "es": "es"}
# language -> (Debian package, the voice's select expression) per speaker, and the text encoding it reads
FESTIVAL_LANGUAGES = {
    "it": ((("festvox-italp16k", "(voice_lp_diphone)"), ("festvox-itapc16k", "(voice_pc_diphone)")), "latin-1"),
    "fi": (
        (("festvox-suopuhe-lj", "(voice_suo_fi_lj_diphone)"), ("festvox-suopuhe-mv", "(voice_hy_fi_mv_diphone)")),
        "latin-1",
    ),
    "ru": ((("festvox-ru", "(voice_msu_ru_nsh_clunits)"),), "utf-8"),
}
VARIANTS = ("m3", "f2")  # espeak-ng voice variants, alternated clip by clip
RATES = (135, 155, 175)  # words per minute, cycled clip by clip
FESTIVAL_SELECTS = tuple(FESTIVAL_VOICES.values())
SENTENCES_PER_CLIP = 2
LANGUAGES = ("en", *TRANSLATIONS)


@dataclass(frozen=True)
class Clip:
    path: Path
    language: str
    text: str  # what is spoken
    english: str  # the English original (the translation reference)


def _sentences(language: str) -> tuple[str, ...]:
    return ENGLISH if language == "en" else TRANSLATIONS[language]


def _speak(path: Path, language: str, number: int, text: str) -> None:
    if language == "en":
        festival_speak(path, text, FESTIVAL_SELECTS[number % len(FESTIVAL_SELECTS)])
    elif language in FESTIVAL_LANGUAGES:
        speakers, encoding = FESTIVAL_LANGUAGES[language]
        package, select = speakers[number % len(speakers)]
        festival_speak(path, text, select, encoding, package)
    else:
        voice = f"{ESPEAK_VOICES[language]}+{VARIANTS[number % len(VARIANTS)]}"
        speak(path, text, voice, RATES[number % len(RATES)])


def build_multilingual_set(directory: Path, per_language: int | None = None) -> list[Clip]:
    """Every language's clips (or its first `per_language`) under `directory`, reused when already
    spoken, with a manifest."""
    directory.mkdir(parents=True, exist_ok=True)
    clips = []
    for language in LANGUAGES:
        sentences = _sentences(language)
        starts = list(range(0, len(sentences), SENTENCES_PER_CLIP))[:per_language]
        for number, first in enumerate(starts):
            text = " ".join(sentences[first : first + SENTENCES_PER_CLIP])
            english = " ".join(ENGLISH[first : first + SENTENCES_PER_CLIP])
            path = directory / f"{language}_{number}.wav"
            _speak(path, language, number, text)
            clips.append(Clip(path, language, text, english))
    manifest = [{"file": c.path.name, "language": c.language, "text": c.text, "english": c.english} for c in clips]
    (directory / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1) + "\n")
    return clips
