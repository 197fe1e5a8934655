//! Draws `report.svg`: for each workload, one bar per peer giving fibra's cost relative to that
//! peer (log scale), with a line at 1.0. Bars below the line mean fibra is ahead. For times, CPU
//! and memory the bar is fibra/peer; for http, http_cont and http_hooked (req/s, higher is better) it is
//! peer/fibra, so "below 1 = fibra ahead" holds for every bar. `fibra-net` (fibra's own
//! `fibra::net` server, in the http_hooked rows only) gets a bar like the other peers.

use std::path::Path;

use plotters::prelude::*;

use crate::report::{cost_ratio, fmt_value, others, Row};
use crate::workloads::Peer;

fn colour(peer: Peer) -> RGBColor {
    match peer {
        Peer::FibraNet => RGBColor(150, 60, 170),
        Peer::Tokio => RGBColor(230, 120, 20),
        Peer::May => RGBColor(40, 160, 60),
        Peer::Go => RGBColor(0, 140, 200),
        Peer::Std => RGBColor(130, 130, 130),
        Peer::Fibra => RGBColor(0, 0, 0),
    }
}

/// Width of one workload's group on the x axis (integer units, so that plotters can place the
/// workload names at the group centres).
const GROUP: u32 = 100;

/// Left edge of a bar: groups leave a tenth of their width free on each side.
fn bar_x(b: &Bar, width: u32) -> u32 {
    b.group as u32 * GROUP + GROUP / 10 + width * b.slot as u32
}

/// One bar: workload index, peer slot within the group, ratio.
struct Bar {
    group: usize,
    slot: usize,
    ratio: f64,
}

pub fn draw(rows: &[Row], path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let peers = others(rows);
    let peers = &peers;
    let bars: Vec<Bar> = rows
        .iter()
        .enumerate()
        .flat_map(|(group, row)| {
            peers.iter().enumerate().filter_map(move |(slot, &peer)| {
                cost_ratio(row, peer)
                    .filter(|r| r.is_finite() && *r > 0.0)
                    .map(|ratio| Bar { group, slot, ratio })
            })
        })
        .collect();
    let (lo, hi) = bars.iter().fold((0.5f64, 2.0f64), |(lo, hi), b| {
        (lo.min(b.ratio / 1.5), hi.max(b.ratio * 3.0))
    });
    let n = rows.len().max(1);

    let root = SVGBackend::new(path, (160 * n as u32 + 160, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = if bars.is_empty() {
        "fibra cost / peer cost: no fibra figures in this run"
    } else {
        "fibra cost / peer cost (log scale; below 1.0 = fibra ahead; http, http_cont, http_hooked: peer req/s ÷ fibra req/s)"
    };
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 18))
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(
            (0..GROUP * n as u32)
                .with_key_points((0..n as u32).map(|i| i * GROUP + GROUP / 2).collect()),
            (lo..hi).log_scale(),
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|x| {
            rows.get((*x / GROUP) as usize)
                .map(|r| {
                    let fibra_ran = r
                        .runs
                        .iter()
                        .any(|p| p.peer == Peer::Fibra && p.median().is_some());
                    if fibra_ran {
                        r.workload.name.to_string()
                    } else {
                        format!("{} (no fibra figure)", r.workload.name)
                    }
                })
                .unwrap_or_default()
        })
        .y_desc("fibra / peer")
        .y_label_formatter(&|y| fmt_value(*y))
        .draw()?;

    let width = GROUP * 4 / 5 / peers.len().max(1) as u32;
    for (slot, &peer) in peers.iter().enumerate() {
        let c = colour(peer);
        chart
            .draw_series(bars.iter().filter(|b| b.slot == slot).map(|b| {
                let x0 = bar_x(b, width);
                Rectangle::new([(x0, lo), (x0 + width * 9 / 10, b.ratio)], c.filled())
            }))?
            .label(peer.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
        chart.draw_series(bars.iter().filter(|b| b.slot == slot).map(|b| {
            let x = bar_x(b, width);
            Text::new(fmt_value(b.ratio), (x, b.ratio * 1.08), ("sans-serif", 11))
        }))?;
    }
    chart.draw_series(DashedLineSeries::new(
        vec![(0, 1.0), (GROUP * n as u32, 1.0)],
        6,
        4,
        BLACK.stroke_width(2),
    ))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
