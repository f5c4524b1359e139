"""The benchmark's interleaved timing: two sides timed call for call, so the load of one moment
falls on both (bench/run.py ``timed_pairs``, bench/peer.py ``pair_ratio``).  No timing asserts:
the order of the calls and the arithmetic on given samples."""

from __future__ import annotations

import asyncio

from bench import peer, run


def test_calls_alternate_and_the_first_of_each_pair_switches() -> None:
    calls: list[str] = []

    async def ours() -> None:
        calls.append("o")

    async def theirs() -> None:
        calls.append("p")

    mine, their = asyncio.run(run.timed_pairs(ours, theirs, 4, warmup=2))
    # two warm-up pairs, then four timed; no side ever runs twice in a row but across pairs
    assert "".join(calls) == "op" "po" "op" "po" "op" "po"
    assert len(mine) == len(their) == 4


def test_the_pair_ratio_is_the_median_of_each_pairs_ratio() -> None:
    # a busy moment (the third pair) slows both sides; the p50s' ratio reads 1.0x, the pairs 0.5x
    mine, theirs = [0.001, 0.002, 0.010], [0.002, 0.001, 0.040]
    assert peer.p50(mine) / peer.p50(theirs) == 1.0
    assert peer.pair_ratio(mine, theirs) == 0.5


def test_rows_show_the_pair_ratio_beside_the_p50s() -> None:
    ours = peer.Side(sdk_ms={"x": 1.0}, raw_ms={"x": 0.5}, text_bytes={"x": 10},
                     structured_bytes={"x": 0}, tool_list_bytes=100)
    other = peer.Side(sdk_ms={"x": 2.0}, raw_ms={"x": 1.0}, text_bytes={"x": 20},
                      structured_bytes={"x": 0}, tool_list_bytes=50)
    rows = dict(peer.SideBySide(ours, other, ["x"], sdk_pair_ratio={"x": 0.6},
                                raw_pair_ratio={"x": 0.4}).rows())
    assert rows["x: SDK ms ours / peer"] == "1.00 / 2.00 = 0.50x, pairs 0.60x"
    assert rows["x: bare ms ours / peer"] == "0.50 / 1.00 = 0.50x, pairs 0.40x"
