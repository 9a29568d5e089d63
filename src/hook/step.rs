//! The hook's step log: one line per step with its duration, which the bench reads back to
//! say where a hook's time goes.

use std::time::Instant;

/// Logs how long a step took.
pub struct Step(Instant);

impl Step {
    pub fn start() -> Step {
        Step(Instant::now())
    }

    pub fn done(&mut self, step: &'static str) {
        let us = self.0.elapsed().as_micros();
        tracing::info!(step, us, "done");
        self.0 = Instant::now();
    }
}
