"""Whisper's timestamp rules and segment splitting as pure functions, on hand-made logits and tokens."""

from __future__ import annotations

import torch

from asyncspec.models.whisper_rules import TimestampRules, apply_timestamp_rules
from asyncspec.transcription.longform import compression_ratio
from asyncspec.transcription.outputs import monotonic_spans, to_srt, to_vtt
from asyncspec.transcription.segments import Segment, split_by_timestamps

# a toy vocabulary: text 0..9, end of text 10, no-timestamps 11, timestamps 12.. (<|0.00|> = 12)
RULES = TimestampRules(timestamp_begin=12, eot=10, no_timestamps=11, max_initial_index=3)
V = 40
INF = float("-inf")


def allowed(outputs: list[int], logits: torch.Tensor | None = None) -> set[int]:
    """Ids left after the rules; by default text is likely enough that the timestamps' mass never wins."""
    if logits is None:
        logits = torch.zeros(V)
        logits[:10] = 5.0
    row = logits.clone()[None]
    apply_timestamp_rules(RULES, row, [outputs])
    return {i for i in range(V) if row[0, i] > INF}


def test_the_first_token_is_a_timestamp_within_the_initial_bound():
    assert allowed([]) == {12, 13, 14, 15}


def test_after_a_pair_only_text_follows_and_after_a_lone_timestamp_only_a_timestamp_or_the_end():
    assert allowed([12]) == set(range(10)) | {10}  # opened at 0.00: text (or the end of text)
    after_text = allowed([12, 3, 4])
    assert 3 in after_text and 13 in after_text and 12 not in after_text  # a segment has a nonzero length
    likely_end = torch.zeros(V)
    likely_end[:11] = 5.0
    closing = allowed([12, 3, 20], likely_end)  # closed at 0.16: next opens at >= 0.16, or the end
    assert closing == {10} | set(range(20, V))
    assert allowed([12, 3, 20, 20]) == set(range(11))  # a segment opened: text (or the end)


def test_timestamps_never_go_backwards():
    assert min(t for t in allowed([12, 3, 20, 20, 5]) if t >= 12) == 21


def test_timestamps_win_when_their_mass_beats_every_text_token():
    logits = torch.full((V,), -5.0)
    logits[3] = 1.0  # the likeliest text token
    logits[12:] = 0.0  # 28 timestamps at e^0 each: their mass beats e^1
    assert allowed([12, 4], logits) == set(range(13, V))
    logits[3] = 5.0  # now one text token beats them all
    assert 3 in allowed([12, 4], logits)


def test_a_row_is_masked_by_its_own_prefix_only():
    """Rows of one call get the masks they get alone: the rule never reads the call."""
    prefixes = [[12], [12, 3], [12, 3, 20], [12, 3, 20, 20, 5]]
    logits = torch.randn(len(prefixes), V, generator=torch.Generator().manual_seed(0))
    together = logits.clone()
    apply_timestamp_rules(RULES, together, prefixes)
    for i, prefix in enumerate(prefixes):
        alone = logits[i : i + 1].clone()
        apply_timestamp_rules(RULES, alone, [prefix])
        assert torch.equal(alone[0], together[i])


WHISPER_BEGIN, WHISPER_VOCAB = 50364, 51865  # multilingual Whisper: <|0.00|>, vocabulary size
WHISPER_RULES = TimestampRules(timestamp_begin=WHISPER_BEGIN, eot=50257, no_timestamps=50363)


def reference_timestamps_win(row: torch.Tensor) -> bool:
    """openai-whisper's formulation of the rule: on log-probabilities, in float64."""
    logprobs = torch.log_softmax(row.double(), dim=-1)
    return bool(torch.logsumexp(logprobs[WHISPER_BEGIN:], dim=-1) > logprobs[:WHISPER_BEGIN].max())


def test_the_timestamp_mass_rule_decides_as_the_log_probability_formulation():
    """The rule compares logits, without a softmax over the vocabulary; the reference compares
    log-probabilities in float64. Rows around the decision: the timestamps' mass shifted over a
    range that crosses the likeliest text token, so both outcomes occur."""
    generator = torch.Generator().manual_seed(3)
    rows = torch.randn(64, WHISPER_VOCAB, generator=generator)
    rows[:, 100] += 9.0  # a clear best text token
    rows[:, WHISPER_BEGIN:] += torch.linspace(-2.0, 5.0, 64).unsqueeze(1)
    masked = rows.clone()
    apply_timestamp_rules(WHISPER_RULES, masked, [[WHISPER_BEGIN, 100]] * 64)  # a segment's text: either may follow
    decided = [bool(masked[i, 100] == INF) for i in range(64)]
    assert decided == [reference_timestamps_win(rows[i]) for i in range(64)]
    assert 0 < sum(decided) < 64
    # control: a rule against the text's whole mass, not its likeliest token, decides otherwise
    text_mass = [bool(torch.logsumexp(r[WHISPER_BEGIN:], 0) > torch.logsumexp(r[:WHISPER_BEGIN], 0)) for r in rows]
    assert text_mass != decided


def test_a_full_vocabulary_row_is_masked_alike_at_every_place_in_the_call():
    """Rows of 51,865 logits sit at different memory alignments in one call; each is masked as alone."""
    generator = torch.Generator().manual_seed(4)
    rows = torch.randn(8, WHISPER_VOCAB, generator=generator)
    rows[:, WHISPER_BEGIN:] += torch.linspace(1.5, 3.5, 8).unsqueeze(1)  # near the decision
    together = rows.clone()
    prefixes = [[WHISPER_BEGIN, 100]] * 8
    apply_timestamp_rules(WHISPER_RULES, together, prefixes)
    for i in range(8):
        alone = rows[i : i + 1].clone()
        apply_timestamp_rules(WHISPER_RULES, alone, [prefixes[i]])
        assert torch.equal(alone[0], together[i])


def test_split_keeps_complete_segments_and_seeks_to_the_last_complete_timestamp():
    # <|0.00|> a b <|1.00|><|1.00|> c <|2.00|><|2.40|> d   (cut by the window's end)
    tokens = [12, 1, 2, 62, 62, 3, 112, 132, 4]
    pieces, seek = split_by_timestamps(RULES, tokens, offset_s=10.0, seek=1000, size=3000)
    assert [(p.start, p.end) for p in pieces] == [(10.0, 11.0), (11.0, 12.0)]
    assert seek == 1000 + 100 * 2  # the unfinished segment is decoded again from 2.00 s


def test_split_of_a_window_that_ends_on_a_lone_timestamp_moves_a_whole_window():
    tokens = [12, 1, 2, 62, 62, 3, 112]
    pieces, seek = split_by_timestamps(RULES, tokens, offset_s=0.0, seek=0, size=2500)
    assert len(pieces) == 2 and pieces[-1].end == 2.0 and seek == 2500


def test_a_window_without_a_pair_is_one_segment():
    pieces, seek = split_by_timestamps(RULES, [12, 1, 2, 3], offset_s=5.0, seek=500, size=800)
    assert len(pieces) == 1 and pieces[0].start == 5.0 and pieces[0].end == 5.0 + 8.0 and seek == 1300


def test_compression_ratio_flags_a_loop():
    assert compression_ratio("the cat sat on the mat. " * 20) > 2.4 > compression_ratio("the cat sat on the mat.")


def _segment(start: float, end: float, text: str) -> Segment:
    return Segment(0, 0, start, end, text, (), 0.0, 1.0, 0.0, 0.0)


def test_subtitle_times_never_go_backwards_and_parse():
    import srt
    import webvtt

    segments = [_segment(0.0, 2.0, " one"), _segment(1.5, 3.0, " two"), _segment(3.0, 3.0, " three")]
    spans = monotonic_spans(segments)
    assert [s[0] for s in spans] == [0.0, 2.0, 3.0] and all(
        a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)
    )
    parsed = list(srt.parse(to_srt(segments, {})))
    assert [p.content for p in parsed] == ["one", "two", "three"]
    assert all(a.end <= b.start for a, b in zip(parsed, parsed[1:], strict=False))
    import io

    captions = webvtt.from_buffer(io.StringIO(to_vtt(segments, {}))).captions
    assert [c.text for c in captions] == ["one", "two", "three"]


class ScriptedTarget:
    """What the long-form loop needs of a target: its rules, a tokenizer, window requests and an
    encoder (here one that computes nothing: the scripted decoder ignores it)."""

    timestamp_rules = RULES

    class tokenizer:
        @staticmethod
        def decode(ids):
            return " ".join(f"w{i}" for i in ids)

        @staticmethod
        def encode(text):
            return [900 + len(word) for word in text.split()]

    def request(self, audio, language, timestamps, previous, task, hotwords=()):
        from asyncspec.models.base import DecodeRequest

        return DecodeRequest(prompt_ids=(1, *hotwords, *previous), audio=audio)

    def encode_audio(self, audio):
        return None


# the window at each seek (s) -> its output: text ids and timestamps (<|t|> = 12 + 50 t)
EARLY_END_SCRIPT = {
    0.0: [12, 1, 2, 112],  # "w1 w2" 0-2 s, then end of text: the reference rule skips to 30 s
    2.0: [12, 7, 8, 1412],  # the speech at 2-30 s, seen only from a window that starts at 2 s
    30.0: [12, 9, 112],
}


def scripted_windows(resume: bool, **options) -> list:
    from asyncspec.decoding.result import DecodeResult, DecodeStats
    from asyncspec.trace import Trace
    from asyncspec.transcription.longform import LongformOptions, transcribe_windows

    def decode(request, configs, seek_s, end_s, earlier):
        tokens = EARLY_END_SCRIPT.get(round(seek_s, 2), [12, 3, 62])
        return [DecodeResult("scripted", tokens, DecodeStats(logprobs=[0.0] * (len(tokens) + 1)), Trace())]

    samples = torch.zeros(65 * 16_000).numpy()
    options = LongformOptions(resume_after_early_end=resume, **options)
    return list(transcribe_windows(ScriptedTarget(), decode, samples, options))


def test_the_initial_prompt_conditions_the_first_window_and_the_history_follows_it():
    prompted = scripted_windows(True, initial_prompt="  a bb ccc ")
    prompts = [window.chosen.request.prompt_ids for window in prompted]
    assert prompts[0] == (1, 901, 902, 903)  # " a bb ccc", stripped, behind a leading space
    assert prompts[1][:4] == (1, 901, 902, 903) and len(prompts[1]) > 4  # then the first window's text
    alone = scripted_windows(True, initial_prompt="a bb", condition_on_previous_text=False)
    assert [w.chosen.request.prompt_ids for w in alone[:2]] == [(1, 901, 902), (1,)]  # the first window only
    assert scripted_windows(True)[0].chosen.request.prompt_ids == (1,)


def test_hotwords_condition_every_window_before_the_previous_text():
    hot = scripted_windows(True, hotwords=" Dashwood  Elinor ")
    prompts = [window.chosen.request.prompt_ids for window in hot]
    assert len(prompts) >= 3 and all(prompt[:3] == (1, 908, 906) for prompt in prompts), prompts
    assert len(prompts[1]) > 3  # then the previous windows' text
    alone = scripted_windows(True, hotwords="Dashwood", condition_on_previous_text=False)
    assert {w.chosen.request.prompt_ids for w in alone} == {(1, 908)}  # every window, history or not


def test_a_window_that_ends_early_is_followed_from_its_last_segment_and_the_reference_rule_skips():
    resumed = scripted_windows(resume=True)
    text = " ".join(segment.text for window in resumed for segment in window.segments)
    assert [w.start_s for w in resumed[:3]] == [0.0, 2.0, 30.0] and resumed[0].resumed_early
    assert "w7 w8" in text and text.startswith("w1 w2")
    reference = scripted_windows(resume=False)  # Whisper's rule: the lone ending moves a whole window
    assert [w.start_s for w in reference[:2]] == [0.0, 30.0] and not reference[0].resumed_early
    assert "w7" not in " ".join(segment.text for window in reference for segment in window.segments)
    assert all(b.start_s - a.start_s >= 1.0 for a, b in zip(resumed, resumed[1:], strict=False))


def test_an_early_end_is_counted_and_reported(capsys):
    from asyncspec.run.longform import _progress
    from asyncspec.transcription.api import TranscriptionInfo, _observe
    from asyncspec.transcription.longform import LongformOptions

    for resume in (True, False):
        info = TranscriptionInfo("en", 1.0, 65.0, "target", "scripted", LongformOptions(resume_after_early_end=resume))
        outcomes = scripted_windows(resume)
        for outcome in outcomes:
            _observe(info, outcome)
        _progress(info, "f.wav", 0)
        resumed = sum(outcome.resumed_early for outcome in outcomes)
        assert info.stats.resumed_early == resumed and (resumed >= 1) == resume
        err = capsys.readouterr().err
        assert err.count("its text ended early") == resumed
        assert ("its text ended early: the next window starts at 2.0 s" in err) == resume
