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
}

/// The line is written when the steps end, failed or not: a failed hook's line shows how far
/// it got.
impl Drop for Step {
    fn drop(&mut self) {
        if self.done.is_empty() {
            return;
        }
        let mut line = String::with_capacity(16 * self.done.len());
        for (step, us) in &self.done {
            let _ = write!(line, " {step}={us}");
        }
        tracing::info!("steps:{line}");
    }
}
