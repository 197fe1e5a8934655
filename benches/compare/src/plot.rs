//! Draws `report.svg`, a chart sized to be read at 100% on a laptop screen (and in the README):
//! one row per workload, its name and unit on the left, and one horizontal bar per peer (tokio
//! and Go; the other peers stay in the tables) giving fibra's cost relative to that peer on a
//! log-scale x axis. Bars start at the line at 1.0: left of it (below 1) fibra is cheaper or
//! faster, right of it fibra costs more. For times, latencies, CPU and memory the bar is
//! fibra/peer; for the http rows in req/s (higher is better) it is peer/fibra
//! ([`cost_ratio`]), so "below 1 = fibra ahead" holds for every bar.
//!
//! Each bar carries its ratio (`0.45×`). A peer with no figure for a row (skipped, failed, not
//! run) gets a short mark (`Go: skip`) instead of a bar; a ratio beyond the axis (0.01 to 100
//! at most) gets a bar to the axis end, an arrow, and its real value.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::driver::Status;
use crate::report::{cost_ratio, others, Row};
use crate::workloads::Peer;

/// The peers with a bar, in this order (when the run has a column for them).
const CHARTED: [Peer; 2] = [Peer::Tokio, Peer::Go];

/// The axis never goes beyond these ratios; bars past them are clipped and marked.
const AXIS_MIN: f64 = 0.01;
const AXIS_MAX: f64 = 100.0;

/// Fonts. plotters' SVG backend writes `font-size` as size / 1.24, so 16 gives 12.9 px text.
const FONT: &str = "sans-serif";
const TITLE_SIZE: f64 = 22.0;
const NAME_SIZE: f64 = 17.0;
const TEXT_SIZE: f64 = 16.0;

/// Horizontal layout, in px.
const WIDTH: i32 = 900;
const MARGIN: i32 = 10;
/// Right edge of the workload names.
const NAMES_RIGHT: i32 = 165;
/// Space beside the plot frame on either side for bar labels that do not fit inside it
/// (clipped bars, bars ending near the frame).
const GUTTER: i32 = 80;
const PLOT_LEFT: i32 = NAMES_RIGHT + GUTTER;
const PLOT_RIGHT: i32 = WIDTH - MARGIN - GUTTER;

// Vertical layout, in px.

/// Top of the plot frame when no note on clipped bars is needed (one more line when it is).
const PLOT_TOP: i32 = 108;
const ROW: i32 = 36;
const BAR: i32 = 13;
const BAR_GAP: i32 = 2;
const FOOTER: i32 = 62;

/// A peer's name in the chart's prose (the tables keep `go`).
fn display(peer: Peer) -> &'static str {
    match peer {
        Peer::Go => "Go",
        p => p.name(),
    }
}

fn colour(peer: Peer) -> RGBColor {
    match peer {
        Peer::Tokio => RGBColor(222, 110, 20),
        Peer::Go => RGBColor(0, 125, 190),
        Peer::FibraNet => RGBColor(150, 60, 170),
        Peer::May => RGBColor(40, 160, 60),
        Peer::Std => RGBColor(130, 130, 130),
        Peer::Fibra => RGBColor(0, 0, 0),
    }
}

const GREY: RGBColor = RGBColor(110, 110, 110);
const BAND: RGBColor = RGBColor(243, 243, 243);
const GRID: RGBColor = RGBColor(205, 205, 205);
const MINOR_GRID: RGBColor = RGBColor(228, 228, 228);

/// The chart's geometry: the pixel positions the drawing and the test agree on.
pub struct Layout {
    rows: usize,
    /// The axis range, powers of ten between [`AXIS_MIN`] and [`AXIS_MAX`].
    lo: f64,
    hi: f64,
    /// Whether some ratio lies beyond the axis (its bar is clipped).
    clipped: bool,
}

impl Layout {
    /// The axis for `ratios`: whole decades around the data and around 0.5..2 (so that 1.0 is
    /// never at the frame's edge), within [`AXIS_MIN`]..[`AXIS_MAX`].
    fn new(rows: usize, ratios: impl Iterator<Item = f64>) -> Layout {
        let (min, max) = ratios.fold((0.5f64, 2.0f64), |(lo, hi), r| (lo.min(r), hi.max(r)));
        let lo = 10f64.powf(min.log10().floor()).max(AXIS_MIN);
        let hi = 10f64.powf(max.log10().ceil()).min(AXIS_MAX);
        Layout {
            rows,
            lo,
            hi,
            clipped: min < lo || max > hi,
        }
    }

    pub fn width(&self) -> i32 {
        WIDTH
    }

    pub fn height(&self) -> i32 {
        self.plot_bottom() + FOOTER
    }

    pub fn plot_top(&self) -> i32 {
        PLOT_TOP + if self.clipped { 20 } else { 0 }
    }

    pub fn plot_bottom(&self) -> i32 {
        self.plot_top() + ROW * self.rows.max(1) as i32
    }

    /// The x of `ratio` on the axis (outside the frame when `ratio` is beyond the axis).
    pub fn x(&self, ratio: f64) -> i32 {
        let f = (ratio.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln());
        PLOT_LEFT + (f * f64::from(PLOT_RIGHT - PLOT_LEFT)).round() as i32
    }

    /// Top of row `i`.
    fn row_top(&self, i: usize) -> i32 {
        self.plot_top() + ROW * i as i32
    }

    /// Vertical centre of the bar in slot `slot` (of `slots`) of row `i`.
    fn bar_centre(&self, i: usize, slot: usize, slots: usize) -> i32 {
        let block = slots as i32 * BAR + (slots as i32 - 1).max(0) * BAR_GAP;
        let top = self.row_top(i) + (ROW - block) / 2;
        top + slot as i32 * (BAR + BAR_GAP) + BAR / 2
    }

    /// Tick values: every decade, and 2 and 5 within each decade when the axis spans at
    /// most two decades.
    fn ticks(&self) -> Vec<(f64, bool)> {
        let decades = (self.hi / self.lo).log10().round() as i32;
        let first = self.lo.log10().round() as i32;
        let mut ticks = Vec::new();
        for d in first..=first + decades {
            let p = 10f64.powi(d);
            ticks.push((p, true));
            if decades <= 2 && d < first + decades {
                ticks.push((2.0 * p, false));
                ticks.push((5.0 * p, false));
            }
        }
        ticks
    }
}

/// A ratio as a bar label: two significant digits, at least two decimals below 10
/// (`0.45×`, `0.045×`, `1.23×`, `12×`, `250×`).
pub fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() || r <= 0.0 {
        return format!("{r}×");
    }
    let mut decimals = (1 - r.log10().floor() as i32).clamp(0, 6) as usize;
    if r < 10.0 {
        decimals = decimals.max(2);
    }
    format!("{r:.decimals$}×")
}

/// A tick label: `0.01×`, `0.5×`, `1×`, `20×`.
fn fmt_tick(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}×")
}

/// Why a cell has no figure: `skip`, `FAIL`, or `–` (no cell, or no median).
fn missing(row: &Row, peer: Peer) -> &'static str {
    match row.runs.iter().find(|r| r.peer == peer).map(|r| &r.status) {
        Some(Status::Skipped(_)) => "skip",
        Some(Status::Failed(_)) => "FAIL",
        _ => "–",
    }
}

fn has_figure(row: &Row, peer: Peer) -> bool {
    row.runs
        .iter()
        .any(|r| r.peer == peer && r.median().is_some())
}

fn unit(row: &Row) -> String {
    if row.workload.lower_is_better {
        row.workload.unit.to_string()
    } else {
        format!("{}, shown peer ÷ fibra", row.workload.unit)
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Res = Result<(), Box<dyn std::error::Error>>;

fn text(area: &Area, s: &str, (x, y): (i32, i32), size: f64, c: &RGBColor, pos: Pos) -> Res {
    let style = (FONT, size).into_font().color(c).pos(pos);
    area.draw(&Text::new(s.to_string(), (x, y), style))?;
    Ok(())
}

fn bold(area: &Area, s: &str, (x, y): (i32, i32), size: f64, pos: Pos) -> Res {
    let style = (FONT, size)
        .into_font()
        .style(FontStyle::Bold)
        .color(&BLACK)
        .pos(pos);
    area.draw(&Text::new(s.to_string(), (x, y), style))?;
    Ok(())
}

const LEFT: Pos = Pos {
    h_pos: HPos::Left,
    v_pos: VPos::Center,
};
const RIGHT: Pos = Pos {
    h_pos: HPos::Right,
    v_pos: VPos::Center,
};
const CENTRE: Pos = Pos {
    h_pos: HPos::Center,
    v_pos: VPos::Center,
};

pub fn draw(rows: &[Row], path: &Path) -> Res {
    let columns = others(rows);
    let peers: Vec<Peer> = CHARTED
        .into_iter()
        .filter(|p| columns.contains(p))
        .collect();
    let ratios = rows
        .iter()
        .flat_map(|row| peers.iter().filter_map(move |&p| cost_ratio(row, p)))
        .filter(|r| r.is_finite() && *r > 0.0);
    let layout = Layout::new(rows.len(), ratios);
    let size = (layout.width() as u32, layout.height() as u32);
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;

    // Title, how to read a bar, legend.
    let names: Vec<&str> = peers.iter().map(|&p| display(p)).collect();
    let title = if names.is_empty() {
        "fibra's cost relative to its peers: no tokio or Go column in this run".to_string()
    } else {
        format!("fibra's cost relative to {}", names.join(" and "))
    };
    bold(&root, &title, (MARGIN, 20), TITLE_SIZE, LEFT)?;
    let mut x = WIDTH - MARGIN - 150 * peers.len() as i32 + 20;
    for &p in &peers {
        let c = colour(p);
        root.draw(&Rectangle::new([(x, 13), (x + 14, 27)], c.filled()))?;
        let label = format!("fibra ÷ {}", display(p));
        text(&root, &label, (x + 20, 20), TEXT_SIZE, &BLACK, LEFT)?;
        x += 150;
    }
    let notes = [
        Some(
            "Bar = fibra's median ÷ the peer's (time, latency, CPU, memory), or the peer's ÷ \
             fibra's (req/s rows).",
        ),
        Some("Log scale; below 1× fibra is cheaper or faster. skip / FAIL / –: no figure for that peer."),
        layout.clipped.then_some("◀ ▶ at an axis end: the ratio is beyond the axis; its label gives it."),
    ];
    for (i, note) in notes.into_iter().flatten().enumerate() {
        text(
            &root,
            note,
            (MARGIN, 46 + 20 * i as i32),
            TEXT_SIZE,
            &GREY,
            LEFT,
        )?;
    }

    // Row bands, names and units.
    for (i, row) in rows.iter().enumerate() {
        let top = layout.row_top(i);
        if i % 2 == 0 {
            root.draw(&Rectangle::new(
                [(MARGIN, top), (WIDTH - MARGIN, top + ROW)],
                BAND.filled(),
            ))?;
        }
        let mid = top + ROW / 2;
        bold(
            &root,
            row.workload.name,
            (NAMES_RIGHT, mid - 7),
            NAME_SIZE,
            RIGHT,
        )?;
        text(
            &root,
            &unit(row),
            (NAMES_RIGHT, mid + 9),
            TEXT_SIZE - 1.0,
            &GREY,
            RIGHT,
        )?;
    }

    // Frame, grid, ticks.
    let (top, bottom) = (layout.plot_top(), layout.plot_bottom());
    for (v, major) in layout.ticks() {
        let x = layout.x(v);
        let c = if major { GRID } else { MINOR_GRID };
        root.draw(&PathElement::new(vec![(x, top), (x, bottom)], c))?;
        root.draw(&PathElement::new(vec![(x, bottom), (x, bottom + 5)], BLACK))?;
        let label = fmt_tick(v);
        if v == 1.0 {
            bold(&root, &label, (x, bottom + 16), TEXT_SIZE, CENTRE)?;
        } else {
            text(&root, &label, (x, bottom + 16), TEXT_SIZE, &BLACK, CENTRE)?;
        }
    }
    root.draw(&Rectangle::new(
        [(PLOT_LEFT, top), (PLOT_RIGHT, bottom)],
        BLACK.stroke_width(1),
    ))?;
    let axis = format!(
        "fibra cost ÷ {} cost (log scale)",
        if names.is_empty() {
            "peer".to_string()
        } else {
            names.join(" or ")
        }
    );
    text(
        &root,
        &axis,
        ((PLOT_LEFT + PLOT_RIGHT) / 2, bottom + 40),
        TEXT_SIZE,
        &BLACK,
        CENTRE,
    )?;

    // Bars.
    let one = layout.x(1.0);
    for (i, row) in rows.iter().enumerate() {
        if !has_figure(row, Peer::Fibra) {
            let why = match missing(row, Peer::Fibra) {
                "–" => "no fibra figure".to_string(),
                m => format!("fibra: {m}"),
            };
            let y = layout.row_top(i) + ROW / 2;
            text(&root, &why, (one + 8, y), TEXT_SIZE, &GREY, LEFT)?;
            continue;
        }
        for (slot, &p) in peers.iter().enumerate() {
            let y = layout.bar_centre(i, slot, peers.len());
            let c = colour(p);
            let Some(r) = cost_ratio(row, p).filter(|r| r.is_finite() && *r > 0.0) else {
                let mark = format!("{}: {}", display(p), missing(row, p));
                text(&root, &mark, (one + 6, y), TEXT_SIZE, &c, LEFT)?;
                continue;
            };
            let clipped = r < layout.lo || r > layout.hi;
            let tip = layout.x(r.clamp(layout.lo, layout.hi));
            let (x0, x1) = if tip < one { (tip, one) } else { (one, tip) };
            // At least 2 px, so that a ratio of 1.00 still shows.
            let x1 = x1.max(x0 + 2);
            root.draw(&Rectangle::new(
                [(x0, y - BAR / 2), (x1, y + BAR / 2 + 1)],
                c.filled(),
            ))?;
            let label = fmt_ratio(r);
            let right = r >= 1.0;
            let mut at = if right { x1 + 4 } else { x0 - 4 };
            if clipped {
                // An arrow past the frame's edge, pointing the way the bar goes on.
                let (e, d) = if right {
                    (PLOT_RIGHT, 1)
                } else {
                    (PLOT_LEFT, -1)
                };
                root.draw(&Polygon::new(
                    vec![
                        (e + d * 2, y - BAR / 2 - 1),
                        (e + d * 11, y),
                        (e + d * 2, y + BAR / 2 + 1),
                    ],
                    c.filled(),
                ))?;
                at = e + d * 14;
            }
            let pos = if right { LEFT } else { RIGHT };
            text(&root, &label, (at, y), TEXT_SIZE, &BLACK, pos)?;
        }
    }

    // The line at 1.0, over the bars, and which side is which.
    root.draw(&PathElement::new(
        vec![(one, top - 6), (one, bottom)],
        BLACK.stroke_width(2),
    ))?;
    text(
        &root,
        "◀ fibra cheaper / faster",
        (one - 8, top - 12),
        TEXT_SIZE,
        &BLACK,
        RIGHT,
    )?;
    text(
        &root,
        "fibra costlier / slower ▶",
        (one + 8, top - 12),
        TEXT_SIZE,
        &BLACK,
        LEFT,
    )?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::PeerRun;
    use crate::workloads::{applies, WORKLOADS};

    fn run(peer: Peer, status: Status, median: f64) -> PeerRun {
        PeerRun {
            peer,
            status,
            samples: vec![median * 0.98, median, median * 1.03],
            notes: Vec::new(),
            also: Vec::new(),
        }
    }

    /// Every workload of the harness, with made-up medians: fibra at 100, tokio and Go at
    /// ratios spread over 0.2..5, and some special cases.
    fn rows() -> Vec<Row> {
        WORKLOADS
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let f = 100.0;
                // tokio's and Go's cost ratio for this row (fibra ÷ peer, or peer ÷ fibra).
                let mut t = 0.2 * 25f64.powf((i * 7 % 31) as f64 / 30.0);
                let mut g = 0.3 * 12f64.powf((i * 11 % 31) as f64 / 30.0);
                let mut go = Status::Ok;
                let mut fibra = Status::Ok;
                match w.name {
                    "async_round_trip" => {
                        t = 250.0;
                        go = Status::Skipped("no async runtime to bridge to".into());
                    }
                    "block_on_ready" => go = Status::Skipped("no async runtime".into()),
                    "mpmc" | "broadcast" | "http_hooked" => {
                        go = Status::Skipped("no version".into())
                    }
                    "skynet" => g = 0.004,
                    "sleep_storm" => go = Status::Failed("killed after 60 s".into()),
                    "redis_get" => fibra = Status::Failed("panicked".into()),
                    "yield_many" => t = 1.0,
                    _ => {}
                }
                let peer_median = |r: f64| if w.lower_is_better { f / r } else { f * r };
                let runs = [
                    run(Peer::Fibra, fibra, f),
                    run(Peer::FibraNet, Status::Ok, 95.0),
                    run(Peer::Tokio, Status::Ok, peer_median(t)),
                    run(Peer::May, Status::Ok, 50.0),
                    run(Peer::Go, go, peer_median(g)),
                    run(
                        Peer::Std,
                        Status::Skipped("not a thread workload".into()),
                        1.0,
                    ),
                ]
                .into_iter()
                .filter(|r| applies(r.peer, w.name))
                .collect();
                Row { workload: w, runs }
            })
            .collect()
    }

    /// The value of attribute `name` in the SVG tag `tag`.
    fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
        let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        tag[start..].split('"').next()
    }

    /// Draws `rows` into a temporary file and returns the SVG. The file is removed unless
    /// `FIBRA_COMPARE_KEEP_PLOT` is set (to look at the chart: `rsvg-convert` it to PNG).
    fn render(rows: &[Row], tag: &str) -> String {
        let pid = std::process::id();
        let path = std::env::temp_dir().join(format!("fibra-compare-plot-{pid}-{tag}.svg"));
        draw(rows, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        if std::env::var_os("FIBRA_COMPARE_KEEP_PLOT").is_some() {
            eprintln!("chart kept at {}", path.display());
        } else {
            std::fs::remove_file(&path).unwrap();
        }
        svg
    }

    /// The `<svg>` element's width and height.
    fn size(svg: &str) -> (f64, f64) {
        let open = &svg[svg.find("<svg").unwrap()..];
        let open = &open[..open.find('>').unwrap()];
        let get = |a| attr(open, a).unwrap().parse().unwrap();
        (get("width"), get("height"))
    }

    /// Every `<text>` element: its attributes and its text.
    fn texts(svg: &str) -> Vec<(&str, &str)> {
        svg.split("<text")
            .skip(1)
            .map(|t| {
                let (tag, rest) = t.split_once('>').unwrap();
                (tag, rest.split("</text>").next().unwrap().trim())
            })
            .collect()
    }

    #[test]
    fn the_chart_reads_at_page_width() {
        let rows = rows();
        assert!(rows.len() >= 30);
        let svg = render(&rows, "all");
        let (width, height) = size(&svg);
        assert!(width <= 1000.0, "{width}");
        assert!(height >= 30.0 * rows.len() as f64, "{height}");

        // Every workload has its row label, and no text is under 12 px.
        let texts = texts(&svg);
        let said = |s: &str| texts.iter().any(|(_, t)| *t == s);
        for row in &rows {
            assert!(
                said(row.workload.name),
                "no label for {}",
                row.workload.name
            );
        }
        for (tag, t) in &texts {
            let px: f64 = attr(tag, "font-size").unwrap().parse().unwrap();
            assert!(px >= 12.0, "{t:?}: {px} px");
        }

        // The line at 1.0, across every row, and the note on which side is which.
        let layout = Layout::new(rows.len(), [0.004, 250.0].into_iter());
        let x = layout.x(1.0);
        let line = format!(
            "points=\"{x},{} {x},{} \"",
            layout.plot_top() - 6,
            layout.plot_bottom()
        );
        assert!(svg.contains(&line), "no line at 1.0 ({line})");
        assert!(said("1×"));
        assert!(said("◀ fibra cheaper / faster") && said("fibra costlier / slower ▶"));

        // Every bar carries its ratio; the legend names both peers; ticks span the axis,
        // which stops at 0.01 and 100.
        let mut bars = 0;
        for row in &rows {
            for peer in [Peer::Tokio, Peer::Go] {
                if let Some(r) = cost_ratio(row, peer) {
                    assert!(
                        said(&fmt_ratio(r)),
                        "{} / {:?}: no {}",
                        row.workload.name,
                        peer,
                        fmt_ratio(r)
                    );
                    bars += 1;
                }
            }
        }
        assert!(bars >= 50, "{bars}");
        assert!(said("fibra ÷ tokio") && said("fibra ÷ Go"));
        assert!(!said("fibra ÷ may") && !said("fibra ÷ std"));
        for tick in ["0.01×", "0.1×", "10×", "100×"] {
            assert!(said(tick), "no tick {tick}");
        }
        // Clipped ratios keep their value; rows without a figure keep a mark.
        assert!(said("250×") && said("0.0040×"));
        assert!(svg.contains("the ratio is beyond the axis"));
        assert!(said("Go: skip") && said("Go: FAIL") && said("fibra: FAIL"));
    }

    #[test]
    fn a_run_without_extremes_gets_a_close_axis() {
        let rows: Vec<Row> = rows()
            .into_iter()
            .filter(|r| {
                ["spawn_many", "yield_many", "ping_pong", "http"].contains(&r.workload.name)
            })
            .collect();
        let svg = render(&rows, "few");
        let texts = texts(&svg);
        let said = |s: &str| texts.iter().any(|(_, t)| *t == s);
        for tick in ["0.1×", "0.2×", "0.5×", "1×", "2×", "5×", "10×"] {
            assert!(said(tick), "no tick {tick}");
        }
        assert!(!said("0.01×") && !said("100×"));
        assert!(!svg.contains("beyond the axis"));
        assert!(size(&svg).0 <= 1000.0);
        // No rows at all still gives a chart.
        render(&[], "none");
    }

    #[test]
    fn ratio_labels() {
        assert_eq!(fmt_ratio(0.45), "0.45×");
        assert_eq!(fmt_ratio(0.045), "0.045×");
        assert_eq!(fmt_ratio(1.0), "1.00×");
        assert_eq!(fmt_ratio(1.234), "1.23×");
        assert_eq!(fmt_ratio(12.3), "12×");
        assert_eq!(fmt_ratio(250.0), "250×");
        assert_eq!(fmt_tick(0.01), "0.01×");
        assert_eq!(fmt_tick(0.5), "0.5×");
        assert_eq!(fmt_tick(20.0), "20×");
    }
}
