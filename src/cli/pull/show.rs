//! What `corral pull` prints: a bar per download on a terminal; elsewhere (CI logs, pipes) plain
//! lines, one per file every few seconds at most, so a log stays readable.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use corral::{Fetched, Progress};
use indicatif::{HumanBytes, HumanDuration, MultiProgress, ProgressBar, ProgressStyle};

/// The least time between two plain lines about the same file.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// A download: the model's source and the file within it.
type Key = (String, String);

enum Mode {
    Bars {
        multi: MultiProgress,
        bars: Mutex<HashMap<Key, ProgressBar>>,
    },
    Lines {
        last: Mutex<HashMap<Key, Instant>>,
    },
}

pub struct Show {
    /// The model ids each source is fetched for (a source two models share downloads once).
    labels: HashMap<String, String>,
    mode: Mode,
}

impl Show {
    /// `models` pairs each source (as shown) with a model id; bars when stdout is a terminal.
    pub fn new(models: impl Iterator<Item = (String, String)>) -> Show {
        let mut labels: HashMap<String, String> = HashMap::new();
        for (source, id) in models {
            labels
                .entry(source)
                .and_modify(|ids| {
                    ids.push_str(", ");
                    ids.push_str(&id);
                })
                .or_insert(id);
        }
        let mode = if std::io::stdout().is_terminal() {
            Mode::Bars {
                multi: MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::stdout()),
                bars: Mutex::default(),
            }
        } else {
            Mode::Lines {
                last: Mutex::default(),
            }
        };
        Show { labels, mode }
    }

    fn label<'a>(&'a self, source: &'a str) -> &'a str {
        self.labels.get(source).map_or(source, String::as_str)
    }

    pub fn progress(&self, p: &Progress) {
        let key = (p.source.clone(), p.file.clone());
        match &self.mode {
            Mode::Bars { multi, bars } => {
                let mut bars = bars.lock().unwrap();
                let bar = bars.entry(key).or_insert_with(|| {
                    let bar = multi.add(ProgressBar::no_length());
                    bar.set_style(bar_style());
                    bar.set_prefix(format!("{}: {}", self.label(&p.source), p.file));
                    bar
                });
                if let Some(total) = p.total {
                    bar.set_length(total);
                }
                bar.set_position(p.bytes);
                bar.set_message(rate(p));
            }
            Mode::Lines { last } => {
                let now = Instant::now();
                let mut last = last.lock().unwrap();
                if last.get(&key).is_some_and(|t| now - *t < LINE_EVERY) {
                    return;
                }
                last.insert(key, now);
                println!(
                    "{}: {} {}, {}",
                    self.label(&p.source),
                    p.file,
                    amount(p),
                    rate(p)
                );
            }
        }
    }

    /// A model whose weights were already complete on disk.
    pub fn cached(&self, id: &str, fetched: &Fetched) {
        self.line(&format!("{id}: cached at {}", fetched.model.display()));
    }

    /// A fetch ended: its bars go, and a line says where the weights lie (the failures are
    /// listed together at the end).
    pub fn finished(&self, id: &str, source: &str, fetched: Option<&Fetched>) {
        if let Mode::Bars { multi, bars } = &self.mode {
            bars.lock().unwrap().retain(|(s, _), bar| {
                if s == source {
                    bar.finish_and_clear();
                    multi.remove(bar);
                }
                s != source
            });
        }
        if let Some(f) = fetched {
            let size = HumanBytes(f.bytes);
            self.line(&format!("{id}: {} ({size})", f.model.display()));
        }
    }

    /// A line above the bars, or on its own.
    fn line(&self, text: &str) {
        match &self.mode {
            Mode::Bars { multi, .. } => {
                let _ = multi.println(text);
            }
            Mode::Lines { .. } => println!("{text}"),
        }
    }
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{prefix} [{bar:30}] {bytes}/{total_bytes} {msg}")
        .expect("a valid template")
        .progress_chars("=> ")
}

/// `12.00 MiB of 1.50 GiB (0%)`, or the bytes alone while the size is unknown.
fn amount(p: &Progress) -> String {
    match p.total {
        Some(t) if t > 0 => format!(
            "{} of {} ({}%)",
            HumanBytes(p.bytes),
            HumanBytes(t),
            p.bytes.saturating_mul(100) / t
        ),
        _ => HumanBytes(p.bytes).to_string(),
    }
}

/// `4.20 MiB/s, 1 minute left`, from the fetcher's own measure.
fn rate(p: &Progress) -> String {
    let speed = format!("{}/s", HumanBytes(p.bytes_per_second as u64));
    match p.eta_seconds {
        Some(s) if s.is_finite() && s >= 0.0 => {
            format!(
                "{speed}, {} left",
                HumanDuration(Duration::from_secs_f64(s))
            )
        }
        _ => speed,
    }
}
