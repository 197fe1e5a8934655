//! Command-line parsing for the comparison run and for the hidden child modes (`__run`,
//! `__serve`) that the parent re-executes this binary with.

use crate::workloads::{self, Cfg, Peer};

/// The usage text, with the workloads listed from the catalogue.
pub fn usage() -> String {
    let mut lines = vec![String::new()];
    for w in workloads::WORKLOADS {
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.len() + 1 + w.name.len() > 84 {
            lines.push(String::new());
        }
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(w.name);
    }
    format!(
        "\
usage: fibra-compare [--threads N] [--reps R] [--only w1,w2] [--install]

  --threads N   worker threads for every runtime (default 2; GOMAXPROCS for Go)
  --reps R      repetitions per workload and peer; medians are reported (default 5)
  --only LIST   comma-separated workloads to run (default: all)
  --install     apt-get install golang-go, wrk and redis-server first (needs root)

workloads: {}
           (--only W also runs the rows that belong to W: join_chain_1w and join_chain_cold
           with join_chain, million_wake with million_park, the _p50/_p99 rows with their
           http workload)",
        lines.join("\n           ")
    )
}

/// Options of a comparison run.
#[derive(Debug)]
pub struct Options {
    pub threads: usize,
    pub reps: usize,
    pub only: Option<Vec<String>>,
    pub install: bool,
}

/// What this invocation should do.
#[derive(Debug)]
pub enum Args {
    Help,
    Compare(Options),
    /// `__run <peer> <workload> --threads N --reps R [--no-warmup] [--port P]`
    Child {
        peer: Peer,
        workload: String,
        cfg: Cfg,
    },
    /// `__serve <peer> --port P --threads N`
    Serve {
        peer: Peer,
        port: u16,
        threads: usize,
    },
}

fn number<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
    v.ok_or_else(|| format!("{flag} needs a value"))?
        .parse()
        .map_err(|_| format!("{flag}: not a valid number"))
}

fn peer(v: Option<&String>) -> Result<Peer, String> {
    let v = v.ok_or("missing peer")?;
    Peer::parse(v).ok_or_else(|| format!("unknown peer {v}"))
}

pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut it = args.iter();
    let mode = args.first().map(String::as_str);
    let (mut threads, mut reps, mut port, mut warmup) = (2usize, 5usize, 0u16, true);
    let (mut only, mut install) = (None, false);
    let (mut child_peer, mut workload) = (None, None);
    match mode {
        Some("__run") => {
            it.next();
            child_peer = Some(peer(it.next())?);
            workload = Some(it.next().ok_or("missing workload")?.clone());
        }
        Some("__serve") => {
            it.next();
            child_peer = Some(peer(it.next())?);
        }
        _ => {}
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--threads" => threads = number(a, it.next())?,
            "--reps" => reps = number(a, it.next())?,
            "--port" => port = number(a, it.next())?,
            "--no-warmup" => warmup = false,
            "--install" => install = true,
            "--only" => {
                let list: Vec<String> = it
                    .next()
                    .ok_or("--only needs a list")?
                    .split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect();
                if let Some(bad) = list.iter().find(|n| workloads::find(n).is_none()) {
                    return Err(format!("unknown workload {bad}"));
                }
                only = Some(list);
            }
            "-h" | "--help" => return Ok(Args::Help),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if threads == 0 || reps == 0 {
        return Err("--threads and --reps must be at least 1".into());
    }
    Ok(match (mode, child_peer) {
        (Some("__run"), Some(peer)) => Args::Child {
            peer,
            workload: workload.expect("parsed with the peer"),
            cfg: Cfg {
                threads,
                reps,
                warmup,
                port: (port != 0).then_some(port),
            },
        },
        (Some("__serve"), Some(peer)) => Args::Serve {
            peer,
            port,
            threads,
        },
        _ => Args::Compare(Options {
            threads,
            reps,
            only,
            install,
        }),
    })
}
