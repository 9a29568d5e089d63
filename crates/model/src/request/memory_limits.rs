//! Per-container GPU memory limits: `NVIDIA_GPU_MEMORY_REQUEST` and `NVIDIA_GPU_MEMORY_LIMIT`
//! (NVIDIA's hook reads the plural names first), in MiB, each the same for every GPU of the
//! container. The driver holds the request as memory the container is guaranteed and the
//! limit as what it may never pass, per cgroup v2 path (`nvmlDeviceSetMemoryLimits_v1`).
//!
//! Where NVIDIA's hook skips a pair it cannot read (one of the two unset does nothing at all),
//! nvhook refuses it: a container that meant to be limited learns so at once.

use crate::config::{Config, GpuMemoryLimits};
use crate::oci::Spec;
use crate::shown::Shown;
use serde::{Deserialize, Serialize};

pub const MEMORY_REQUEST: &str = "NVIDIA_GPU_MEMORY_REQUEST";
pub const MEMORY_REQUESTS: &str = "NVIDIA_GPU_MEMORY_REQUESTS";
pub const MEMORY_LIMIT: &str = "NVIDIA_GPU_MEMORY_LIMIT";
pub const MEMORY_LIMITS: &str = "NVIDIA_GPU_MEMORY_LIMITS";

const MIB: u64 = 1024 * 1024;

/// A container's GPU memory limits, the same on each of its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryLimits {
    /// Guaranteed (the driver's soft limit), MiB.
    pub request_mib: u64,
    /// Never passed (the driver's hard limit), MiB.
    pub limit_mib: u64,
}

impl MemoryLimits {
    /// The two limits as the driver takes them: bytes.
    pub fn bytes(&self) -> (u64, u64) {
        (self.request_mib * MIB, self.limit_mib * MIB)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryLimitError {
    #[error(
        "{variable}={value}: not a number of MiB (use a whole number of MiB, such as 8192, or unset it)"
    )]
    NotMib {
        variable: &'static str,
        value: Shown,
    },
    #[error(
        "{set} is set and {unset} is not: set both (MiB per GPU, the request no more than the limit) or neither"
    )]
    OnlyOne {
        set: &'static str,
        unset: &'static str,
    },
    #[error("{first}={first_value} and {second}={second_value} disagree: set one of the two names")]
    TwoNames {
        first: &'static str,
        first_value: Shown,
        second: &'static str,
        second_value: Shown,
    },
    #[error(
        "GPU memory request {request_mib} MiB is more than the limit {limit_mib} MiB: the request is what the container is guaranteed, the limit what it may never pass"
    )]
    RequestAboveLimit { request_mib: u64, limit_mib: u64 },
    #[error("a GPU memory limit of 0 MiB leaves the container no GPU memory (set at least 1)")]
    ZeroLimit,
}

/// The limits `spec` asks for, or the node's default where it asks for none; `None` where
/// there are none, or the node takes none (`gpu-memory-limits = "off"`).
pub fn memory_limits(
    spec: &Spec,
    config: &Config,
) -> Result<Option<MemoryLimits>, MemoryLimitError> {
    let request = mib(spec, MEMORY_REQUESTS, MEMORY_REQUEST)?;
    let limit = mib(spec, MEMORY_LIMITS, MEMORY_LIMIT)?;
    let asked = match (request, limit) {
        (None, None) => None,
        (Some(request_mib), Some(limit_mib)) => Some(MemoryLimits {
            request_mib,
            limit_mib,
        }),
        (Some(_), None) => {
            return Err(MemoryLimitError::OnlyOne {
                set: MEMORY_REQUEST,
                unset: MEMORY_LIMIT,
            });
        }
        (None, Some(_)) => {
            return Err(MemoryLimitError::OnlyOne {
                set: MEMORY_LIMIT,
                unset: MEMORY_REQUEST,
            });
        }
    };
    let Some(limits) = asked.or(config.default_gpu_memory_limits()) else {
        return Ok(None);
    };
    if config.gpu_memory_limits == GpuMemoryLimits::Off {
        tracing::info!(
            ?limits,
            "GPU memory limits ignored: gpu-memory-limits = \"off\" on this node"
        );
        return Ok(None);
    }
    check(limits).map(Some)
}

/// Limits the driver can hold: a request within the limit, and some memory.
pub fn check(limits: MemoryLimits) -> Result<MemoryLimits, MemoryLimitError> {
    if limits.limit_mib == 0 {
        return Err(MemoryLimitError::ZeroLimit);
    }
    if limits.request_mib > limits.limit_mib {
        return Err(MemoryLimitError::RequestAboveLimit {
            request_mib: limits.request_mib,
            limit_mib: limits.limit_mib,
        });
    }
    Ok(limits)
}

/// The MiB of the first of `names` set (NVIDIA reads the plural first); both set must agree.
fn mib(
    spec: &Spec,
    plural: &'static str,
    singular: &'static str,
) -> Result<Option<u64>, MemoryLimitError> {
    let read = |name: &'static str| -> Result<Option<(u64, &str)>, MemoryLimitError> {
        let Some(value) = spec.env(name).filter(|v| !v.trim().is_empty()) else {
            return Ok(None);
        };
        parse_mib(value.trim())
            .map(|n| Some((n, value)))
            .ok_or_else(|| MemoryLimitError::NotMib {
                variable: name,
                value: value.into(),
            })
    };
    match (read(plural)?, read(singular)?) {
        (Some((a, first)), Some((b, second))) if a != b => Err(MemoryLimitError::TwoNames {
            first: plural,
            first_value: first.into(),
            second: singular,
            second_value: second.into(),
        }),
        (Some((n, _)), _) | (None, Some((n, _))) => Ok(Some(n)),
        (None, None) => Ok(None),
    }
}

/// Decimal MiB that fit in bytes: no sign, no unit.
pub fn parse_mib(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>()
        .ok()
        .filter(|n| n.checked_mul(MIB).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::fixtures::spec;

    fn limits(env: &[&str], config: &Config) -> Result<Option<MemoryLimits>, String> {
        memory_limits(&spec(env, &[]), config).map_err(|e| e.to_string())
    }

    fn mib(request_mib: u64, limit_mib: u64) -> Option<MemoryLimits> {
        Some(MemoryLimits {
            request_mib,
            limit_mib,
        })
    }

    #[test]
    fn both_names_and_spellings_give_mib_per_gpu() {
        let config = Config::default();
        assert_eq!(limits(&[], &config), Ok(None));
        let pair = [
            "NVIDIA_GPU_MEMORY_REQUEST=4096",
            "NVIDIA_GPU_MEMORY_LIMIT=8192",
        ];
        assert_eq!(limits(&pair, &config), Ok(mib(4096, 8192)));
        let plural = [
            "NVIDIA_GPU_MEMORY_REQUESTS=1",
            "NVIDIA_GPU_MEMORY_LIMITS= 2 ",
        ];
        assert_eq!(limits(&plural, &config), Ok(mib(1, 2)));
        let same = [
            "NVIDIA_GPU_MEMORY_REQUESTS=10",
            "NVIDIA_GPU_MEMORY_REQUEST=10",
            "NVIDIA_GPU_MEMORY_LIMIT=10",
        ];
        assert_eq!(limits(&same, &config), Ok(mib(10, 10)));
        assert_eq!(mib(4096, 8192).unwrap().bytes(), (4 << 30, 8 << 30));
    }

    #[test]
    fn a_pair_that_cannot_be_meant_is_refused_in_one_line() {
        let config = Config::default();
        let cases: [(&[&str], &str); 7] = [
            (
                &["NVIDIA_GPU_MEMORY_LIMIT=8192"],
                "NVIDIA_GPU_MEMORY_LIMIT is set and NVIDIA_GPU_MEMORY_REQUEST is not",
            ),
            (
                &["NVIDIA_GPU_MEMORY_REQUEST=1"],
                "NVIDIA_GPU_MEMORY_REQUEST is set and NVIDIA_GPU_MEMORY_LIMIT is not",
            ),
            (
                &["NVIDIA_GPU_MEMORY_REQUEST=8G", "NVIDIA_GPU_MEMORY_LIMIT=9"],
                "NVIDIA_GPU_MEMORY_REQUEST=8G: not a number of MiB",
            ),
            (
                &["NVIDIA_GPU_MEMORY_REQUEST=-1", "NVIDIA_GPU_MEMORY_LIMIT=9"],
                "not a number of MiB",
            ),
            (
                // Would overflow bytes.
                &[
                    "NVIDIA_GPU_MEMORY_REQUEST=1",
                    "NVIDIA_GPU_MEMORY_LIMIT=18446744073709551615",
                ],
                "NVIDIA_GPU_MEMORY_LIMIT=18446744073709551615: not a number of MiB",
            ),
            (
                &["NVIDIA_GPU_MEMORY_REQUEST=9", "NVIDIA_GPU_MEMORY_LIMIT=8"],
                "request 9 MiB is more than the limit 8 MiB",
            ),
            (
                &[
                    "NVIDIA_GPU_MEMORY_REQUESTS=1",
                    "NVIDIA_GPU_MEMORY_REQUEST=2",
                    "NVIDIA_GPU_MEMORY_LIMIT=9",
                ],
                "NVIDIA_GPU_MEMORY_REQUESTS=1 and NVIDIA_GPU_MEMORY_REQUEST=2 disagree",
            ),
        ];
        for (env, needle) in cases {
            let line = limits(env, &config).unwrap_err();
            assert!(
                line.contains(needle) && !line.contains('\n'),
                "{env:?}: {line}"
            );
        }
        let zero = ["NVIDIA_GPU_MEMORY_REQUEST=0", "NVIDIA_GPU_MEMORY_LIMIT=0"];
        assert!(
            limits(&zero, &config)
                .unwrap_err()
                .contains("leaves the container no GPU memory")
        );
    }

    #[test]
    fn the_nodes_default_serves_a_container_that_sets_none_and_off_sets_nothing() {
        let config = Config {
            default_gpu_memory_request_mib: Some(0),
            default_gpu_memory_limit_mib: Some(20_000),
            ..Config::default()
        };
        assert_eq!(limits(&[], &config), Ok(mib(0, 20_000)));
        let own = ["NVIDIA_GPU_MEMORY_REQUEST=1", "NVIDIA_GPU_MEMORY_LIMIT=2"];
        assert_eq!(limits(&own, &config), Ok(mib(1, 2)));
        let off = Config {
            gpu_memory_limits: GpuMemoryLimits::Off,
            ..config
        };
        assert_eq!(limits(&own, &off), Ok(None));
        assert_eq!(limits(&[], &off), Ok(None));
    }
}
