"""The SVG chart renderer (``crawlhub.web.charts``): one point per value where it belongs,
round axes, an empty chart that says so, and every label escaped - in text and in
attributes - so a name full of markup is shown, never run."""

from __future__ import annotations

from xml.etree import ElementTree

from crawlhub.web.charts import Line, bar_chart, line_chart, nice_top, short

HOSTILE = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
SVG = "{http://www.w3.org/2000/svg}"


def parse(markup: str) -> ElementTree.Element:
    """The chart as XML: it must parse (an unescaped label would break it)."""
    return ElementTree.fromstring(str(markup))


def test_a_line_chart_draws_one_point_per_value_at_its_time_and_height() -> None:
    t0 = 1_700_000_000.0
    chart = parse(line_chart("c", "Depth", [Line("a", [(t0, 0), (t0 + 60, 50), (t0 + 120, 100)]),
                                            Line("b", [(t0 + 60, 25)])],
                             start=t0, end=t0 + 120))
    assert chart.get("data-count") == "4"
    series = {g.get("data-series"): g for g in chart.iter(f"{SVG}g")}
    circles = list(series["a"].iter(f"{SVG}circle"))
    assert [c.get("data-value") for c in circles] == ["0", "50", "100"]
    xs = [float(c.get("cx") or 0) for c in circles]
    ys = [float(c.get("cy") or 0) for c in circles]
    assert xs[0] < xs[1] < xs[2] and ys[0] > ys[1] > ys[2]  # later right, higher up
    assert xs[1] - xs[0] == xs[2] - xs[1]
    assert len(list(series["a"].iter(f"{SVG}polyline"))) == 1
    assert list(series["b"].iter(f"{SVG}polyline")) == []  # one point: no line
    assert [c.findtext(f"{SVG}title") for c in series["b"].iter(f"{SVG}circle")] == [
        "b 22:14: 25"]


def test_every_label_is_escaped_in_text_and_attributes() -> None:
    markup = str(line_chart(HOSTILE, HOSTILE, [Line(HOSTILE, [(0, 1)])], start=0, end=60,
                            note=HOSTILE, unit=HOSTILE))
    markup += str(bar_chart(HOSTILE, HOSTILE, [HOSTILE], [(HOSTILE, [3])]))
    assert "<script" not in markup and "<img" not in markup
    line = parse(markup[:markup.index("</figure>") + 9])
    assert line.get("data-chart") == HOSTILE
    assert line.findtext("figcaption") == HOSTILE
    assert next(line.iter(f"{SVG}g")).get("data-series") == HOSTILE
    bar = parse(markup[markup.index("</figure>") + 9:])
    rect = next(bar.iter(f"{SVG}rect"))
    assert (rect.get("data-series"), rect.get("data-category")) == (HOSTILE, HOSTILE)


def test_a_bar_chart_draws_a_bar_per_series_and_category_scaled_to_its_value() -> None:
    chart = parse(bar_chart("segments", "Seeds", ["day 1", "day 2"],
                            [("admitted", [40, 10]), ("duplicates", [20, 0])]))
    bars = {(r.get("data-series"), r.get("data-category")): r
            for r in chart.iter(f"{SVG}rect")}
    assert len(bars) == 4
    height = {k: float(r.get("height") or 0) for k, r in bars.items()}
    assert height[("admitted", "day 1")] == 2 * height[("duplicates", "day 1")]
    assert height[("duplicates", "day 2")] == 0
    assert bars[("admitted", "day 2")].get("data-value") == "10"


def test_a_chart_without_data_says_so_and_draws_no_svg() -> None:
    chart = parse(line_chart("empty", "Nothing", [Line("a")], start=0, end=3600))
    assert chart.get("data-count") == "0"
    assert list(chart.iter(f"{SVG}svg")) == []
    assert "no data yet" in "".join(chart.itertext())


def test_axes_end_at_round_numbers_and_figures_are_short() -> None:
    assert [nice_top(v) for v in (0, 0.7, 3, 7, 12, 260, 99_000)] == [
        1, 1, 5, 10, 20, 500, 100_000]
    assert [short(v) for v in (950, 12.5, 3400, 2_100_000, 1.5e9)] == [
        "950", "12.5", "3.4k", "2.1M", "1.5G"]


def test_a_chart_spanning_days_names_the_day_on_its_axis() -> None:
    t0 = 1_700_000_000.0  # 2023-11-14 22:13 UTC
    chart = parse(line_chart("c", "Runs", [Line("a", [(t0, 1), (t0 + 3 * 86400, 2)])],
                             start=t0, end=t0 + 3 * 86400))
    ticks = [t.text for t in chart.iter(f"{SVG}text") if t.get("y") == str(200 - 6)]
    assert ticks == ["11-14 22:13", "11-16 10:13", "11-17 22:13"]
