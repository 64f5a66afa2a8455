//! Drawing a [`Timeline`] as an SVG document.
//!
//! Up to [`Options::dense_above`] machines, one row per machine: a bar per phase, the
//! control planes first then the workers by wave, names every few rows when the rows are
//! thin. Above it, one density band per role: how many machines are in each phase of
//! their turn, over time, against the limit (`maxUnavailable`, one control plane at a
//! time) and an axis of machines, with the share done on a right axis in per cent, and
//! the machines ahead of their turn (pulling early, held) in a strip of their own. Both
//! have a legend, a time axis in hours and minutes, the markers and spans of
//! [`Timeline`], and the physical bound as a line when it is given.
//!
//! The elements carry what the tests read back: `data-node`, `data-role` and
//! `data-group` on each row (`g.row`), `data-phase`, `data-start` and `data-end` (seconds)
//! on each bar (`rect.bar`), `data-x0`, `data-x1`, `data-t0` and `data-t1` on the axis.

use svg::Document;
use svg::node::element::path::Data;
use svg::node::element::{Circle, Group as SvgGroup, Line, Path, Polygon, Rectangle, Text, Title};

use crate::model::{MarkerKind, Phase, SpanKind, Timeline};

/// How to draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// The title at the top.
    pub title: String,
    /// The physical bound (seconds), drawn as a line, if known.
    pub bound_s: Option<f64>,
    /// The picture's width in pixels.
    pub width: f64,
    /// Above this many machines, density bands per role instead of one row per machine.
    pub dense_above: usize,
    /// The workers' `maxUnavailable`, drawn as a line on their density band, if known.
    pub max_unavailable: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            title: "Rollout timeline".to_owned(),
            bound_s: None,
            width: 1200.0,
            dense_above: 1000,
            max_unavailable: None,
        }
    }
}

/// Where the label column ends and the time axis begins.
const PLOT_LEFT: f64 = 170.0;
/// Space right of the time axis.
const PLOT_RIGHT_MARGIN: f64 = 28.0;
/// The plot's height for one row per machine, at most (rows get thinner to fit).
const ROWS_HEIGHT: f64 = 760.0;
/// The tallest row.
const ROW_MAX: f64 = 16.0;
/// The thinnest row.
const ROW_MIN: f64 = 1.0;
/// A label's height: rows thinner than this are labelled every few rows.
const LABEL_HEIGHT: f64 = 11.0;
/// The density view's shortest band (the control planes', sized to them, at least this),
/// and its tallest (the workers').
const BAND_HEIGHTS: (f64, f64) = (60.0, 260.0);
/// A control plane's share of its band's height: the panel is sized to its machines.
const CONTROL_PLANE_PX: f64 = 20.0;
/// Where the density view's labels end: the left axis' numbers sit between them and the
/// plot.
const BAND_LABEL_RIGHT: f64 = PLOT_LEFT - 30.0;
/// The strip under a band that counts the machines ahead of their turn.
const WAITING_HEIGHT: f64 = 26.0;
/// Between a band and its strip.
const WAITING_GAP: f64 = 6.0;
/// Between two bands.
const BAND_GAP: f64 = 16.0;
/// The width of one time bin of a density band, in pixels.
const BIN_PX: f64 = 2.0;
const FONT: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";

/// A phase's colour (the Okabe-Ito palette, readable with colour-blindness).
#[must_use]
pub fn colour(phase: Phase) -> &'static str {
    match phase {
        Phase::Pulling => "#CC79A7",
        Phase::Held => "#999999",
        Phase::Evacuating => "#E69F00",
        Phase::Installing => "#56B4E9",
        Phase::Draining => "#A6761D",
        Phase::Rebooting => "#0072B2",
        Phase::Resetting => "#332288",
        Phase::WaitingReady => "#F0E442",
        Phase::Verifying => "#009E73",
        Phase::Applying => "#882255",
        Phase::Converged => "#BFE3D4",
        Phase::Removed => "#DDDDDD",
        Phase::Failed => "#D55E00",
    }
}

fn marker_colour(kind: MarkerKind) -> &'static str {
    match kind {
        MarkerKind::AbFallback | MarkerKind::Failure => "#B00020",
        MarkerKind::ControllerRestart | MarkerKind::Refused => "#333333",
        MarkerKind::EtcdSnapshot | MarkerKind::EtcdGate | MarkerKind::EtcdMemberBack => "#6A3D9A",
    }
}

fn marker_label(kind: MarkerKind) -> &'static str {
    match kind {
        MarkerKind::AbFallback => "A/B fallback",
        MarkerKind::Failure => "machine failed",
        MarkerKind::ControllerRestart => "controller restart",
        MarkerKind::EtcdSnapshot => "etcd snapshot",
        MarkerKind::EtcdGate => "etcd gate wait",
        MarkerKind::EtcdMemberBack => "etcd member back",
        MarkerKind::Refused => "refused",
    }
}

fn span_style(kind: SpanKind) -> (&'static str, &'static str) {
    match kind {
        SpanKind::ApiOutage => ("#D55E00", "API outage"),
        SpanKind::Paused => ("#777777", "paused"),
    }
}

/// Rounds a coordinate to hundredths of a pixel, to keep the file small.
fn px(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// `h:mm:ss`.
#[must_use]
pub fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// Maps seconds to x.
#[derive(Debug, Clone, Copy)]
struct Scale {
    t1: f64,
    x0: f64,
    x1: f64,
}

impl Scale {
    fn x(self, t: f64) -> f64 {
        self.x0 + (t.clamp(0.0, self.t1) / self.t1) * (self.x1 - self.x0)
    }
}

/// How the drawn run ended, for the subtitle: `completed at T` once every machine
/// converged (or was removed), `paused at T: reason` for a pause still standing at the
/// trace's end, `refused at T: reason`, else `ended at T with N of M converged` (a trace
/// cut short, a run stopped): never a last convergence read as an end.
fn outcome(timeline: &Timeline) -> String {
    let last = |m: &crate::model::Machine| m.bars.last().map(|b| b.phase);
    let converged = timeline.rows.iter().filter(|m| last(m) == Some(Phase::Converged)).count();
    let removed: Vec<f64> =
        timeline.rows.iter().filter(|m| last(m) == Some(Phase::Removed)).filter_map(|m| m.finished).collect();
    let standing = timeline
        .spans
        .iter()
        .filter(|s| s.kind == SpanKind::Paused && s.end.is_none_or(|e| e >= timeline.end))
        .min_by(|a, b| a.start.total_cmp(&b.start));
    if let Some(pause) = standing {
        let why = if pause.text.is_empty() { String::new() } else { format!(": {}", pause.text) };
        return format!("paused at {}{why}", clock(pause.start));
    }
    if let Some(refusal) = timeline.markers.iter().find(|m| m.kind == MarkerKind::Refused) {
        return format!("refused at {}: {}", clock(refusal.t), refusal.text);
    }
    // A removal's trace: its machine removed is its end (the others never start).
    if let Some(at) = removed.iter().copied().reduce(f64::max) {
        return format!("removal completed at {}", clock(at));
    }
    if !timeline.rows.is_empty() && converged == timeline.rows.len() {
        let done = timeline.rows.iter().filter_map(|m| m.finished).fold(0.0, f64::max);
        return format!("completed at {}", clock(done));
    }
    format!("ended at {} with {converged} of {} converged", clock(timeline.end), timeline.rows.len())
}

/// `text` in lines of at most `chars` characters, broken at spaces (a longer word alone
/// on its line).
fn wrap(text: &str, chars: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= chars => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    if lines.is_empty() {
        lines.push(String::new());
    }
    lines
}

/// Draws `timeline`.
#[must_use]
pub fn render(timeline: &Timeline, options: &Options) -> Document {
    let width = options.width.max(PLOT_LEFT + PLOT_RIGHT_MARGIN + 200.0);
    let t1 = (timeline.end.max(options.bound_s.unwrap_or(0.0)) * 1.02).max(1.0);
    let scale = Scale { t1, x0: PLOT_LEFT, x1: width - PLOT_RIGHT_MARGIN };
    let dense = timeline.rows.len() > options.dense_above;

    let mut subtitle = format!(
        "{}; {} machines ({} control planes), waves of {}",
        outcome(timeline),
        timeline.rows.len(),
        timeline.rows.iter().filter(|m| m.is_control_plane()).count(),
        timeline.wave_size,
    );
    if let Some(bound) = options.bound_s {
        subtitle.push_str(&format!(", physical bound {}", clock(bound)));
    }
    let mut doc = SvgGroup::new().set("class", "timeline");
    // A title too long for the width wraps at words (about 8.5 pixels a character, bold
    // at 15 pixels).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a character count")]
    let title_chars = ((width - 24.0) / 8.5).max(20.0) as usize;
    let mut y = 22.0;
    for line in wrap(&options.title, title_chars) {
        doc = doc.add(text(12.0, y, &line, 15.0).set("font-weight", "bold").set("class", "title"));
        y += 18.0;
    }
    doc = doc.add(text(12.0, y, &subtitle, 11.0).set("fill", "#444").set("class", "subtitle"));
    let (legend, legend_bottom) = legend(timeline, options, width, dense, y + 14.0);
    doc = doc.add(legend);
    let top = legend_bottom + 30.0;

    let (body, bottom) =
        if dense { bands(timeline, scale, top, options.max_unavailable) } else { rows(timeline, scale, top) };
    doc = doc.add(axis(scale, top, bottom));
    doc = doc.add(body);
    // Over the bars, translucent: an outage or a pause concerns every machine.
    doc = doc.add(spans(timeline, scale, top, bottom));
    doc = doc.add(markers(timeline, scale, top, bottom, dense));
    if let Some(bound) = options.bound_s.filter(|b| *b > 0.0) {
        let x = px(scale.x(bound));
        doc = doc.add(
            SvgGroup::new()
                .set("class", "bound")
                .set("data-t", bound)
                .add(
                    Line::new()
                        .set("x1", x)
                        .set("x2", x)
                        .set("y1", top - 24.0)
                        .set("y2", bottom)
                        .set("stroke", "#000")
                        .set("stroke-width", 1.5)
                        .set("stroke-dasharray", "6 3"),
                )
                .add(if x + 90.0 > width {
                    text(x - 3.0, top - 16.0, "physical bound", 10.0).set("text-anchor", "end")
                } else {
                    text(x + 3.0, top - 16.0, "physical bound", 10.0)
                })
                .add(Title::new(format!("physical bound {}", clock(bound)))),
        );
    }
    let height = bottom + 44.0;
    Document::new()
        .set("width", width)
        .set("height", px(height))
        .set("viewBox", (0, 0, width, px(height)))
        .set("font-family", FONT)
        .add(Rectangle::new().set("width", "100%").set("height", "100%").set("fill", "#ffffff"))
        .add(doc)
}

fn text(x: f64, y: f64, content: &str, size: f64) -> Text {
    Text::new(content).set("x", px(x)).set("y", px(y)).set("font-size", size)
}

/// The legend: the phases drawn, the markers and spans present, the bound; and its bottom.
fn legend(timeline: &Timeline, options: &Options, width: f64, dense: bool, top: f64) -> (SvgGroup, f64) {
    let phases: Vec<Phase> = Phase::ALL
        .iter()
        .copied()
        .filter(|p| timeline.rows.iter().any(|m| m.bars.iter().any(|b| b.phase == *p)))
        .collect();
    let mut items: Vec<(String, SvgGroup)> = Vec::new();
    for phase in phases {
        let swatch = if dense && phase.is_final() {
            // Drawn as the share of machines, a line.
            let stroke = if phase == Phase::Failed { colour(phase) } else { "#00734F" };
            SvgGroup::new().add(
                Line::new()
                    .set("x1", 0)
                    .set("x2", 12)
                    .set("y1", 5)
                    .set("y2", 5)
                    .set("stroke", stroke)
                    .set("stroke-width", 2),
            )
        } else {
            SvgGroup::new().add(Rectangle::new().set("width", 12).set("height", 10).set("fill", colour(phase)))
        };
        let label =
            if dense && phase.is_final() { format!("{} (share)", phase.label()) } else { phase.label().to_owned() };
        items.push((label, SvgGroup::new().set("data-phase", phase.key()).add(swatch)));
    }
    let mut kinds: Vec<MarkerKind> = timeline.markers.iter().map(|m| m.kind).collect();
    kinds.dedup();
    let mut seen = Vec::new();
    for kind in kinds {
        if seen.contains(&kind) {
            continue;
        }
        seen.push(kind);
        let glyph = glyph(kind, 6.0, 5.0);
        items.push((marker_label(kind).to_owned(), SvgGroup::new().set("data-kind", kind.key()).add(glyph)));
    }
    let mut span_kinds: Vec<SpanKind> = Vec::new();
    for span in &timeline.spans {
        if !span_kinds.contains(&span.kind) {
            span_kinds.push(span.kind);
        }
    }
    for kind in span_kinds {
        let (fill, label) = span_style(kind);
        let swatch = Rectangle::new().set("width", 12).set("height", 10).set("fill", fill).set("fill-opacity", 0.25);
        items.push((label.to_owned(), SvgGroup::new().set("data-kind", kind.key()).add(swatch)));
    }
    if options.bound_s.is_some() {
        let line = Line::new()
            .set("x1", 0)
            .set("x2", 12)
            .set("y1", 5)
            .set("y2", 5)
            .set("stroke", "#000")
            .set("stroke-width", 1.5)
            .set("stroke-dasharray", "4 2");
        items.push(("physical bound".to_owned(), SvgGroup::new().set("data-kind", "bound").add(line)));
    }
    if dense {
        let line = Line::new()
            .set("x1", 0)
            .set("x2", 12)
            .set("y1", 5)
            .set("y2", 5)
            .set("stroke", "#333")
            .set("stroke-width", 1.2)
            .set("stroke-dasharray", "5 3");
        let words = if options.max_unavailable.is_some() { "limit (maxUnavailable)" } else { "limit" };
        items.push((words.to_owned(), SvgGroup::new().set("data-kind", "limit").add(line)));
    }
    let mut group = SvgGroup::new().set("class", "legend");
    let (mut x, mut y) = (12.0, top);
    for (label, swatch) in items {
        // About 6 pixels a character at 10 pixels.
        let item_width = 20.0 + 6.0 * label.chars().count() as f64 + 14.0;
        if x + item_width > width - 12.0 {
            x = 12.0;
            y += 16.0;
        }
        group = group.add(
            SvgGroup::new()
                .set("class", "legend-item")
                .set("transform", format!("translate({},{})", px(x), px(y)))
                .add(swatch)
                .add(text(17.0, 9.0, &label, 10.0)),
        );
        x += item_width;
    }
    (group, y + 10.0)
}

/// A marker's glyph centred at (`x`, `y`).
fn glyph(kind: MarkerKind, x: f64, y: f64) -> SvgGroup {
    let colour = marker_colour(kind);
    let group = SvgGroup::new();
    match kind {
        MarkerKind::AbFallback => {
            let data = Data::new()
                .move_to((px(x - 4.0), px(y - 4.0)))
                .line_to((px(x + 4.0), px(y + 4.0)))
                .move_to((px(x - 4.0), px(y + 4.0)))
                .line_to((px(x + 4.0), px(y - 4.0)));
            group.add(Path::new().set("d", data).set("stroke", colour).set("stroke-width", 2.2))
        }
        MarkerKind::Failure => group.add(
            Rectangle::new()
                .set("x", px(x - 3.5))
                .set("y", px(y - 3.5))
                .set("width", 7)
                .set("height", 7)
                .set("fill", colour),
        ),
        MarkerKind::EtcdSnapshot => group.add(
            Polygon::new()
                .set(
                    "points",
                    format!(
                        "{},{} {},{} {},{} {},{}",
                        px(x),
                        px(y - 5.0),
                        px(x + 5.0),
                        px(y),
                        px(x),
                        px(y + 5.0),
                        px(x - 5.0),
                        px(y)
                    ),
                )
                .set("fill", colour),
        ),
        MarkerKind::EtcdMemberBack => group.add(
            Circle::new()
                .set("cx", px(x))
                .set("cy", px(y))
                .set("r", 2.5)
                .set("fill", "#fff")
                .set("stroke", colour)
                .set("stroke-width", 1.5),
        ),
        MarkerKind::EtcdGate | MarkerKind::Refused | MarkerKind::ControllerRestart => group.add(
            Polygon::new()
                .set(
                    "points",
                    format!(
                        "{},{} {},{} {},{}",
                        px(x - 4.5),
                        px(y - 4.0),
                        px(x + 4.5),
                        px(y - 4.0),
                        px(x),
                        px(y + 4.0)
                    ),
                )
                .set("fill", colour),
        ),
    }
}

/// The time axis, its ticks and grid, under the plot from `top` to `bottom`.
fn axis(scale: Scale, top: f64, bottom: f64) -> SvgGroup {
    const STEPS: [f64; 16] = [
        10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 10800.0, 14400.0, 21600.0, 43200.0,
        86400.0,
    ];
    let step = STEPS.iter().copied().find(|s| scale.t1 / s <= 12.0).unwrap_or(86400.0);
    let mut group = SvgGroup::new()
        .set("class", "axis")
        .set("data-x0", scale.x0)
        .set("data-x1", px(scale.x1))
        .set("data-t0", 0)
        .set("data-t1", px(scale.t1))
        .add(
            Line::new()
                .set("x1", scale.x0)
                .set("x2", px(scale.x1))
                .set("y1", px(bottom))
                .set("y2", px(bottom))
                .set("stroke", "#333"),
        );
    let mut t = 0.0;
    while t <= scale.t1 {
        let x = px(scale.x(t));
        let s = t as u64;
        let label = if step >= 60.0 { format!("{}:{:02}", s / 3600, (s / 60) % 60) } else { clock(t) };
        group = group
            .add(
                Line::new().set("x1", x).set("x2", x).set("y1", px(top)).set("y2", px(bottom)).set("stroke", "#e6e6e6"),
            )
            .add(
                Line::new()
                    .set("x1", x)
                    .set("x2", x)
                    .set("y1", px(bottom))
                    .set("y2", px(bottom + 4.0))
                    .set("stroke", "#333"),
            )
            .add(text(x, bottom + 16.0, &label, 10.0).set("text-anchor", "middle").set("class", "tick"));
        t += step;
    }
    let unit = if step >= 60.0 { "h:mm" } else { "h:mm:ss" };
    group.add(
        text((scale.x0 + scale.x1) / 2.0, bottom + 32.0, &format!("time since the start ({unit})"), 10.0)
            .set("text-anchor", "middle")
            .set("fill", "#444"),
    )
}

/// Where a bar is drawn to: its end, except that a last phase that lasts (converged,
/// removed, failed) runs to the axis' end.
fn drawn_end(bar: &crate::model::Bar, timeline: &Timeline, scale: Scale) -> f64 {
    match bar.end {
        Some(end) if bar.phase.is_final() && end >= timeline.end => scale.t1,
        Some(end) => end,
        None => scale.t1,
    }
}

/// The height of a row when there are `n`: thinner as there are more, to fit.
fn row_height(n: usize) -> f64 {
    (ROWS_HEIGHT / n as f64).clamp(ROW_MIN, ROW_MAX)
}

/// One row per machine, from `top`; and the rows' bottom.
fn rows(timeline: &Timeline, scale: Scale, top: f64) -> (SvgGroup, f64) {
    let n = timeline.rows.len().max(1);
    let h = row_height(n);
    let bar_h = if h >= 6.0 { h * 0.78 } else { h };
    let stride = (LABEL_HEIGHT / h).ceil().max(1.0) as usize;
    let mut group = SvgGroup::new().set("class", "rows").set("data-row-height", px(h)).set("data-label-every", stride);
    let mut last_group_label = f64::NEG_INFINITY;
    for (g, wave) in timeline.groups.iter().enumerate() {
        let y = top + wave.first as f64 * h;
        let height = wave.len as f64 * h;
        if g % 2 == 1 {
            group = group.add(
                Rectangle::new()
                    .set("x", 0)
                    .set("y", px(y))
                    .set("width", px(scale.x1))
                    .set("height", px(height))
                    .set("fill", "#f3f3f3"),
            );
        }
        if y - last_group_label >= LABEL_HEIGHT {
            last_group_label = y;
            group = group.add(
                text(4.0, y + LABEL_HEIGHT.min(height.max(9.0)) - 1.0, &wave.label, 9.5)
                    .set("font-weight", "bold")
                    .set("fill", "#555")
                    .set("class", "group-label"),
            );
        }
    }
    for (i, machine) in timeline.rows.iter().enumerate() {
        let y = top + i as f64 * h;
        let group_label =
            timeline.groups.iter().find(|g| (g.first..g.first + g.len).contains(&i)).map_or("", |g| g.label.as_str());
        let mut row = SvgGroup::new()
            .set("class", "row")
            .set("data-node", machine.node.as_str())
            .set("data-role", machine.role.as_str())
            .set("data-group", group_label);
        if i % stride == 0 {
            row = row.add(
                text(
                    PLOT_LEFT - 6.0,
                    y + h.min(LABEL_HEIGHT) - 1.0,
                    &machine.node,
                    (h.min(LABEL_HEIGHT) - 1.0).max(8.0),
                )
                .set("text-anchor", "end")
                .set("class", "label"),
            );
        }
        for bar in &machine.bars {
            let end = drawn_end(bar, timeline, scale);
            let x = px(scale.x(bar.start));
            let w = px((scale.x(end) - scale.x(bar.start)).max(0.6).min(scale.x1 - x));
            row = row.add(
                Rectangle::new()
                    .set("class", "bar")
                    .set("data-phase", bar.phase.key())
                    .set("data-start", px(bar.start))
                    .set("data-end", px(end))
                    .set("x", x)
                    .set("y", px(y + (h - bar_h) / 2.0))
                    .set("width", w)
                    .set("height", px(bar_h))
                    .set("fill", colour(bar.phase))
                    .add(Title::new(format!(
                        "{}: {} {} to {}",
                        machine.node,
                        bar.phase.label(),
                        clock(bar.start),
                        clock(end)
                    ))),
            );
        }
        group = group.add(row);
    }
    (group, top + n as f64 * h)
}

/// A tick step for counts up to `most`: 1, 2 or 5 times a power of ten, five ticks at most
/// above zero.
fn count_step(most: i64) -> i64 {
    let mut power = 1;
    loop {
        for m in [1, 2, 5] {
            if most <= m * power * 5 {
                return m * power;
            }
        }
        power *= 10;
    }
}

/// Stacked areas, one per phase of `phases` (indices into [`Phase::ALL`]) that is ever
/// present, from the baseline `base` (pixels) up, `per` pixels a machine.
fn stacked(
    counts: &[Vec<i64>],
    phases: &[usize],
    bins: usize,
    bin_x: &dyn Fn(usize) -> f64,
    base: f64,
    per: f64,
    label: &str,
) -> Vec<Polygon> {
    let mut areas = Vec::new();
    let mut below = vec![0i64; bins];
    for &p in phases {
        let phase = Phase::ALL[p];
        if counts[p].iter().all(|c| *c == 0) {
            continue;
        }
        let stack_y = |stack: i64| px(base - stack as f64 * per);
        let mut points: Vec<String> = Vec::with_capacity(bins * 4);
        for b in 0..bins {
            let top_stack = below[b] + counts[p][b];
            points.push(format!("{},{}", bin_x(b), stack_y(top_stack)));
            points.push(format!("{},{}", bin_x(b + 1), stack_y(top_stack)));
        }
        for b in (0..bins).rev() {
            points.push(format!("{},{}", bin_x(b + 1), stack_y(below[b])));
            points.push(format!("{},{}", bin_x(b), stack_y(below[b])));
        }
        let most = counts[p][..bins].iter().max().copied().unwrap_or(0);
        areas.push(
            Polygon::new()
                .set("class", "area")
                .set("data-phase", phase.key())
                .set("data-most", most)
                .set("points", points.join(" "))
                .set("fill", colour(phase))
                .add(Title::new(format!("{label}: {} (at most {most} at once)", phase.label()))),
        );
        for b in 0..bins {
            below[b] += counts[p][b];
        }
    }
    areas
}

/// One density band per role, from `top`; and the bands' bottom.
///
/// A band stacks how many machines are in each phase of their turn over time: the
/// phases that make a machine unavailable, and the only ones counted against the limit,
/// drawn as a dashed line (`max_unavailable` for the workers, one at a time for the
/// control planes). Its left axis counts machines; the control planes' band is sized to
/// their number. A line shows the share converged (or removed), and one the share
/// failed, against the right axis (per cent of the role's machines). Under the band, a
/// strip counts the machines ahead of their turn (pulling the image early, held by the
/// preflight), on its own scale: they are not unavailable.
fn bands(timeline: &Timeline, scale: Scale, top: f64, max_unavailable: Option<usize>) -> (SvgGroup, f64) {
    let bins = ((scale.x1 - scale.x0) / BIN_PX).ceil().max(1.0) as usize;
    let dt = scale.t1 / bins as f64;
    let bin_x = |b: usize| px((scale.x0 + b as f64 * BIN_PX).min(scale.x1));
    let mut group = SvgGroup::new().set("class", "bands");
    let mut y = top;
    let in_turn: Vec<usize> = (0..Phase::ALL.len()).filter(|p| Phase::ALL[*p].in_turn()).collect();
    let waiting: Vec<usize> =
        (0..Phase::ALL.len()).filter(|p| !Phase::ALL[*p].in_turn() && !Phase::ALL[*p].is_final()).collect();
    for (role, label) in [(crate::trace::CONTROL_PLANE, "control planes"), (crate::trace::WORKER, "workers")] {
        let machines: Vec<_> = timeline.rows.iter().filter(|m| m.role == role).collect();
        if machines.is_empty() {
            continue;
        }
        // Per phase, how many machines are in it in each bin (sampled at the bin's middle).
        let mut counts = vec![vec![0i64; bins + 1]; Phase::ALL.len()];
        for machine in &machines {
            for bar in &machine.bars {
                let p = Phase::ALL.iter().position(|q| *q == bar.phase).unwrap_or(0);
                let end = drawn_end(bar, timeline, scale);
                let first = ((bar.start / dt) - 0.5).ceil().max(0.0) as usize;
                let last = (((end / dt) - 0.5).ceil().max(0.0) as usize).min(bins);
                if first < last {
                    counts[p][first] += 1;
                    counts[p][last] -= 1;
                }
            }
        }
        for row in &mut counts {
            let mut running = 0;
            for c in row.iter_mut() {
                running += *c;
                *c = running;
            }
        }
        let sum_over = |phases: &[usize], b: usize| phases.iter().map(|p| counts[*p][b]).sum::<i64>();
        let most_in_turn = (0..bins).map(|b| sum_over(&in_turn, b)).max().unwrap_or(0);
        let control_planes = role == crate::trace::CONTROL_PLANE;
        let n = machines.len() as i64;
        // The control planes: one at a time, on a panel their size (all of them on its
        // axis); the workers: the limit given, on an axis up to the most in turn or it.
        let (limit, height, most) = if control_planes {
            (Some(1), (n as f64 * CONTROL_PLANE_PX).clamp(BAND_HEIGHTS.0, BAND_HEIGHTS.1), n.max(1))
        } else {
            let limit = max_unavailable.map(|m| m as i64);
            (limit, BAND_HEIGHTS.1, most_in_turn.max(limit.unwrap_or(0)).max(1))
        };
        let step = count_step(most);
        let axis_top = (most + step - 1) / step * step;
        let per = height / axis_top as f64;
        let base = y + height;
        let mut band = SvgGroup::new()
            .set("class", "band")
            .set("data-role", role)
            .set("data-machines", machines.len())
            .set("data-most-active", most_in_turn)
            .set("data-axis-top", axis_top)
            .add(
                Rectangle::new()
                    .set("class", "frame")
                    .set("x", scale.x0)
                    .set("y", px(y))
                    .set("width", px(scale.x1 - scale.x0))
                    .set("height", px(height))
                    .set("fill", "#fafafa")
                    .set("stroke", "#ccc"),
            );
        for (i, (line, size)) in [
            (label.to_owned(), 10.5),
            (format!("{} machines", machines.len()), 9.5),
            ("areas: machines in turn".to_owned(), 9.0),
            ("line: share done (right)".to_owned(), 9.0),
        ]
        .into_iter()
        .enumerate()
        {
            let mut t = text(BAND_LABEL_RIGHT, y + 11.0 + i as f64 * 12.0, &line, size).set("text-anchor", "end");
            t = if i == 0 { t.set("font-weight", "bold") } else { t.set("fill", "#555") };
            band = band.add(t.set("class", "band-label"));
        }
        // The left axis: machines in turn.
        let mut k = 0;
        while k <= axis_top {
            let ty = px(base - k as f64 * per);
            band = band
                .add(
                    Line::new()
                        .set("x1", scale.x0 - 4.0)
                        .set("x2", scale.x0)
                        .set("y1", ty)
                        .set("y2", ty)
                        .set("stroke", "#333"),
                )
                .add(
                    text(scale.x0 - 6.0, ty + 3.0, &k.to_string(), 8.5)
                        .set("text-anchor", "end")
                        .set("class", "y-tick"),
                );
            k += step;
        }
        // The right axis: the share done, in per cent of the role's machines.
        for share in [0, 50, 100] {
            let ty = px(base - f64::from(share) / 100.0 * height);
            band = band
                .add(
                    Line::new()
                        .set("x1", scale.x1)
                        .set("x2", scale.x1 + 3.0)
                        .set("y1", ty)
                        .set("y2", ty)
                        .set("stroke", "#00734F"),
                )
                .add(
                    text(scale.x1 + 4.0, ty + 3.0, &format!("{share}%"), 8.0)
                        .set("fill", "#00734F")
                        .set("class", "share-tick"),
                );
        }
        for area in stacked(&counts, &in_turn, bins, &bin_x, base, per, label) {
            band = band.add(area);
        }
        if let Some(limit) = limit {
            let ly = px(base - limit as f64 * per);
            let words = if control_planes { "one at a time".to_owned() } else { format!("maxUnavailable {limit}") };
            band = band.add(
                SvgGroup::new()
                    .set("class", "limit")
                    .set("data-limit", limit)
                    .add(
                        Line::new()
                            .set("x1", scale.x0)
                            .set("x2", px(scale.x1))
                            .set("y1", ly)
                            .set("y2", ly)
                            .set("stroke", "#333")
                            .set("stroke-width", 1.2)
                            .set("stroke-dasharray", "5 3"),
                    )
                    // At the left, where the bound's label is not, on a halo over the areas.
                    .add(
                        text(scale.x0 + 4.0, ly - 3.0, &words, 9.0)
                            .set("fill", "#333")
                            .set("stroke", "#fff")
                            .set("stroke-width", 3)
                            .set("paint-order", "stroke"),
                    )
                    .add(Title::new(format!("{label}: {words} (machines in turn, at most {most_in_turn} at once)"))),
            );
        }
        // The shares done and failed, as lines over the whole band's height.
        let per_machine = height / machines.len() as f64;
        for (phases, key, stroke) in [
            (&[Phase::Converged, Phase::Removed][..], "done", "#00734F"),
            (&[Phase::Failed][..], "failed", colour(Phase::Failed)),
        ] {
            let indices: Vec<usize> = phases.iter().filter_map(|q| Phase::ALL.iter().position(|p| p == q)).collect();
            let share = |b: usize| indices.iter().map(|p| counts[*p][b]).sum::<i64>();
            let most = (0..bins).map(share).max().unwrap_or(0);
            if most == 0 {
                continue;
            }
            let mut data = Data::new().move_to((bin_x(0), px(base - share(0) as f64 * per_machine)));
            for b in 0..bins {
                let level = px(base - share(b) as f64 * per_machine);
                data = data.line_to((bin_x(b), level)).line_to((bin_x(b + 1), level));
            }
            band = band.add(
                Path::new()
                    .set("class", "share")
                    .set("data-phase", key)
                    .set("data-most", most)
                    .set("d", data)
                    .set("fill", "none")
                    .set("stroke", stroke)
                    .set("stroke-width", 1.8)
                    .add(Title::new(format!("{label} {key}: up to {most} of {}", machines.len()))),
            );
        }
        y = base;
        // Under it, the machines ahead of their turn, on a scale of their own.
        let most_waiting = (0..bins).map(|b| sum_over(&waiting, b)).max().unwrap_or(0);
        if most_waiting > 0 {
            let strip_top = y + WAITING_GAP;
            let mut strip = SvgGroup::new()
                .set("class", "waiting")
                .set("data-role", role)
                .set("data-most", most_waiting)
                .add(
                    Rectangle::new()
                        .set("x", scale.x0)
                        .set("y", px(strip_top))
                        .set("width", px(scale.x1 - scale.x0))
                        .set("height", WAITING_HEIGHT)
                        .set("fill", "#fafafa")
                        .set("stroke", "#ddd"),
                )
                .add(
                    text(BAND_LABEL_RIGHT, strip_top + 11.0, "ahead of turn", 9.0)
                        .set("text-anchor", "end")
                        .set("fill", "#555")
                        .set("class", "band-label"),
                )
                .add(
                    text(BAND_LABEL_RIGHT, strip_top + 22.0, "(not unavailable)", 8.5)
                        .set("text-anchor", "end")
                        .set("fill", "#777")
                        .set("class", "band-label"),
                );
            let strip_base = strip_top + WAITING_HEIGHT;
            let per_waiting = WAITING_HEIGHT / most_waiting as f64;
            // Its scale: the most at once, at its top (its zero is the band's).
            strip = strip.add(
                text(scale.x0 - 6.0, strip_top + 8.0, &most_waiting.to_string(), 8.5)
                    .set("text-anchor", "end")
                    .set("class", "y-tick"),
            );
            for area in stacked(&counts, &waiting, bins, &bin_x, strip_base, per_waiting, label) {
                strip = strip.add(area);
            }
            band = band.add(strip);
            y = strip_base;
        }
        group = group.add(band);
        y += BAND_GAP;
    }
    (group, y - BAND_GAP)
}

/// The spans (outages, pauses) across the plot.
fn spans(timeline: &Timeline, scale: Scale, top: f64, bottom: f64) -> SvgGroup {
    let mut group = SvgGroup::new().set("class", "spans");
    for span in &timeline.spans {
        let (fill, label) = span_style(span.kind);
        let end = span.end.unwrap_or(timeline.end);
        let x = px(scale.x(span.start));
        group = group.add(
            Rectangle::new()
                .set("class", "span")
                .set("data-kind", span.kind.key())
                .set("x", x)
                .set("y", px(top))
                .set("width", px((scale.x(end) - scale.x(span.start)).max(1.0)))
                .set("height", px(bottom - top))
                .set("fill", fill)
                .set("fill-opacity", 0.16)
                .add(Title::new(format!("{label} {} to {}: {}", clock(span.start), clock(end), span.text))),
        );
    }
    group
}

/// The markers: on their machine's row when there are rows, in the strip above the plot
/// otherwise; an etcd snapshot also as a line across.
fn markers(timeline: &Timeline, scale: Scale, top: f64, bottom: f64, dense: bool) -> SvgGroup {
    let h = row_height(timeline.rows.len().max(1));
    let mut group = SvgGroup::new().set("class", "markers");
    for marker in &timeline.markers {
        let x = scale.x(marker.t);
        let row = marker.node.as_ref().and_then(|node| timeline.rows.iter().position(|m| &m.node == node));
        let y = match row {
            Some(i) if !dense => top + (i as f64 + 0.5) * h,
            _ => top - 6.0,
        };
        let mut item =
            SvgGroup::new().set("class", "marker").set("data-kind", marker.kind.key()).set("data-t", px(marker.t));
        if marker.kind == MarkerKind::EtcdSnapshot {
            item = item.add(
                Line::new()
                    .set("x1", px(x))
                    .set("x2", px(x))
                    .set("y1", px(top))
                    .set("y2", px(bottom))
                    .set("stroke", marker_colour(marker.kind))
                    .set("stroke-width", 1)
                    .set("stroke-dasharray", "2 3"),
            );
        }
        let who = marker.node.as_deref().map(|n| format!("{n}: ")).unwrap_or_default();
        item = item.add(glyph(marker.kind, x, y)).add(Title::new(format!(
            "{} at {}: {who}{}",
            marker_label(marker.kind),
            clock(marker.t),
            marker.text
        )));
        group = group.add(item);
    }
    group
}
