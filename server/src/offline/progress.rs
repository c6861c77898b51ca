//! Progress of a long offline operation (OPS-2): a bar on a terminal, plain lines otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// How often plain progress lines are printed.
const LINE_EVERY: Duration = Duration::from_secs(1);

pub struct Progress {
    what: &'static str,
    bar: Option<ProgressBar>,
    total: u64,
    done: u64,
    last_line: Instant,
}

impl Progress {
    /// `total` is the expected count (0 when unknown).
    pub fn new(what: &'static str, total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total);
            if let Ok(style) =
                ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(what);
            bar
        });
        Progress {
            what,
            bar,
            total,
            done: 0,
            last_line: Instant::now(),
        }
    }

    pub fn advance(&mut self, n: u64) {
        self.done += n;
        match &self.bar {
            Some(bar) => bar.set_position(self.done),
            None if self.last_line.elapsed() >= LINE_EVERY => {
                self.last_line = Instant::now();
                self.line();
            }
            None => {}
        }
    }

    fn line(&self) {
        if self.total > 0 {
            eprintln!(
                "{}: {}/{} ({}%)",
                self.what,
                self.done,
                self.total,
                self.done * 100 / self.total.max(1)
            );
        } else {
            eprintln!("{}: {}", self.what, self.done);
        }
    }

    pub fn finish(self) {
        match &self.bar {
            Some(bar) => bar.finish(),
            None => self.line(),
        }
    }
}
