//! The hook's step log: how long each step took, logged in one line when the steps end
//! (`steps: process=185 state=29 request=68 ...`, µs), which the bench reads back to say where
//! a hook's time goes. One line, not one per step: every line costs the hook a formatted
//! timestamp and a write.

use std::fmt::Write;
use std::time::Instant;

/// The steps taken so far, with their durations.
pub struct Step {
    at: Instant,
    done: Vec<(&'static str, u128)>,
}

impl Step {
    pub fn start() -> Step {
        Step {
            at: Instant::now(),
            done: Vec::with_capacity(16),
        }
    }

    /// Ends step `step` (a name without spaces or `=`).
    pub fn done(&mut self, step: &'static str) {
        self.done.push((step, self.at.elapsed().as_micros()));
        self.at = Instant::now();
    }

    /// The steps as their line holds them (` name=us ...`), for a caller that logs them in a
    /// line of its own; nothing is logged when they end.
    pub fn finish(mut self) -> String {
        let line = self.line();
        self.done.clear();
        line
    }

    fn line(&self) -> String {
        let mut line = String::with_capacity(16 * self.done.len());
        for (step, us) in &self.done {
            let _ = write!(line, " {step}={us}");
        }
        line
    }
}

/// The line is written when the steps end, failed or not: a failed hook's line shows how far
/// it got.
impl Drop for Step {
    fn drop(&mut self) {
        if self.done.is_empty() {
            return;
        }
        tracing::info!("steps:{}", self.line());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_gives_the_steps_as_their_line_holds_them() {
        let mut step = Step::start();
        step.done("config");
        step.done("request");
        let line = step.finish();
        let steps: Vec<(&str, u128)> = (line.split_whitespace())
            .map(|w| {
                let (name, us) = w.split_once('=').unwrap();
                (name, us.parse().unwrap())
            })
            .collect();
        assert_eq!(steps.len(), 2, "{line:?}");
        assert_eq!((steps[0].0, steps[1].0), ("config", "request"));
        assert!(line.starts_with(' '), "{line:?}");
    }
}
