"""Per-machine cache entries (models/cache_entries.py): processes that measure at once agree on
the first entry written, and nobody reads half a file."""

from __future__ import annotations

import json
import multiprocessing

from asyncspec.models.cache_entries import keep_first, write_entry


def test_the_first_entry_written_stands_and_a_damaged_one_is_replaced(tmp_path):
    path = tmp_path / "precision" / "entry.json"
    assert keep_first(path, {"dtype": "fp32"}) == {"dtype": "fp32"}
    assert keep_first(path, {"dtype": "int8"}) == {"dtype": "fp32"}  # measured later: the first stands
    path.write_text('{"dtype": "fp')  # a damaged entry (an old writer, a full disk)
    assert keep_first(path, {"dtype": "bf16"}) == {"dtype": "bf16"}
    assert json.loads(path.read_text()) == {"dtype": "bf16"}
    write_entry(path, {"dtype": "int8"})  # a plain write replaces it whole
    assert json.loads(path.read_text()) == {"dtype": "int8"}
    assert sorted(p.name for p in path.parent.iterdir()) == ["entry.json"]  # no scratch file left


def _measure_and_keep(path: str, dtype: str, start) -> dict:
    start.wait()
    return keep_first(__import__("pathlib").Path(path), {"dtype": dtype, "pad": "x" * 100_000})


def test_processes_that_measure_together_agree_on_one_choice(tmp_path):
    path = str(tmp_path / "entry.json")
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start = manager.Barrier(4)
        with context.Pool(4) as pool:
            kept = pool.starmap(_measure_and_keep, [(path, d, start) for d in ("int8", "bf16", "fp32", "fp16")])
    assert len({entry["dtype"] for entry in kept}) == 1, [entry["dtype"] for entry in kept]
    assert json.loads((tmp_path / "entry.json").read_text())["dtype"] == kept[0]["dtype"]
