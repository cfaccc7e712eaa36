//! A stacked bar chart as numbers for `templates/admin/_chart.html`, which
//! draws it as inline SVG: no script, nothing loaded, only attributes (the
//! console's CSP stays as it is). Every bar segment carries a `<title>`, so
//! a pointer or a screen reader gets the exact count.

/// Where the plot sits inside the SVG's view box (units are pixels at 100 %).
const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 230.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 30.0;
/// A bar's share of its column; the rest is the gap.
const BAR_SHARE: f64 = 0.72;

/// One stacked series: a decision or an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesSpec {
    /// Its wire name (`deny`, `sms_send`), shown in the legend.
    pub name: &'static str,
    /// Its fill, an SVG colour.
    pub color: &'static str,
}

/// One column of the chart.
pub struct Column {
    /// What the column covers, for titles (`10:00–11:00 UTC`).
    pub title: String,
    /// The axis label under it, when it gets one.
    pub label: Option<String>,
    /// A count per series, in the order of the series.
    pub counts: Vec<u64>,
}

/// A legend entry.
pub struct LegendEntry {
    /// The series' wire name, beside its swatch.
    pub name: &'static str,
    /// The swatch's fill, the colour of the series' bars.
    pub color: &'static str,
    /// The series' total over the chart.
    pub total: u64,
}

/// One rectangle of a stacked bar.
pub struct Segment {
    /// The left edge, inside the column with half the gap on each side.
    pub x: f64,
    /// The top edge: the segment sits on the series stacked below it.
    pub y: f64,
    /// The bar's width (SVG units): `BAR_SHARE` of its column's slot.
    pub width: f64,
    /// The count, to the count axis's scale.
    pub height: f64,
    /// The series' fill.
    pub color: &'static str,
    /// `10:00–11:00 UTC · deny: 12`.
    pub title: String,
}

/// A labelled position on an axis.
pub struct Tick {
    /// x for the time axis, y for the count axis.
    pub at: f64,
    /// A time (`10:00`, `Nov 01`) or a count (`50`).
    pub label: String,
}

/// A chart ready to draw.
pub struct Chart {
    /// Unique on the page, for `aria-labelledby`.
    pub id: &'static str,
    /// `Refusals per hour by decision, last 24 hours`.
    pub title: String,
    /// The totals in words, for screen readers.
    pub description: String,
    /// The series with a count in the chart, in series order.
    pub legend: Vec<LegendEntry>,
    /// One rectangle per non-zero count, column by column.
    pub segments: Vec<Segment>,
    /// The count axis: a gridline and a label per step, from 0 to the top.
    pub y_ticks: Vec<Tick>,
    /// The time axis: a tick and a label at each column that has a label.
    pub x_ticks: Vec<Tick>,
    /// The plot's left edge (its top is `TOP`), where the gridlines start.
    pub left: f64,
    /// The plot's right edge, where the gridlines end.
    pub right: f64,
    /// The plot's bottom edge: the time axis line, and the bars' base.
    pub bottom: f64,
    /// The SVG's view box width.
    pub width: f64,
    /// The SVG's view box height.
    pub height: f64,
    /// Where the count labels end, left of the plot.
    pub y_label_x: f64,
    /// Where the time ticks end, below the axis.
    pub tick_end: f64,
    /// The time labels' baseline.
    pub x_label_y: f64,
}

/// To a tenth of a pixel: shorter attributes, nothing visible lost.
fn px(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// The smallest of 1, 2 or 5 times a power of ten that is at least `x`.
fn nice_step(x: f64) -> u64 {
    let mut power = 1u64;
    loop {
        for m in [1, 2, 5] {
            if (m * power) as f64 >= x {
                return m * power;
            }
        }
        power = power.saturating_mul(10);
    }
}

/// Each series with its total over the columns; a series with nothing in the
/// chart is left out of the legend too.
fn legend(series: &[SeriesSpec], columns: &[Column]) -> Vec<LegendEntry> {
    series
        .iter()
        .enumerate()
        .map(|(i, spec)| LegendEntry {
            name: spec.name,
            color: spec.color,
            total: columns
                .iter()
                .map(|c| c.counts.get(i).copied().unwrap_or(0))
                .sum(),
        })
        .filter(|entry| entry.total > 0)
        .collect()
}

impl Chart {
    /// The columns stacked by series, the count axis running to a round
    /// number above the tallest column (four steps or so).
    pub fn stacked(
        id: &'static str,
        title: String,
        series: &[SeriesSpec],
        columns: &[Column],
    ) -> Self {
        let tallest = columns
            .iter()
            .map(|c| c.counts.iter().sum::<u64>())
            .max()
            .unwrap_or(0);
        let step = nice_step((tallest.max(1) as f64) / 4.0);
        let top_count = tallest.max(1).div_ceil(step) * step;

        let (right, bottom) = (WIDTH - RIGHT, HEIGHT - BOTTOM);
        let plot_height = bottom - TOP;
        let slot = (right - LEFT) / columns.len().max(1) as f64;
        let scale = |count: u64| count as f64 / top_count as f64 * plot_height;

        let mut segments = Vec::new();
        let mut x_ticks = Vec::new();
        for (i, column) in columns.iter().enumerate() {
            let x = LEFT + slot * i as f64;
            if let Some(label) = &column.label {
                x_ticks.push(Tick {
                    at: px(x),
                    label: label.clone(),
                });
            }
            let mut below = 0;
            for (spec, &count) in series.iter().zip(&column.counts) {
                if count == 0 {
                    continue;
                }
                let (y0, y1) = (bottom - scale(below), bottom - scale(below + count));
                segments.push(Segment {
                    x: px(x + slot * (1.0 - BAR_SHARE) / 2.0),
                    y: px(y1),
                    width: px(slot * BAR_SHARE),
                    height: px(y0 - y1),
                    color: spec.color,
                    title: format!("{} · {}: {count}", column.title, spec.name),
                });
                below += count;
            }
        }
        let y_ticks = (0..=top_count / step)
            .map(|n| Tick {
                at: px(bottom - scale(n * step)),
                label: (n * step).to_string(),
            })
            .collect();
        let legend = legend(series, columns);
        let description = legend
            .iter()
            .map(|e| format!("{} {}", e.name, e.total))
            .collect::<Vec<_>>()
            .join(", ");
        Self {
            id,
            title,
            description,
            legend,
            segments,
            y_ticks,
            x_ticks,
            left: LEFT,
            right,
            bottom,
            width: WIDTH,
            height: HEIGHT,
            y_label_x: LEFT - 6.0,
            tick_end: bottom + 4.0,
            x_label_y: bottom + 19.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERIES: [SeriesSpec; 2] = [
        SeriesSpec {
            name: "deny",
            color: "red",
        },
        SeriesSpec {
            name: "lock",
            color: "purple",
        },
    ];

    fn column(title: &str, label: Option<&str>, counts: [u64; 2]) -> Column {
        Column {
            title: title.into(),
            label: label.map(str::to_string),
            counts: counts.to_vec(),
        }
    }

    #[test]
    fn steps_are_one_two_or_five_times_a_power_of_ten() {
        let steps: Vec<u64> = [0.25, 1.0, 1.5, 3.0, 7.0, 12.0, 26.0, 251.0]
            .into_iter()
            .map(nice_step)
            .collect();
        assert_eq!(steps, [1, 1, 2, 5, 10, 20, 50, 500]);
    }

    #[test]
    fn bars_stack_their_series_from_the_axis_and_the_scale_ends_on_a_round_count() {
        let columns = [
            column("00:00–01:00 UTC", Some("00:00"), [6, 3]),
            column("01:00–02:00 UTC", None, [0, 0]),
            column("02:00–03:00 UTC", None, [2, 0]),
        ];
        let chart = Chart::stacked("c", "t".into(), &SERIES, &columns);
        // The tallest column holds 9: steps of 5 (9 / 4 rounded up to 1, 2, 5),
        // so the axis runs to 10.
        let labels: Vec<&str> = chart.y_ticks.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["0", "5", "10"]);
        assert_eq!(chart.y_ticks[0].at, chart.bottom);
        assert_eq!(chart.y_ticks[2].at, TOP);

        let titles: Vec<&str> = chart.segments.iter().map(|s| s.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "00:00–01:00 UTC · deny: 6",
                "00:00–01:00 UTC · lock: 3",
                "02:00–03:00 UTC · deny: 2"
            ],
            "one segment per non-zero count"
        );
        let plot = chart.bottom - TOP;
        let (deny, lock) = (&chart.segments[0], &chart.segments[1]);
        assert_eq!(deny.height, px(plot * 0.6));
        assert_eq!(
            deny.y + deny.height,
            chart.bottom,
            "the first series sits on the axis"
        );
        assert!(
            (lock.y + lock.height - deny.y).abs() < 0.2,
            "the next one on top of it"
        );
        assert_eq!(lock.color, "purple");
        assert_eq!(chart.x_ticks.len(), 1);
        assert_eq!(chart.x_ticks[0].at, chart.left);
        let totals: Vec<u64> = chart.legend.iter().map(|e| e.total).collect();
        assert_eq!(totals, [8, 3]);
        assert_eq!(chart.description, "deny 8, lock 3");
    }
}
