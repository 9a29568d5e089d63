//! `NVIDIA_REQUIRE_*` constraints: what the image needs from the driver and the GPU.
//!
//! Grammar (libnvidia-container's `dsl.c`, which prints the well-known
//! `unsatisfied condition: cuda>=12.4`): one variable is one expression; whitespace separates
//! alternatives (OR) and a comma joins conditions within an alternative (AND), so AND binds
//! tighter. A condition is `KEY OP VALUE` with no spaces; the operator is the whole run of
//! `<>=!` characters and must be exactly one of `= != < <= > >=`. Keys (case-insensitive):
//! `cuda` and `driver` (host), `arch` and `brand` (per GPU). Versions are dotted numbers
//! compared component-wise (12.10 > 12.9, 12.4 = 12.4.0); brands compare case-insensitively.

use crate::shown::Shown;
use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// A dotted version such as `12.4`, `535.104.05` or compute capability `8.0`.
/// Equality and order ignore trailing zero components; Display gives the text back.
#[derive(Debug, Clone)]
pub struct Version {
    text: String,
    parts: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("\"{0}\" is not a version (use dotted numbers such as 12.4)")]
pub struct InvalidVersion(pub Shown);

impl FromStr for Version {
    type Err = InvalidVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts = s
            .split('.')
            .map(|p| {
                if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                p.parse::<u64>().ok()
            })
            .collect::<Option<Vec<u64>>>()
            .ok_or_else(|| InvalidVersion(s.into()))?;
        Ok(Version {
            text: s.to_string(),
            parts,
        })
    }
}

impl Version {
    /// For versions reported by the host (NVML strings): the leading dotted numbers, so that a
    /// suffix never turns a host fact into an error. Nothing numeric reads as version 0.
    pub fn parse_lenient(s: &str) -> Version {
        let parts = s
            .split('.')
            .map_while(|p| {
                let digits = p.bytes().take_while(u8::is_ascii_digit).count();
                let n = p[..digits].parse::<u64>().ok()?;
                Some((n, digits == p.len()))
            })
            .scan(true, |whole_so_far, (n, whole)| {
                let keep = *whole_so_far;
                *whole_so_far = whole;
                keep.then_some(n)
            })
            .collect();
        Version {
            text: s.to_string(),
            parts,
        }
    }

    fn component(&self, i: usize) -> u64 {
        self.parts.get(i).copied().unwrap_or(0)
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let len = self.parts.len().max(other.parts.len());
        (0..len)
            .map(|i| self.component(i).cmp(&other.component(i)))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What the host and one GPU offer, against which requirements are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFacts {
    /// Highest CUDA version the driver supports (NVML's CUDA driver version, e.g. 12.4).
    pub cuda: Version,
    pub driver: Version,
    /// Compute capability, e.g. 8.0.
    pub arch: Version,
    pub brand: String,
}

/// The condition that failed, as the image wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsatisfied condition: {condition}")]
pub struct Unsatisfied {
    /// The variable the condition came from (`NVIDIA_REQUIRE_CUDA`, or `CUDA_VERSION` for the
    /// requirement implied by a legacy image).
    pub variable: String,
    pub condition: Shown,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    #[error("condition \"{0}\" has no operator (write KEY OP VALUE, e.g. cuda>=12.4)")]
    NoOperator(Shown),
    #[error("condition \"{0}\" has no key before the operator (use cuda, driver, arch or brand)")]
    NoKey(Shown),
    #[error("condition \"{condition}\": unknown operator \"{operator}\" (use = != < <= > >=)")]
    UnknownOperator { condition: Shown, operator: Shown },
    #[error("condition \"{0}\" has no value after the operator")]
    NoValue(Shown),
    #[error("condition \"{condition}\": unknown key \"{key}\" (use cuda, driver, arch or brand)")]
    UnknownKey { condition: Shown, key: Shown },
    #[error("condition \"{0}\": a brand can only be compared with = or !=")]
    BrandOrder(Shown),
    #[error("condition \"{condition}\": {source}")]
    Version {
        condition: Shown,
        source: InvalidVersion,
    },
}

/// Every expression must hold (separate variables AND together).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Requirements {
    expressions: Vec<Expression>,
}

/// One variable: satisfied when any alternative has all its conditions satisfied.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Expression {
    variable: String,
    alternatives: Vec<Vec<Condition>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Condition {
    text: String,
    op: Op,
    test: Test,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Test {
    Cuda(Version),
    Driver(Version),
    Arch(Version),
    Brand(String),
}

/// The facts a condition is evaluated against; without a GPU, `arch` and `brand` conditions
/// hold, as in libnvidia-container when no device is selected.
struct Facts<'a> {
    cuda: &'a Version,
    driver: &'a Version,
    gpu: Option<(&'a Version, &'a str)>,
}

impl Requirements {
    /// Adds the expression of one variable. An empty expression requires nothing.
    pub(crate) fn add(&mut self, variable: &str, expression: &str) -> Result<(), ConditionError> {
        let alternatives = expression
            .split_ascii_whitespace()
            .map(|alt| {
                alt.split(',')
                    .filter(|c| !c.is_empty())
                    .map(Condition::parse)
                    .collect::<Result<Vec<_>, _>>()
            })
            // An alternative of separators only would make the whole expression hold in
            // dsl.c but is skipped by the toolkit's Go evaluator; skipping fails closed.
            .filter(|alt| !matches!(alt, Ok(conditions) if conditions.is_empty()))
            .collect::<Result<Vec<_>, _>>()?;
        if !alternatives.is_empty() {
            self.expressions.push(Expression {
                variable: variable.to_string(),
                alternatives,
            });
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.expressions.is_empty()
    }

    /// Checks the requirements against the host and one selected GPU.
    pub fn check(&self, gpu: &GpuFacts) -> Result<(), Unsatisfied> {
        self.evaluate(&Facts {
            cuda: &gpu.cuda,
            driver: &gpu.driver,
            gpu: Some((&gpu.arch, &gpu.brand)),
        })
    }

    /// Checks a request with no GPU (`none`): only `cuda` and `driver` conditions can fail.
    pub fn check_without_gpu(&self, cuda: &Version, driver: &Version) -> Result<(), Unsatisfied> {
        self.evaluate(&Facts {
            cuda,
            driver,
            gpu: None,
        })
    }

    fn evaluate(&self, facts: &Facts) -> Result<(), Unsatisfied> {
        self.expressions.iter().try_for_each(|e| e.evaluate(facts))
    }
}

impl Expression {
    /// On failure, names the first failing condition of the FIRST alternative: in CUDA images
    /// that is `cuda>=X`, the one a user can act on; the later alternatives are brand-specific
    /// forward-compatibility exceptions, and naming one of them (`brand=titanrtx`) misleads.
    fn evaluate(&self, facts: &Facts) -> Result<(), Unsatisfied> {
        let mut first_failure: Option<&Condition> = None;
        for alternative in &self.alternatives {
            match alternative.iter().find(|c| !c.holds(facts)) {
                None => return Ok(()),
                Some(failed) => {
                    first_failure.get_or_insert(failed);
                }
            }
        }
        Err(Unsatisfied {
            variable: self.variable.clone(),
            condition: first_failure.map_or_else(Shown::default, |c| c.text.as_str().into()),
        })
    }
}

impl Condition {
    fn parse(text: &str) -> Result<Condition, ConditionError> {
        const OPERATOR_CHARS: &[char] = &['<', '>', '=', '!'];
        let key_end = text
            .find(OPERATOR_CHARS)
            .ok_or_else(|| ConditionError::NoOperator(text.into()))?;
        let (key, rest) = text.split_at(key_end);
        if key.is_empty() {
            return Err(ConditionError::NoKey(text.into()));
        }
        let op_end = rest
            .find(|c: char| !OPERATOR_CHARS.contains(&c))
            .unwrap_or(rest.len());
        let (op_text, value) = rest.split_at(op_end);
        let op = Op::parse(op_text).ok_or_else(|| ConditionError::UnknownOperator {
            condition: text.into(),
            operator: op_text.into(),
        })?;
        if value.is_empty() {
            return Err(ConditionError::NoValue(text.into()));
        }
        let version = || {
            value
                .parse::<Version>()
                .map_err(|source| ConditionError::Version {
                    condition: text.into(),
                    source,
                })
        };
        let test = match key.to_ascii_lowercase().as_str() {
            "cuda" => Test::Cuda(version()?),
            "driver" => Test::Driver(version()?),
            "arch" => Test::Arch(version()?),
            "brand" if matches!(op, Op::Eq | Op::Ne) => Test::Brand(value.to_string()),
            "brand" => return Err(ConditionError::BrandOrder(text.into())),
            _ => {
                return Err(ConditionError::UnknownKey {
                    condition: text.into(),
                    key: key.into(),
                });
            }
        };
        Ok(Condition {
            text: text.to_string(),
            op,
            test,
        })
    }

    fn holds(&self, facts: &Facts) -> bool {
        let ordering = match (&self.test, facts.gpu) {
            (Test::Cuda(want), _) => facts.cuda.cmp(want),
            (Test::Driver(want), _) => facts.driver.cmp(want),
            (Test::Arch(want), Some((arch, _))) => arch.cmp(want),
            (Test::Brand(want), Some((_, brand))) => {
                // Only = and != reach here (checked at parse time).
                return brand.eq_ignore_ascii_case(want) == (self.op == Op::Eq);
            }
            (Test::Arch(_) | Test::Brand(_), None) => return true,
        };
        self.op.accepts(ordering)
    }
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "=" => Op::Eq,
            "!=" => Op::Ne,
            "<" => Op::Lt,
            "<=" => Op::Le,
            ">" => Op::Gt,
            ">=" => Op::Ge,
            _ => return None,
        })
    }

    fn accepts(self, have_vs_want: Ordering) -> bool {
        match self {
            Op::Eq => have_vs_want.is_eq(),
            Op::Ne => have_vs_want.is_ne(),
            Op::Lt => have_vs_want.is_lt(),
            Op::Le => have_vs_want.is_le(),
            Op::Gt => have_vs_want.is_gt(),
            Op::Ge => have_vs_want.is_ge(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    fn facts(cuda: &str, driver: &str, arch: &str, brand: &str) -> GpuFacts {
        GpuFacts {
            cuda: v(cuda),
            driver: v(driver),
            arch: v(arch),
            brand: brand.into(),
        }
    }

    fn reqs(exprs: &[&str]) -> Requirements {
        let mut r = Requirements::default();
        for (i, e) in exprs.iter().enumerate() {
            r.add(&format!("NVIDIA_REQUIRE_{i}"), e).unwrap();
        }
        r
    }

    fn failing(exprs: &[&str], f: &GpuFacts) -> Option<String> {
        reqs(exprs).check(f).err().map(|u| u.to_string())
    }

    #[test]
    fn version_order_is_numeric_per_component() {
        assert!(v("12.10") > v("12.9"));
        assert!(v("12.4.1") > v("12.4"));
        assert_eq!(v("12.4"), v("12.4.0"));
        assert_eq!(v("12.4.0").to_string(), "12.4.0");
        assert_eq!(v("535.104.05"), v("535.104.5"));
        assert!(v("9") < v("10.0"));
        for bad in [
            "",
            "12.",
            ".4",
            "12..4",
            "v12",
            "12.4-rc",
            "1 2",
            "99999999999999999999",
        ] {
            assert_eq!(
                bad.parse::<Version>().unwrap_err(),
                InvalidVersion(bad.into())
            );
        }
    }

    #[test]
    fn lenient_version_keeps_leading_numbers() {
        assert_eq!(Version::parse_lenient("535.104.05"), v("535.104.05"));
        assert_eq!(Version::parse_lenient("12.4"), v("12.4"));
        assert_eq!(Version::parse_lenient("560.35.03-beta"), v("560.35.3"));
        assert_eq!(Version::parse_lenient("12.4x.7"), v("12.4"));
        assert_eq!(Version::parse_lenient("garbage"), v("0"));
        assert_eq!(Version::parse_lenient("garbage").to_string(), "garbage");
    }

    #[test]
    fn every_operator() {
        let f = facts("12.4", "550.54.15", "8.0", "Tesla");
        let cases = [
            ("cuda=12.4", true),
            ("cuda=12.4.0", true),
            ("cuda=12.3", false),
            ("cuda!=12.3", true),
            ("cuda!=12.4", false),
            ("cuda<12.10", true),
            ("cuda<12.4", false),
            ("cuda<=12.4", true),
            ("cuda<=12.3", false),
            ("cuda>12.3", true),
            ("cuda>12.4", false),
            ("cuda>=12.4", true),
            ("cuda>=12.10", false),
            ("driver>=550", true),
            ("driver<550.54.16", true),
            ("driver>550.54.15", false),
            ("arch>=8.0", true),
            ("arch>=9.0", false),
            ("arch=8", true),
            ("brand=tesla", true),
            ("brand=TESLA", true),
            ("brand!=tesla", false),
            ("brand=geforce", false),
            ("brand!=geforce", true),
            ("CUDA>=12.0", true),
        ];
        for (expr, ok) in cases {
            assert_eq!(reqs(&[expr]).check(&f).is_ok(), ok, "{expr}");
        }
    }

    #[test]
    fn comma_is_and_space_is_or_and_binds_tighter() {
        let f = facts("12.2", "535.104.05", "8.0", "tesla");
        assert!(reqs(&["cuda>=12.0,driver>=535"]).check(&f).is_ok());
        assert!(reqs(&["cuda>=12.0,driver>=550"]).check(&f).is_err());
        assert!(reqs(&["cuda>=12.4 driver>=535"]).check(&f).is_ok());
        // (cuda>=12.4 AND brand=tesla) OR (driver>=535 AND brand=geforce): both fail.
        assert!(
            reqs(&["cuda>=12.4,brand=tesla driver>=535,brand=geforce"])
                .check(&f)
                .is_err()
        );
        // cuda>=12.4 OR (brand=tesla AND driver>=535): the second holds.
        assert!(
            reqs(&["cuda>=12.4 brand=tesla,driver>=535"])
                .check(&f)
                .is_ok()
        );
        // Separate variables AND together.
        assert!(reqs(&["cuda>=12.0", "driver>=550"]).check(&f).is_err());
        // Extra separators are ignored; an empty expression requires nothing.
        assert!(reqs(&["  cuda>=12.0,,  ", "", "  "]).check(&f).is_ok());
        assert!(reqs(&["", " , ", "\t"]).is_empty());
        // A separators-only alternative does not satisfy the expression.
        assert!(reqs(&["cuda>=99 ,"]).check(&f).is_err());
    }

    #[test]
    fn real_cuda_image_requirement() {
        let expr = "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=unknown,driver>=470,driver<471 \
                    brand=nvidia,driver>=535,driver<536 brand=titanrtx,driver>=535,driver<536";
        // A Tesla on 470 runs it through forward compatibility.
        assert!(
            reqs(&[expr])
                .check(&facts("11.4", "470.82.01", "8.0", "Tesla"))
                .is_ok()
        );
        assert!(
            reqs(&[expr])
                .check(&facts("12.4", "550.54.15", "9.0", "GeForce"))
                .is_ok()
        );
        // A GeForce on 535 does not; the message names the condition the user can act on.
        let f = facts("12.2", "535.104.05", "8.9", "GeForce");
        assert_eq!(
            failing(&[expr], &f).unwrap(),
            "unsatisfied condition: cuda>=12.4"
        );
    }

    #[test]
    fn unsatisfied_names_variable_and_condition_as_written() {
        let f = facts("12.2", "535.104.05", "8.0", "tesla");
        let err = reqs(&["cuda>=12.0", "driver>=535,arch>=9.0 brand=quadro"])
            .check(&f)
            .unwrap_err();
        assert_eq!(err.variable, "NVIDIA_REQUIRE_1");
        assert_eq!(err.condition.0, "arch>=9.0");
        assert_eq!(err.to_string(), "unsatisfied condition: arch>=9.0");
    }

    #[test]
    fn without_a_gpu_only_host_conditions_count() {
        let r = reqs(&["arch>=9.0,brand=quadro,cuda>=12.0"]);
        assert!(r.check_without_gpu(&v("12.2"), &v("535")).is_ok());
        let err = r.check_without_gpu(&v("11.8"), &v("520")).unwrap_err();
        assert_eq!(err.condition.0, "cuda>=12.0");
    }

    #[test]
    fn syntax_errors() {
        use ConditionError::*;
        let s = |t: &str| Shown::from(t);
        let op = |c: &str, o: &str| UnknownOperator {
            condition: s(c),
            operator: s(o),
        };
        let version = |c: &str, v: &str| Version {
            condition: s(c),
            source: InvalidVersion(s(v)),
        };
        let cases = [
            ("cuda", NoOperator(s("cuda"))),
            (">=12", NoKey(s(">=12"))),
            ("cuda=>12", op("cuda=>12", "=>")),
            ("cuda==12", op("cuda==12", "==")),
            ("cuda>>12", op("cuda>>12", ">>")),
            ("cuda!12", op("cuda!12", "!")),
            ("cuda>=", NoValue(s("cuda>="))),
            (
                "jetpack>=5",
                UnknownKey {
                    condition: s("jetpack>=5"),
                    key: s("jetpack"),
                },
            ),
            ("brand>=tesla", BrandOrder(s("brand>=tesla"))),
            ("cuda>=12.x", version("cuda>=12.x", "12.x")),
            ("driver>=1=2", version("driver>=1=2", "1=2")),
        ];
        for (expr, want) in cases {
            let err = Requirements::default()
                .add("NVIDIA_REQUIRE_X", expr)
                .unwrap_err();
            assert_eq!(err, want, "{expr}");
            assert!(err.to_string().contains(expr), "{err}");
        }
        // An error in a later alternative is still an error (parsed whole, not lazily).
        assert!(Requirements::default().add("V", "cuda>=1 bogus=1").is_err());
        let msg = Requirements::default()
            .add("V", "cuda=>12")
            .unwrap_err()
            .to_string();
        assert!(msg.contains("\"=>\"") && msg.contains("<="), "{msg}");
    }

    proptest! {
        #[test]
        fn parsing_never_panics(expr in ".{0,80}") {
            let _ = Requirements::default().add("V", &expr);
        }

        #[test]
        fn grammar_like_input_never_panics(
            expr in "[a-zA-Z]{0,7}[<>=! ,]{0,3}[0-9.a-z]{0,8}([ ,][a-z]{0,6}[<>=!]{0,2}[0-9.]{0,6}){0,4}",
            cuda in "[0-9]{1,3}(\\.[0-9]{1,3}){0,2}",
        ) {
            let mut r = Requirements::default();
            if r.add("V", &expr).is_ok() {
                let _ = r.check(&facts(&cuda, "535.1", "8.0", "tesla"));
            }
        }

        #[test]
        fn version_order_matches_components(a in proptest::collection::vec(0u64..1000, 1..4),
                                            b in proptest::collection::vec(0u64..1000, 1..4)) {
            let text = |p: &[u64]| p.iter().map(u64::to_string).collect::<Vec<_>>().join(".");
            let pad = |p: &[u64]| { let mut p = p.to_vec(); p.resize(4, 0); p };
            prop_assert_eq!(v(&text(&a)).cmp(&v(&text(&b))), pad(&a).cmp(&pad(&b)));
        }

        #[test]
        fn lenient_never_panics(s in ".{0,30}") {
            let _ = Version::parse_lenient(&s);
        }
    }
}
