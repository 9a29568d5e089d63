//! Percentiles and a least-squares line, on milliseconds.

#[derive(Clone, Debug, Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn push(&mut self, ms: f64) {
        self.0.push(ms);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    fn sorted(&self) -> Vec<f64> {
        assert!(!self.0.is_empty(), "no samples");
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        sorted
    }

    /// Nearest-rank percentile, `p` in 0..=100.
    pub fn percentile(&self, p: f64) -> f64 {
        let sorted = self.sorted();
        let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    }

    pub fn p50(&self) -> f64 {
        self.percentile(50.0)
    }

    pub fn p95(&self) -> f64 {
        self.percentile(95.0)
    }

    /// A 95% confidence interval of the median, from the order statistics alone (no
    /// assumption on the distribution): the samples of ranks n/2 ± 1.96·√n/2.
    pub fn median_interval(&self) -> (f64, f64) {
        let sorted = self.sorted();
        let n = sorted.len() as f64;
        let half = 1.96 * n.sqrt() / 2.0;
        let low = (n / 2.0 - half).floor().max(1.0) as usize;
        let high = (n / 2.0 + 1.0 + half).ceil().min(n) as usize;
        (sorted[low - 1], sorted[high - 1])
    }

    /// Each sample less the one `base` took in the same round (both pushed once per round):
    /// a difference in which drift between rounds cancels.
    pub fn paired_minus(&self, base: &Samples) -> Samples {
        assert_eq!(self.len(), base.len(), "samples of the same rounds");
        self.0.iter().zip(&base.0).map(|(a, b)| a - b).collect()
    }

    /// A markdown row `| label | p50 | p95 | Δ p50 |`, Δ against `base_p50`.
    pub fn delta_row(&self, label: &str, base_p50: f64) -> String {
        let p50 = self.p50();
        format!(
            "| {label} | {p50:.2} | {:.2} | {:+.2} |",
            self.p95(),
            p50 - base_p50
        )
    }
}

impl FromIterator<f64> for Samples {
    fn from_iter<I: IntoIterator<Item = f64>>(iter: I) -> Self {
        Samples(iter.into_iter().collect())
    }
}

/// Slope and intercept of the least-squares line through `points` (x, y).
pub fn fit_line(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx).powi(2)).sum();
    let slope = if sxx == 0.0 { 0.0 } else { sxy / sxx };
    (slope, my - slope * mx)
}
