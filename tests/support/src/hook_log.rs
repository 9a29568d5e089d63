//! nvhook's log as its hooks write it, read back by the tests and the bench: a hook run's
//! `nvhook::hook::step: steps: name=us ...` line comes before its `hook finished ... stage=S id=I ... total_us=N`
//! line. nvhook-runtime's create logs its own steps in its `GPU container prepared; steps: name=us
//! ... bundle=B ... total_us=N` line.

/// A log line's steps with their µs: a hook's `steps:` line, none for any other line.
pub fn steps_of(line: &str) -> Vec<(&str, u64)> {
    let Some((_, steps)) = line.split_once("hook::step: steps:") else {
        return Vec::new();
    };
    named_us(steps, line)
}

/// nvhook-runtime's steps with their µs: its `GPU container prepared` line's, none for any
/// other line.
pub fn prepared_steps(line: &str) -> Vec<(&str, u64)> {
    let Some((_, rest)) = line.split_once("GPU container prepared; steps:") else {
        return Vec::new();
    };
    let steps = rest.split(" bundle=").next().unwrap_or_default();
    named_us(steps, line)
}

/// `name=us` words, of `line`.
fn named_us<'a>(words: &'a str, line: &str) -> Vec<(&'a str, u64)> {
    words
        .split_whitespace()
        .map(|w| {
            let (step, us) = w
                .split_once('=')
                .unwrap_or_else(|| panic!("a step without its µs in {line:?}"));
            let us = us
                .parse()
                .unwrap_or_else(|_| panic!("a step's µs is not a number in {line:?}"));
            (step, us)
        })
        .collect()
}

/// One hook run: its stage, its container's id, its steps' µs and its total µs.
pub struct HookRun {
    pub stage: String,
    pub id: String,
    pub steps: Vec<(String, u64)>,
    pub total_us: u64,
}

/// The hook runs of `log`, in order.
pub fn hook_runs(log: &str) -> Vec<HookRun> {
    let mut runs = Vec::new();
    let mut steps = Vec::new();
    for line in log.lines() {
        let listed = steps_of(line);
        if !listed.is_empty() {
            steps.extend(listed.into_iter().map(|(step, us)| (step.to_string(), us)));
            continue;
        }
        if !line.contains("hook finished") {
            continue;
        }
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        };
        runs.push(HookRun {
            stage: field("stage=").to_string(),
            id: field("id=").to_string(),
            steps: std::mem::take(&mut steps),
            total_us: field("total_us=").parse().expect("total_us= is a number"),
        });
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_hold_the_steps_before_them() {
        let log = "\
x INFO nvhook::hook::step: steps: process=180 state=30 request=60 mounts=270
x INFO nvhook::hook: hook finished stage=Prestart id=c1 outcome=Applied { devices: 1, mounts: 2 } total_us=1650
x INFO nvhook::hook::effects: other
x INFO nvhook::hook::step: steps: process=170 state=20 links+ldcache=40
x INFO nvhook::hook: hook finished stage=CreateContainer id=c2 total_us=900
";
        assert_eq!(steps_of("a line"), Vec::new());
        let runs = hook_runs(log);
        assert_eq!(runs.len(), 2);
        assert_eq!(
            (runs[0].stage.as_str(), runs[0].id.as_str()),
            ("Prestart", "c1")
        );
        assert_eq!(runs[0].total_us, 1650);
        assert_eq!(runs[0].steps[3], ("mounts".to_string(), 270));
        assert_eq!(runs[1].steps.len(), 3);
        assert_eq!(runs[1].steps[2], ("links+ldcache".to_string(), 40));
    }

    #[test]
    fn the_runtime_line_holds_its_steps() {
        let line = "x INFO nvhook::runtime: GPU container prepared; steps: config=120 \
                    inventory=550 write=130 bundle=/run/b/c1 runtime=/usr/bin/runc total_us=800";
        assert_eq!(
            prepared_steps(line),
            [("config", 120), ("inventory", 550), ("write", 130)]
        );
        assert_eq!(steps_of(line), Vec::new());
        assert_eq!(
            prepared_steps("x INFO nvhook::hook::step: steps: process=1"),
            []
        );
    }
}
