//! Kubernetes node labels for this node's GPUs, named as NVIDIA's GPU feature discovery
//! names them (`nvidia.com/gpu.product`, `nvidia.com/cuda.driver.major`, ...), so node
//! selectors written for it select the same nodes; and the file Node Feature Discovery's
//! `local` source reads them from.
//!
//! Product, memory, family and compute capability are the first GPU's, as GPU feature
//! discovery reports them: a node's GPUs are one model in practice.
//!
//! Mixed fleets (x86_64 and Grace's aarch64 nodes): GPU feature discovery labels no CPU
//! architecture, and neither does nvhook. The kubelet labels every node `kubernetes.io/arch`
//! (`amd64`, `arm64`), which is what a node selector for an architecture names; NFD's local
//! source would drop a `kubernetes.io/` label anyway. What GPU feature discovery does say about
//! the machine is `gpu.machine`, the DMI product name (`/sys/class/dmi/id/product_name`), which
//! tells a Grace Hopper system from an x86_64 server: nvhook labels it the same way.

use crate::inventory::{Gpu, System};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The namespace GPU feature discovery labels in.
pub const DEFAULT_PREFIX: &str = "nvidia.com";

/// Where GPU feature discovery reads `gpu.machine` (its `--machine-type-file`), under the
/// sys root.
pub const MACHINE_TYPE_FILE: &str = "class/dmi/id/product_name";

/// The most characters of a label's name (after the prefix) and of its value.
const MAX_LEN: usize = 63;
/// The most characters of the prefix, a DNS subdomain.
const MAX_PREFIX_LEN: usize = 253;

/// A `--prefix` that is no label namespace: a usage error.
#[derive(Debug, thiserror::Error)]
#[error(
    "--prefix {0:?}: expected a DNS subdomain such as nvidia.com (lower-case letters, digits, '-' and '.', at most 253 characters)"
)]
pub struct PrefixError(pub String);

/// Checks `--prefix` before anything is read from the host.
pub fn check_prefix(prefix: &str) -> Result<(), PrefixError> {
    if valid_prefix(prefix) {
        Ok(())
    } else {
        Err(PrefixError(prefix.to_owned()))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    #[error(transparent)]
    Prefix(#[from] PrefixError),
    #[error(
        "--mig-strategy single: {0}; the single strategy needs every GPU split into MIG devices of one profile (use mixed)"
    )]
    NotSingle(String),
}

/// How the device plugin offers MIG devices, which decides the MIG labels, as GPU feature
/// discovery's `--mig-strategy` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigStrategy {
    /// MIG devices are not offered: no MIG labels beyond `mig.capable`.
    None,
    /// `nvidia.com/gpu` is a MIG device: `gpu.count` counts them and `gpu.product` names
    /// their profile (`NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`).
    Single,
    /// Each profile is a resource of its own: `mig-<profile>.count`.
    Mixed,
}

/// Label name → value, sorted by name; every name and value valid Kubernetes label syntax.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Labels(BTreeMap<String, String>);

impl Labels {
    /// The labels for what NVML reports and the machine type (the text of
    /// [`MACHINE_TYPE_FILE`], None where it cannot be read), under `prefix` (`nvidia.com`).
    pub fn for_system(
        system: &System,
        machine_type: Option<&str>,
        prefix: &str,
        strategy: MigStrategy,
    ) -> Result<Labels, LabelError> {
        check_prefix(prefix)?;
        let mut labels = Labels(BTreeMap::new());
        let mut set = |name: &str, value: &str| {
            labels
                .0
                .insert(format!("{prefix}/{}", sanitize(name)), sanitize(value));
        };
        // The shipped RuntimeClass schedules GPU pods onto nodes with this label: a node that
        // nvhook alone labels must carry it.
        set(
            "gpu.present",
            if system.gpus.is_empty() {
                "false"
            } else {
                "true"
            },
        );
        set("gpu.count", &system.gpus.len().to_string());
        // As GPU feature discovery: the trimmed file, `unknown` where there is none.
        let machine = machine_type.map(str::trim).filter(|m| !m.is_empty());
        set("gpu.machine", machine.unwrap_or("unknown"));
        let driver: Vec<&str> = system.driver_version.split('.').collect();
        let driver_part = |i: usize| driver.get(i).copied().filter(|p| !p.is_empty());
        for (i, (old, new)) in [("major", "major"), ("minor", "minor"), ("rev", "revision")]
            .into_iter()
            .enumerate()
        {
            if let Some(part) = driver_part(i) {
                set(&format!("cuda.driver.{old}"), part);
                set(&format!("cuda.driver-version.{new}"), part);
            }
        }
        set("cuda.driver-version.full", &system.driver_version);
        if let Some((major, minor)) = system.cuda_version.split_once('.') {
            for (part, value) in [("major", major), ("minor", minor)] {
                set(&format!("cuda.runtime.{part}"), value);
                set(&format!("cuda.runtime-version.{part}"), value);
            }
        }
        set("cuda.runtime-version.full", &system.cuda_version);
        if let Some(gpu) = system.gpus.first() {
            set("gpu.product", &gpu.name);
            set("gpu.family", &gpu.architecture);
            if let Some(mib) = gpu.memory_mib {
                set("gpu.memory", &mib.to_string());
            }
            if let Some((major, minor)) = gpu.compute_capability.split_once('.') {
                set("gpu.compute.major", major);
                set("gpu.compute.minor", minor);
            }
        }
        let capable = !system.gpus.is_empty() && system.gpus.iter().all(|g| g.mig_capable);
        set("mig.capable", if capable { "true" } else { "false" });
        let profiles = mig_profiles(&system.gpus);
        match strategy {
            MigStrategy::None => {}
            MigStrategy::Mixed => {
                set("mig.strategy", "mixed");
                for (profile, count) in &profiles {
                    set(&format!("mig-{profile}.count"), &count.to_string());
                }
            }
            MigStrategy::Single => {
                set("mig.strategy", "single");
                if let Some((profile, count)) = single_profile(&system.gpus, &profiles)? {
                    let product = system.gpus.first().map_or("", |g| g.name.as_str());
                    set("gpu.product", &format!("{product}-MIG-{profile}"));
                    set("gpu.count", &count.to_string());
                    // The GPU's memory is not a MIG device's; NVML's answer has no MIG memory.
                    labels.0.remove(&format!("{prefix}/gpu.memory"));
                }
            }
        }
        Ok(labels)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// `name=value` lines, as `kubectl label node NODE ...` takes them.
    /// `<prefix>/gpu.memory-limits`: whether this node sets the GPU memory limits containers
    /// ask for (NVIDIA_GPU_MEMORY_REQUEST/LIMIT), so that a scheduler can keep such pods off
    /// nodes that would refuse them or run them unlimited.
    pub fn with_memory_limits(mut self, prefix: &str, enforced: bool) -> Labels {
        self.0
            .insert(format!("{prefix}/gpu.memory-limits"), enforced.to_string());
        self
    }

    pub fn to_text(&self) -> String {
        self.iter().fold(String::new(), |mut out, (name, value)| {
            let _ = writeln!(out, "{name}={value}");
            out
        })
    }

    /// A feature file for Node Feature Discovery's `local` source: its `name=value` lines,
    /// after a comment (NFD skips lines that start with `#`).
    pub fn to_nfd(&self) -> String {
        format!(
            "# Node labels for this node's NVIDIA GPUs, written by `nvhook labels --format nfd`.\n{}",
            self.to_text()
        )
    }
}

/// How many MIG devices of each profile the node has: what a pod asks for as
/// `nvidia.com/mig-<profile>` under the device plugin's `mixed` strategy.
fn mig_profiles(gpus: &[Gpu]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for mig in gpus.iter().flat_map(|g| &g.mig_devices) {
        if let Some(profile) = mig_profile(&mig.name) {
            *counts.entry(profile.to_owned()).or_default() += 1;
        }
    }
    counts
}

/// Under the single strategy: None when no GPU has MIG on (full GPUs are offered); the one
/// profile and the number of MIG devices when every GPU is split into that profile alone.
fn single_profile(
    gpus: &[Gpu],
    profiles: &BTreeMap<String, usize>,
) -> Result<Option<(String, usize)>, LabelError> {
    if gpus.iter().all(|g| !g.mig_enabled) {
        return Ok(None);
    }
    if let Some(whole) = gpus.iter().find(|g| !g.mig_enabled) {
        return Err(LabelError::NotSingle(format!(
            "GPU {} has MIG off while others have it on",
            whole.index
        )));
    }
    match profiles.iter().collect::<Vec<_>>().as_slice() {
        [(profile, count)] => Ok(Some(((*profile).clone(), **count))),
        many => Err(LabelError::NotSingle(format!(
            "the MIG devices are of {} profiles",
            many.len()
        ))),
    }
}

/// The profile in a MIG device's NVML name: `NVIDIA A100-SXM4-80GB MIG 1g.10gb` → `1g.10gb`.
fn mig_profile(name: &str) -> Option<&str> {
    let (_, profile) = name.rsplit_once(" MIG ")?;
    Some(profile.trim()).filter(|p| !p.is_empty())
}

/// Kubernetes label syntax: at most 63 characters of `[A-Za-z0-9._-]`, starting and ending
/// with a letter or digit (or empty). Anything else becomes `-`, as GPU feature discovery
/// turns the spaces of a product name into dashes.
fn sanitize(text: &str) -> String {
    let replaced: String = text
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '-',
        })
        .collect();
    let trimmed = replaced.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let cut = &trimmed[..trimmed.len().min(MAX_LEN)];
    cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

/// A DNS subdomain: dot-separated lower-case alphanumeric parts, `-` inside a part.
fn valid_prefix(prefix: &str) -> bool {
    prefix.len() <= MAX_PREFIX_LEN
        && prefix.split('.').all(|part| {
            let bytes = part.as_bytes();
            !part.is_empty()
                && part.len() <= MAX_LEN
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
                && bytes[0] != b'-'
                && bytes[bytes.len() - 1] != b'-'
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::MigDevice;

    fn gpu(index: u32, migs: &[&str]) -> Gpu {
        Gpu {
            index,
            uuid: format!("GPU-{index}"),
            minor: Some(index),
            pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + index),
            name: "NVIDIA A100-SXM4-80GB".into(),
            brand: "tesla".into(),
            architecture: "ampere".into(),
            compute_capability: "8.0".into(),
            memory_mib: Some(81920),
            persistence_mode: Some(true),
            mig_capable: true,
            mig_enabled: !migs.is_empty(),
            mig_devices: migs
                .iter()
                .zip(0..)
                .map(|(profile, i)| MigDevice {
                    index: i,
                    uuid: format!("MIG-{index}-{i}"),
                    name: format!("NVIDIA A100-SXM4-80GB MIG {profile}"),
                    gpu_instance_id: i + 1,
                    compute_instance_id: 0,
                    gi_cap_minor: None,
                    ci_cap_minor: None,
                    profile: None,
                    gpu_instance_profile_id: None,
                    placement: None,
                    memory_mib: None,
                })
                .collect(),
            mig_profiles: Vec::new(),
        }
    }

    fn system(gpus: Vec<Gpu>) -> System {
        System {
            driver_version: "550.54.15".into(),
            cuda_version: "12.4".into(),
            gpus,
            memory_limits: false,
        }
    }

    fn labels(system: &System) -> BTreeMap<String, String> {
        Labels::for_system(system, Some("DGX A100"), DEFAULT_PREFIX, MigStrategy::Mixed)
            .unwrap()
            .0
    }

    #[test]
    fn names_and_values_of_gpu_feature_discovery() {
        let got = labels(&system(vec![
            gpu(0, &[]),
            gpu(1, &["3g.40gb", "3g.40gb"]),
            gpu(2, &["1g.10gb", "2g.20gb+me"]),
        ]));
        let want = [
            ("nvidia.com/gpu.count", "3"),
            ("nvidia.com/gpu.machine", "DGX-A100"),
            ("nvidia.com/gpu.present", "true"),
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
            ("nvidia.com/gpu.family", "ampere"),
            ("nvidia.com/gpu.memory", "81920"),
            ("nvidia.com/gpu.compute.major", "8"),
            ("nvidia.com/gpu.compute.minor", "0"),
            ("nvidia.com/cuda.driver.major", "550"),
            ("nvidia.com/cuda.driver.minor", "54"),
            ("nvidia.com/cuda.driver.rev", "15"),
            ("nvidia.com/cuda.driver-version.major", "550"),
            ("nvidia.com/cuda.driver-version.minor", "54"),
            ("nvidia.com/cuda.driver-version.revision", "15"),
            ("nvidia.com/cuda.driver-version.full", "550.54.15"),
            ("nvidia.com/cuda.runtime.major", "12"),
            ("nvidia.com/cuda.runtime.minor", "4"),
            ("nvidia.com/cuda.runtime-version.major", "12"),
            ("nvidia.com/cuda.runtime-version.minor", "4"),
            ("nvidia.com/cuda.runtime-version.full", "12.4"),
            ("nvidia.com/mig.capable", "true"),
            ("nvidia.com/mig.strategy", "mixed"),
            ("nvidia.com/mig-3g.40gb.count", "2"),
            ("nvidia.com/mig-1g.10gb.count", "1"),
            ("nvidia.com/mig-2g.20gb-me.count", "1"),
        ];
        let want: BTreeMap<String, String> = want
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_mig_strategy_decides_the_mig_labels() {
        let split = system(vec![gpu(0, &["1g.10gb"; 7]), gpu(1, &["1g.10gb"; 7])]);
        let with = |system: &System, strategy| {
            Labels::for_system(system, None, DEFAULT_PREFIX, strategy).map(|l| l.0)
        };
        let none = with(&split, MigStrategy::None).unwrap();
        assert!(
            !none
                .keys()
                .any(|k| k.contains("mig-") || k.contains("mig.strategy"))
        );
        assert_eq!(none["nvidia.com/gpu.count"], "2");

        let single = with(&split, MigStrategy::Single).unwrap();
        assert_eq!(single["nvidia.com/mig.strategy"], "single");
        assert_eq!(single["nvidia.com/gpu.count"], "14");
        assert_eq!(
            single["nvidia.com/gpu.product"],
            "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
        );
        assert!(!single.contains_key("nvidia.com/gpu.memory"));
        assert!(!single.keys().any(|k| k.contains("mig-")));

        let whole = system(vec![gpu(0, &[]), gpu(1, &[])]);
        let single_whole = with(&whole, MigStrategy::Single).unwrap();
        assert_eq!(single_whole["nvidia.com/gpu.count"], "2");
        assert_eq!(single_whole["nvidia.com/gpu.memory"], "81920");

        for odd in [
            system(vec![gpu(0, &["1g.10gb"]), gpu(1, &[])]),
            system(vec![gpu(0, &["1g.10gb", "2g.20gb"])]),
        ] {
            let err = with(&odd, MigStrategy::Single).unwrap_err().to_string();
            assert!(err.starts_with("--mig-strategy single: "), "{err}");
        }
    }

    #[test]
    fn the_machine_type_is_gpu_feature_discovery_s() {
        let on = |machine: Option<&str>| {
            Labels::for_system(
                &system(vec![gpu(0, &[])]),
                machine,
                DEFAULT_PREFIX,
                MigStrategy::None,
            )
            .unwrap()
            .0["nvidia.com/gpu.machine"]
                .clone()
        };
        // A Grace Hopper system's DMI product name, as the file holds it (newline included).
        assert_eq!(
            on(Some("GH200 Grace Hopper Superchip\n")),
            "GH200-Grace-Hopper-Superchip"
        );
        assert_eq!(on(Some("  \n")), "unknown");
        assert_eq!(on(None), "unknown");
        // No label names a CPU architecture: the kubelet's kubernetes.io/arch does.
        let labels = labels(&system(vec![gpu(0, &[])]));
        assert!(!labels.keys().any(|k| k.contains("arch")), "{labels:?}");
    }

    #[test]
    fn a_node_without_gpus_says_so() {
        let got = labels(&system(vec![]));
        assert_eq!(got["nvidia.com/gpu.count"], "0");
        assert_eq!(got["nvidia.com/gpu.present"], "false");
        assert_eq!(got["nvidia.com/mig.capable"], "false");
        assert!(!got.contains_key("nvidia.com/gpu.product"));
    }

    #[test]
    fn facts_nvml_did_not_report_are_left_out() {
        let mut old = gpu(0, &[]);
        old.memory_mib = None;
        old.mig_capable = false;
        let mut sys = system(vec![old]);
        sys.driver_version = "535.104".into();
        let got = labels(&sys);
        assert!(!got.contains_key("nvidia.com/gpu.memory"));
        assert!(!got.contains_key("nvidia.com/cuda.driver.rev"));
        assert_eq!(got["nvidia.com/cuda.driver.minor"], "104");
        assert_eq!(got["nvidia.com/mig.capable"], "false");
    }

    #[test]
    fn values_are_label_syntax() {
        assert_eq!(
            sanitize("NVIDIA GeForce RTX 4090"),
            "NVIDIA-GeForce-RTX-4090"
        );
        assert_eq!(sanitize(" (Tesla) V100 "), "Tesla--V100");
        assert_eq!(sanitize(""), "");
        assert_eq!(sanitize("--"), "");
        let long = sanitize(&format!("{}-{}", "a".repeat(62), "b".repeat(10)));
        assert_eq!(long, "a".repeat(62), "cut to 63, then no trailing dash");
        let mut odd = gpu(0, &[]);
        odd.name = format!("Ünïcode GPU/{}", "x".repeat(80));
        for (name, value) in
            Labels::for_system(&system(vec![odd]), None, "example.org", MigStrategy::None)
                .unwrap()
                .iter()
        {
            let (prefix, name) = name.split_once('/').unwrap();
            assert_eq!(prefix, "example.org");
            for text in [name, value] {
                assert!(text.len() <= MAX_LEN, "{text}");
                assert!(
                    text.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                );
                assert!(text.is_empty() || text.starts_with(|c: char| c.is_ascii_alphanumeric()));
                assert!(text.is_empty() || text.ends_with(|c: char| c.is_ascii_alphanumeric()));
            }
        }
    }

    /// Kubernetes' rule for a label value (`IsValidLabelValue` in k8s.io/apimachinery), written
    /// out here as the automaton of its regular expression, independent of `sanitize`: empty,
    /// or at most 63 characters matching `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?`.
    fn k8s_label_value(value: &str) -> bool {
        #[derive(Clone, Copy, PartialEq)]
        enum State {
            Start,
            /// The last character matched `[A-Za-z0-9]`: the value may end here.
            Alnum,
            /// The last character matched `[-_.]`: another `[A-Za-z0-9]` must follow.
            Inner,
        }
        let mut state = State::Start;
        for c in value.chars() {
            let alnum = matches!(c, 'A'..='Z' | 'a'..='z' | '0'..='9');
            let inner = matches!(c, '-' | '_' | '.');
            state = match (state, alnum, inner) {
                (_, true, _) => State::Alnum,
                (State::Alnum | State::Inner, false, true) => State::Inner,
                _ => return false,
            };
        }
        value.chars().count() <= 63 && state != State::Inner
    }

    /// A label name's part after the prefix: the same syntax, and never empty.
    fn k8s_label_name(name: &str) -> bool {
        !name.is_empty() && k8s_label_value(name)
    }

    /// Every label of `system` under every MIG strategy (where the strategy applies), each name
    /// and value checked against Kubernetes' rules; `fed` says what the names were.
    #[track_caller]
    fn assert_label_syntax(system: &System, machine: Option<&str>, fed: &str) {
        for strategy in [MigStrategy::None, MigStrategy::Single, MigStrategy::Mixed] {
            let Ok(labels) = Labels::for_system(system, machine, DEFAULT_PREFIX, strategy) else {
                continue;
            };
            for (name, value) in labels.iter() {
                let (prefix, name) = name.split_once('/').unwrap();
                assert_eq!(prefix, DEFAULT_PREFIX);
                assert!(
                    k8s_label_name(name),
                    "fed {fed} ({strategy:?} strategy): label name {name:?} is refused by the API server"
                );
                assert!(
                    k8s_label_value(value),
                    "fed {fed} ({strategy:?} strategy): {name}={value:?} is refused by the API server"
                );
            }
        }
    }

    /// A node whose every text NVML reports is `text`: the product name, architecture,
    /// versions, and one MIG device of profile `text`; the machine type too.
    fn node_saying(text: &str) -> System {
        let mut g = gpu(0, &[text]);
        g.name = text.to_string();
        g.architecture = text.to_string();
        g.compute_capability = format!("{text}.{text}");
        System {
            driver_version: format!("{text}.{text}.{text}"),
            cuda_version: format!("{text}.{text}"),
            gpus: vec![g],
            memory_limits: false,
        }
    }

    #[test]
    fn the_label_rule_written_here_is_kubernetes() {
        for good in [
            "",
            "a",
            "9",
            "a-b",
            "A.b_c9",
            "a--b",
            "a_.-b",
            &"x".repeat(63),
        ] {
            assert!(k8s_label_value(good), "{good:?}");
        }
        for bad in [
            "-a",
            "a-",
            "_",
            ".",
            "a b",
            "a[b",
            "a\\b",
            "a]b",
            "a^b",
            "a`b",
            "a/b",
            "Ü",
            "a\n",
            &"x".repeat(64),
        ] {
            assert!(!k8s_label_value(bad), "{bad:?}");
        }
        assert!(!k8s_label_name(""));
    }

    /// Product, MIG profile and machine names with every character class they may carry: each
    /// ASCII punctuation character and control character, alone, inside, leading and trailing,
    /// at the 63-character cut; spaces; non-ASCII letters, marks, emoji and invisible characters;
    /// over-long names. Every label the API server is given must be one it accepts.
    #[test]
    fn every_character_a_product_or_mig_profile_may_carry_gives_valid_labels() {
        let mut texts: Vec<String> = Vec::new();
        let specials = (0u8..=0x7f)
            .map(char::from)
            .filter(|c| !c.is_ascii_alphanumeric());
        for c in specials {
            texts.extend([
                format!("NVIDIA{c}A100"),
                format!("{c}NVIDIA A100 80GB{c}"),
                format!("{c}"),
                format!("{c}{c}x{c}{c}"),
                format!("1g.10gb{c}me"),
                format!("A100{c}{c}{c}"),
                // The cut at 63 characters falls on `c`, or just after it.
                format!("{}{c}{}", "a".repeat(62), "b".repeat(10)),
                format!("{}{c}{}", "a".repeat(63), "b".repeat(10)),
                format!("{}{c}{c}", "a".repeat(61)),
            ]);
        }
        for text in [
            "NVIDIA GeForce RTX 4090",
            "  Tesla   V100  ",
            "\tA100\n",
            "Ünïcode GPU",
            "GPU™ Ω",
            "ＧＰＵ Ａ１００",
            "GPU\u{200b}X",
            "e\u{301}GPU",
            "🚀 GPU 🚀",
            "显卡 H100",
            "\u{202e}001A",
            "",
            " ",
        ] {
            texts.push(text.to_string());
        }
        texts.push("x".repeat(200));
        texts.push("Z".repeat(64));
        texts.push(format!("{}Ü", "a".repeat(62)));
        for text in &texts {
            assert_label_syntax(&node_saying(text), Some(text), &format!("{text:?}"));
        }
    }

    proptest::proptest! {
        /// Any text at all: printable, control, any Unicode.
        #[test]
        fn any_names_give_valid_labels(
            product in "\\PC{0,80}|[ -~]{0,80}|.{0,80}",
            profile in "[ -~]{1,70}|\\PC{1,70}",
            machine in proptest::option::of(".{0,80}"),
        ) {
            let mut system = node_saying(&profile);
            system.gpus[0].name = product.clone();
            let fed = format!("product {product:?}, profile {profile:?}, machine {machine:?}");
            assert_label_syntax(&system, machine.as_deref(), &fed);
        }
    }

    #[test]
    fn a_prefix_must_be_a_dns_subdomain() {
        for bad in ["", "Nvidia.com", "nvidia.com/", "-a.com", "a..b", "a_b.com"] {
            assert!(
                Labels::for_system(&system(vec![]), None, bad, MigStrategy::None).is_err(),
                "{bad:?} accepted"
            );
        }
        assert!(
            Labels::for_system(
                &system(vec![]),
                None,
                "gpu.example-1.org",
                MigStrategy::None
            )
            .is_ok()
        );
    }

    #[test]
    fn the_nfd_file_is_comment_then_name_value_lines() {
        let labels = Labels::for_system(
            &system(vec![gpu(0, &[])]),
            None,
            DEFAULT_PREFIX,
            MigStrategy::None,
        )
        .unwrap();
        let nfd = labels.to_nfd();
        let mut lines = nfd.lines();
        assert!(lines.next().unwrap().starts_with('#'));
        let rest: Vec<&str> = lines.collect();
        assert_eq!(rest, labels.to_text().lines().collect::<Vec<_>>());
        assert!(rest.contains(&"nvidia.com/gpu.count=1"));
    }

    #[test]
    fn memory_limits_label_says_whether_the_node_sets_them() {
        let labels = Labels::for_system(&system(vec![]), None, "example.org", MigStrategy::None)
            .unwrap()
            .with_memory_limits("example.org", true);
        assert_eq!(labels.0["example.org/gpu.memory-limits"], "true");
        let labels = labels.with_memory_limits("example.org", false);
        assert_eq!(labels.0["example.org/gpu.memory-limits"], "false");
    }
}
