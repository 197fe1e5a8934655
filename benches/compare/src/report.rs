//! The results table: medians per peer and fibra/peer ratios, printed as text on stdout and
//! written with the run's context (date, machine, command line, raw samples, skip reasons) to
//! `report.md`.

use std::fmt::Write as _;

use crate::driver::{PeerRun, Status};
use crate::workloads::{Mode, Peer, Workload};

/// One workload's results, one [`PeerRun`] per peer that applies to it, in [`Peer::ALL`] order.
pub struct Row {
    pub workload: &'static Workload,
    pub runs: Vec<PeerRun>,
}

impl Row {
    fn run(&self, peer: Peer) -> Option<&PeerRun> {
        self.runs.iter().find(|r| r.peer == peer)
    }

    fn median(&self, peer: Peer) -> Option<f64> {
        self.run(peer).and_then(PeerRun::median)
    }
}

/// fibra's median divided by `peer`'s, when both exist and the peer's is not zero.
pub fn ratio(row: &Row, peer: Peer) -> Option<f64> {
    let (f, p) = (row.median(Peer::Fibra)?, row.median(peer)?);
    (p != 0.0).then(|| f / p)
}

/// fibra's cost relative to `peer` (below 1 = fibra ahead): fibra/peer for lower-is-better
/// figures, peer/fibra for throughput.
pub fn cost_ratio(row: &Row, peer: Peer) -> Option<f64> {
    let r = ratio(row, peer)?;
    if row.workload.lower_is_better {
        Some(r)
    } else {
        (r != 0.0).then(|| 1.0 / r)
    }
}

/// A figure or ratio with three significant digits (no exponent notation).
pub fn fmt_value(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{v:.decimals$}")
}

fn cell(row: &Row, peer: Peer) -> String {
    match row.run(peer) {
        Some(run) => match &run.status {
            Status::Ok => run.median().map(fmt_value).unwrap_or_else(|| "-".into()),
            Status::Skipped(_) => "skip".into(),
            Status::Failed(_) => "FAIL".into(),
        },
        None => "-".into(),
    }
}

/// The peers with a column in the table: those with a cell in at least one row, in
/// [`Peer::ALL`] order (`fibra-net` only appears when `http_hooked` ran).
fn columns(rows: &[Row]) -> Vec<Peer> {
    Peer::ALL
        .into_iter()
        .filter(|&p| rows.iter().any(|r| r.run(p).is_some()))
        .collect()
}

/// The peers fibra is compared with (a ratio column, a bar in the plot).
pub fn others(rows: &[Row]) -> Vec<Peer> {
    columns(rows)
        .into_iter()
        .filter(|&p| p != Peer::Fibra)
        .collect()
}

fn header(rows: &[Row]) -> Vec<String> {
    let mut h = vec!["workload".to_string(), "unit".to_string()];
    h.extend(columns(rows).iter().map(|p| p.name().to_string()));
    h.extend(others(rows).iter().map(|p| format!("fibra/{}", p.name())));
    h
}

fn cells(row: &Row, rows: &[Row]) -> Vec<String> {
    let unit = if row.workload.lower_is_better {
        row.workload.unit.to_string()
    } else {
        format!("{} (higher better)", row.workload.unit)
    };
    let mut c = vec![row.workload.name.to_string(), unit];
    c.extend(columns(rows).iter().map(|&p| cell(row, p)));
    c.extend(others(rows).iter().map(|&p| {
        ratio(row, p)
            .map(|r| format!("{r:.2}"))
            .unwrap_or_else(|| "-".into())
    }));
    c
}

/// How to read the ratio columns.
pub const LEGEND: &str = "Ratios are fibra's median divided by the peer's. For times, latencies, \
CPU and memory lower is better, so below 1.00 means fibra is ahead; for http, http_pinned, \
http_cont and http_hooked (req/s) higher is better, so above 1.00 means fibra is ahead. The _p50 and _p99 rows are wrk's \
latency percentiles from the same wrk runs as the req/s row above them; million_wake comes from \
the same runs as million_park; join_chain_1w is join_chain with 1 worker thread for every peer, \
join_chain_cold its first chain in a fresh process. \
http_pinned is http with 1 worker thread for every server, pinned to one CPU and wrk to another: \
the runtime without the CPU it shares with the load generator in the http row. \
In http_cont, fibra's server waits for each request with a readiness continuation instead of a \
parked fiber (examples/http_cont). \
In http_hooked, fibra is the std::net server under the hook feature and fibra-net the fibra::net \
server: fibra/fibra-net is the share of fibra::net's throughput kept through the hooks. \"-\": \
no ratio (a side is missing, or the peer's figure is 0) or no cell (fibra-net runs in the \
http_hooked rows only).";

/// The table as aligned plain text.
pub fn text_table(rows: &[Row]) -> String {
    let mut table = vec![header(rows)];
    table.extend(rows.iter().map(|r| cells(r, rows)));
    let widths: Vec<usize> = (0..table[0].len())
        .map(|i| {
            table
                .iter()
                .map(|r| r[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for (n, r) in table.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < 2 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
        if n == 0 {
            let total = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
            let _ = writeln!(out, "{}", "-".repeat(total));
        }
    }
    out
}

/// The rows in `rows` that take their figures from `row`'s runs.
fn derived_rows<'a>(rows: &'a [Row], row: &'a Row) -> impl Iterator<Item = &'a Row> {
    rows.iter().filter(move |r| {
        r.workload.mode == Mode::Derived && r.workload.of == Some(row.workload.name)
    })
}

/// Skip/failure reasons and notes, one line each. A derived row's cell that only repeats the
/// skip or failure of its workload's cell is named on that cell's line instead of its own.
pub fn remarks(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    for row in rows {
        for run in &row.runs {
            let failed = run.status != Status::Ok;
            if failed && row.workload.mode == Mode::Derived {
                let parent = rows
                    .iter()
                    .find(|r| Some(r.workload.name) == row.workload.of)
                    .and_then(|r| r.run(run.peer));
                if parent.is_some_and(|p| p.status == run.status) {
                    continue;
                }
            }
            let who = format!("{} / {}", row.workload.name, run.peer.name());
            let same: Vec<&str> = derived_rows(rows, row)
                .filter(|r| failed && r.run(run.peer).is_some_and(|d| d.status == run.status))
                .map(|r| r.workload.name)
                .collect();
            let cells = if same.is_empty() {
                who.clone()
            } else {
                format!("{who} (and {})", same.join(", "))
            };
            match &run.status {
                Status::Skipped(why) => out.push(format!("{cells}: skipped: {why}")),
                Status::Failed(why) => out.push(format!("{cells}: FAILED: {why}")),
                Status::Ok => {}
            }
            out.extend(run.notes.iter().map(|n| format!("{who}: note: {n}")));
        }
    }
    out
}

/// The run's context, shown at the top of `report.md`.
#[derive(Clone)]
pub struct Meta {
    pub date: String,
    pub cpus: String,
    pub cpu_model: String,
    pub kernel: String,
    pub command: String,
    pub threads: usize,
    pub reps: usize,
    pub tools: Vec<String>,
    /// Workloads selected but not run yet: a report written while the run goes on.
    pub not_run: Vec<&'static str>,
}

/// The whole `report.md`.
pub fn markdown(rows: &[Row], meta: &Meta) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# fibra side-by-side benchmark report\n");
    let _ = writeln!(md, "- date: {}", meta.date);
    let _ = writeln!(
        md,
        "- machine: {} CPUs, {}, Linux {}",
        meta.cpus, meta.cpu_model, meta.kernel
    );
    let _ = writeln!(md, "- command: `{}`", meta.command);
    let _ = writeln!(
        md,
        "- worker threads per runtime: {}; repetitions: {} (medians shown)",
        meta.threads, meta.reps
    );
    for t in &meta.tools {
        let _ = writeln!(md, "- {t}");
    }
    if !meta.not_run.is_empty() {
        let _ = writeln!(
            md,
            "- **partial**: written while the run went on; not run yet: {}",
            meta.not_run.join(", ")
        );
    }
    let _ = writeln!(md, "\n## Medians\n");
    let h = header(rows);
    let _ = writeln!(md, "| {} |", h.join(" | "));
    let align: Vec<&str> = (0..h.len())
        .map(|i| if i < 2 { "---" } else { "---:" })
        .collect();
    let _ = writeln!(md, "| {} |", align.join(" | "));
    for row in rows {
        let _ = writeln!(md, "| {} |", cells(row, rows).join(" | "));
    }
    let _ = writeln!(md, "\n{LEGEND}\n");
    let _ = writeln!(
        md,
        "![fibra's cost relative to tokio and Go, log scale, below 1 = fibra ahead](report.svg)\n"
    );
    let remarks = remarks(rows);
    if !remarks.is_empty() {
        let _ = writeln!(md, "## Skipped, failed and notes\n");
        for r in remarks {
            let _ = writeln!(md, "- {r}");
        }
    }
    let _ = writeln!(md, "\n## Every repetition\n");
    let _ = writeln!(md, "| workload | peer | samples |");
    let _ = writeln!(md, "| --- | --- | --- |");
    for row in rows {
        for run in row.runs.iter().filter(|r| !r.samples.is_empty()) {
            let s: Vec<String> = run.samples.iter().map(|&v| fmt_value(v)).collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} |",
                row.workload.name,
                run.peer.name(),
                s.join(", ")
            );
        }
    }
    md
}

/// "YYYY-MM-DD HH:MM:SS UTC" for a Unix time in seconds (proleptic Gregorian calendar).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Convert days since 1970-01-01 to a civil date, counting in 400-year eras from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
    }

    #[test]
    fn values_keep_three_digits() {
        assert_eq!(fmt_value(12345.6), "12346");
        assert_eq!(fmt_value(12.345), "12.3");
        assert_eq!(fmt_value(1.2345), "1.23");
        assert_eq!(fmt_value(0.12345), "0.123");
        assert_eq!(fmt_value(0.0035), "0.00350");
        assert_eq!(fmt_value(0.0), "0");
    }

    #[test]
    fn a_report_written_during_the_run_names_what_is_still_to_run() {
        let mut meta = Meta {
            date: utc(0),
            cpus: "16".into(),
            cpu_model: "cpu".into(),
            kernel: "6.18".into(),
            command: "fibra-compare".into(),
            threads: 16,
            reps: 3,
            tools: Vec::new(),
            not_run: vec!["skynet", "broadcast"],
        };
        let partial = markdown(&[], &meta);
        assert!(partial.contains("**partial**"), "{partial}");
        assert!(
            partial.contains("not run yet: skynet, broadcast"),
            "{partial}"
        );
        meta.not_run.clear();
        assert!(!markdown(&[], &meta).contains("partial"));
    }
}
