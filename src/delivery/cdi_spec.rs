//! The CDI spec document: its types, its version rules and its validation.
//!
//! Validation is nvhook's own, written from the CDI specification, rather than the
//! `container-device-interface` crate's: that crate validates through `jsonschema`, whose
//! dependency tree (an HTTP client among it) would cost more to build than the rules below,
//! which are few and are what engines check (`pkg/cdi` in the Go library).

use crate::shown::{SHOWN_BYTES, Shown};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// The kind nvhook's specs declare, as NVIDIA's do, so device names carry over.
pub const KIND: &str = "nvidia.com/gpu";

/// A CDI spec file (`/etc/cdi/*.yaml`, `/var/run/cdi/*.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CdiSpec {
    #[serde(rename = "cdiVersion")]
    pub cdi_version: String,
    /// `vendor/class`.
    pub kind: String,
    pub devices: Vec<Device>,
    /// Applied once whenever any device of this spec is injected.
    #[serde(
        rename = "containerEdits",
        default,
        skip_serializing_if = "ContainerEdits::is_empty"
    )]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    #[serde(rename = "containerEdits")]
    pub container_edits: ContainerEdits,
}

/// The changes a device makes to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(rename = "deviceNodes", default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceNode {
    /// In the container.
    pub path: String,
    /// On the host, when it differs from `path` (CDI 0.5.0).
    #[serde(rename = "hostPath", default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Permission bits of the node the runtime creates.
    #[serde(rename = "fileMode", default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// cgroup access: a combination of `r`, `w`, `m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    #[serde(rename = "hostPath")]
    pub host_path: String,
    #[serde(rename = "containerPath")]
    pub container_path: String,
    /// CDI 0.4.0; without it runtimes take a mount whose options say `bind` as a bind mount.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    /// The OCI hook stage: `createContainer`, `prestart`, ...
    #[serde(rename = "hookName")]
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

/// The OCI hook stages a CDI hook may name.
const HOOK_NAMES: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// The released CDI spec versions, oldest first. Engines vendor different CDI libraries and
/// refuse versions newer than theirs (Podman 4.3 stops at 0.5.0), so a spec states the oldest
/// version its fields allow, never simply the newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CdiVersion {
    V0_3_0,
    V0_4_0,
    V0_5_0,
    V0_6_0,
    V0_7_0,
    V0_8_0,
    V1_0_0,
}

impl CdiVersion {
    const ALL: [(CdiVersion, &'static str); 7] = [
        (CdiVersion::V0_3_0, "0.3.0"),
        (CdiVersion::V0_4_0, "0.4.0"),
        (CdiVersion::V0_5_0, "0.5.0"),
        (CdiVersion::V0_6_0, "0.6.0"),
        (CdiVersion::V0_7_0, "0.7.0"),
        (CdiVersion::V0_8_0, "0.8.0"),
        (CdiVersion::V1_0_0, "1.0.0"),
    ];

    pub fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(v, _)| *v == self)
            .map_or("?", |(_, s)| s)
    }
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CdiVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<CdiVersion, String> {
        // 0.1.0 and 0.2.0 predate the fields every current engine reads the same way.
        Self::ALL
            .iter()
            .find(|(_, name)| *name == s.trim_start_matches('v'))
            .map(|(v, _)| *v)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|(_, s)| *s).collect();
                format!(
                    "cdiVersion {s:?} is not a CDI version nvhook knows ({})",
                    known.join(", ")
                )
            })
    }
}

/// The oldest CDI version that has every field `spec` uses.
pub fn minimum_version(spec: &CdiSpec) -> CdiVersion {
    let edits = || {
        std::iter::once(&spec.container_edits)
            .chain(spec.devices.iter().map(|d| &d.container_edits))
    };
    let mut min = CdiVersion::V0_3_0;
    if edits().flat_map(|e| &e.mounts).any(|m| m.kind.is_some()) {
        min = CdiVersion::V0_4_0;
    }
    let name_not_letter = spec
        .devices
        .iter()
        .any(|d| !d.name.starts_with(|c: char| c.is_ascii_alphabetic()));
    let host_path = edits()
        .flat_map(|e| &e.device_nodes)
        .any(|n| n.host_path.is_some());
    if name_not_letter || host_path {
        min = CdiVersion::V0_5_0;
    }
    // A dot in the class (`nvidia.com/gpu.mig`) came with 0.6.0.
    if spec
        .kind
        .split_once('/')
        .is_some_and(|(_, c)| c.contains('.'))
    {
        min = CdiVersion::V0_6_0;
    }
    min
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CDI spec: {0}")]
pub struct InvalidSpec(pub String);

/// `message` with each value it quotes (`"..."` as Rust's `{:?}` writes it, or `` `...` ``,
/// as serde's messages quote a file's strings and keys) cut as [`Shown`] cuts a value, so that
/// a file's content never makes the line longer than a few hundred characters.
pub fn cut_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(512));
    let mut rest = message;
    while let Some(at) = rest.find(['"', '`']) {
        out.push_str(&rest[..at]);
        let quote = rest[at..].chars().next().expect("found a quote");
        let inner = &rest[at + 1..];
        // The closing quote: for `"`, the first one no backslash escapes.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in inner.char_indices() {
            match c {
                '\\' if quote == '"' && !escaped => escaped = true,
                c if c == quote && !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let (quoted, after) = match end {
            Some(end) => (&inner[..end], &inner[end + 1..]),
            None => (inner, ""),
        };
        out.push(quote);
        if quoted.len() <= SHOWN_BYTES {
            out.push_str(quoted);
            out.push(quote);
        } else {
            // `"` holds an escaped value: shown as Shown shows it, unescaped first.
            let value = match quote {
                '"' => unescape_debug(quoted).unwrap_or_else(|| quoted.to_owned()),
                _ => quoted.to_owned(),
            };
            let shown = Shown(value).to_string();
            // `VALUE… (N bytes)`: the quote closes the value, the length follows it.
            match shown.rsplit_once("… (") {
                Some((head, tail)) => {
                    out.push_str(head);
                    out.push('…');
                    out.push(quote);
                    out.push_str(" (");
                    out.push_str(tail);
                }
                None => {
                    out.push_str(&shown);
                    out.push(quote);
                }
            }
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// The string whose `{:?}` is `escaped` (without its quotes); None for an escape Rust does
/// not write.
fn unescape_debug(escaped: &str) -> Option<String> {
    let mut out = String::with_capacity(escaped.len());
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        out.push(match chars.next()? {
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            '0' => '\0',
            c @ ('\\' | '"' | '\'') => c,
            'u' => {
                let rest = chars.as_str().strip_prefix('{')?;
                let (hex, after) = rest.split_once('}')?;
                chars = after.chars();
                char::from_u32(u32::from_str_radix(hex, 16).ok()?)?
            }
            _ => return None,
        });
    }
    Some(out)
}

/// Checks `spec` as engines do before they inject any of its devices.
pub fn validate(spec: &CdiSpec) -> Result<(), InvalidSpec> {
    let fail = |m: String| Err(InvalidSpec(m));
    let version: CdiVersion = spec.cdi_version.parse().map_err(InvalidSpec)?;
    let min = minimum_version(spec);
    if version < min {
        return fail(format!(
            "cdiVersion {version} is too old for the fields used (needs {min})"
        ));
    }
    let Some((vendor, class)) = spec.kind.split_once('/') else {
        return fail(format!("kind {:?} is not vendor/class", spec.kind));
    };
    for (what, name) in [("vendor", vendor), ("class", class)] {
        check_name(name, false, "._-").map_err(|e| InvalidSpec(format!("{what} {e}")))?;
    }
    if spec.devices.is_empty() {
        return fail("no devices".into());
    }
    let mut seen = BTreeSet::new();
    for device in &spec.devices {
        check_name(&device.name, true, "._-:")
            .map_err(|e| InvalidSpec(format!("device name {e}")))?;
        if !seen.insert(device.name.as_str()) {
            return fail(format!("device {:?} is defined twice", device.name));
        }
        if device.container_edits.is_empty() {
            return fail(format!("device {:?} has no container edits", device.name));
        }
        validate_edits(&device.container_edits)
            .map_err(|e| InvalidSpec(format!("device {:?}: {}", device.name, e.0)))?;
    }
    validate_edits(&spec.container_edits)
}

/// CDI names: ASCII letters and digits, plus `extra` inside; the first character a letter
/// (or, for device names, a digit too), the last a letter or digit.
fn check_name(name: &str, digit_first: bool, extra: &str) -> Result<(), String> {
    let first_ok = |c: char| c.is_ascii_alphabetic() || (digit_first && c.is_ascii_digit());
    let (Some(first), Some(last)) = (name.chars().next(), name.chars().last()) else {
        return Err("is empty".into());
    };
    if !first_ok(first) || !last.is_ascii_alphanumeric() {
        return Err(format!(
            "{name:?} must start with a letter{} and end with a letter or digit",
            if digit_first { " or digit" } else { "" }
        ));
    }
    match name
        .chars()
        .find(|c| !c.is_ascii_alphanumeric() && !extra.contains(*c))
    {
        Some(c) => Err(format!("{name:?} has the invalid character {c:?}")),
        None => Ok(()),
    }
}

fn validate_edits(edits: &ContainerEdits) -> Result<(), InvalidSpec> {
    let fail = |m: String| Err(InvalidSpec(m));
    check_env(&edits.env)?;
    for node in &edits.device_nodes {
        if !node.path.starts_with('/') {
            return fail(format!("device node path {:?} is not absolute", node.path));
        }
        if let Some(kind) = &node.kind
            && !["b", "c", "u", "p"].contains(&kind.as_str())
        {
            return fail(format!("device node {}: invalid type {kind:?}", node.path));
        }
        if let Some(p) = &node.permissions
            && (p.is_empty() || !p.chars().all(|c| "rwm".contains(c)))
        {
            return fail(format!(
                "device node {}: invalid permissions {p:?}",
                node.path
            ));
        }
    }
    for mount in &edits.mounts {
        if mount.host_path.is_empty() || !mount.container_path.starts_with('/') {
            return fail(format!(
                "mount {:?} -> {:?} needs a host path and an absolute container path",
                mount.host_path, mount.container_path
            ));
        }
    }
    for hook in &edits.hooks {
        if !HOOK_NAMES.contains(&hook.hook_name.as_str()) {
            return fail(format!("invalid hook name {:?}", hook.hook_name));
        }
        if !hook.path.starts_with('/') {
            return fail(format!("hook path {:?} is not absolute", hook.path));
        }
        check_env(&hook.env)?;
    }
    Ok(())
}

fn check_env(env: &[String]) -> Result<(), InvalidSpec> {
    match env.iter().find(|kv| kv.find('=').is_none_or(|i| i == 0)) {
        Some(kv) => Err(InvalidSpec(format!(
            "environment entry {kv:?} is not NAME=value"
        ))),
        None => Ok(()),
    }
}

/// Spec file formats engines read (by file name extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "yaml" => Ok(Format::Yaml),
            "json" => Ok(Format::Json),
            _ => Err(format!("unknown format {s:?} (use yaml or json)")),
        }
    }
}

impl Format {
    /// JSON for a `.json` file name, else YAML (what NVIDIA's tools write by default).
    pub fn for_path(path: Option<&std::path::Path>) -> Format {
        match path.and_then(|p| p.extension()).and_then(|e| e.to_str()) {
            Some("json") => Format::Json,
            _ => Format::Yaml,
        }
    }
}

impl CdiSpec {
    pub fn to_text(&self, format: Format) -> String {
        match format {
            Format::Json => {
                let mut s = serde_json::to_string_pretty(self).expect("a spec encodes as JSON");
                s.push('\n');
                s
            }
            Format::Yaml => {
                let body = serde_norway::to_string(self).expect("a spec encodes as YAML");
                format!("---\n{body}")
            }
        }
    }

    /// Reads a spec as engines do: YAML, of which JSON is a subset. A file that is no
    /// mapping at all (any text file is a YAML string) is said to be no spec, not quoted.
    pub fn parse(text: &str) -> Result<CdiSpec, InvalidSpec> {
        serde_norway::from_str(text).map_err(|e| {
            use serde_norway::Value;
            let holds = match serde_norway::from_str::<Value>(text) {
                Ok(Value::Mapping(_)) | Err(_) => None,
                Ok(Value::Null) => Some("nothing"),
                Ok(Value::Bool(_)) => Some("a boolean"),
                Ok(Value::Number(_)) => Some("a number"),
                Ok(Value::String(_)) => Some("text"),
                Ok(Value::Sequence(_)) => Some("a list"),
                Ok(Value::Tagged(_)) => Some("a tagged value"),
            };
            InvalidSpec(match holds {
                Some(what) => format!(
                    "not a CDI spec: the file holds {what}, where a spec is a mapping of cdiVersion, kind and devices"
                ),
                None => cut_quoted(&e.to_string()).replace('\n', " "),
            })
        })
    }

    /// `vendor/class=name` of every device.
    pub fn qualified_names(&self) -> Vec<String> {
        self.devices
            .iter()
            .map(|d| format!("{}={}", self.kind, d.name))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_values_are_cut_as_echo_cuts_them() {
        let long = format!("{}\n{}", "a".repeat(70), "b".repeat(10));
        let message = format!("invalid type: string {long:?}, expected a sequence");
        assert_eq!(
            cut_quoted(&message),
            format!(
                "invalid type: string \"{}…\" (81 bytes), expected a sequence",
                "a".repeat(64)
            )
        );
        // Escapes are kept whole, short values and the rest of the line as they were.
        let escaped = format!(
            "{:?} and `{}` and {:?}",
            "\u{1b}".repeat(20),
            "k".repeat(80),
            "it's"
        );
        assert_eq!(
            cut_quoted(&escaped),
            format!(
                "\"{}…\" (20 bytes) and `{}…` (80 bytes) and \"it's\"",
                "\\u{1b}".repeat(10),
                "k".repeat(64)
            )
        );
        assert_eq!(
            cut_quoted("missing field `cdiVersion`"),
            "missing field `cdiVersion`"
        );
        assert_eq!(cut_quoted("a \"b\\\"c\" d"), "a \"b\\\"c\" d");
        let open = format!("unterminated \"{}", "z".repeat(100));
        assert_eq!(
            cut_quoted(&open),
            format!("unterminated \"{}…\" (100 bytes)", "z".repeat(64))
        );
    }

    fn node(path: &str, host_path: Option<&str>) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: host_path.map(Into::into),
            kind: Some("c".into()),
            major: Some(195),
            minor: Some(0),
            file_mode: Some(0o666),
            permissions: Some("rw".into()),
        }
    }

    fn spec(names: &[&str]) -> CdiSpec {
        CdiSpec {
            cdi_version: "0.3.0".into(),
            kind: "nvidia.com/gpu".into(),
            devices: names
                .iter()
                .map(|n| Device {
                    name: (*n).into(),
                    container_edits: ContainerEdits {
                        device_nodes: vec![node("/dev/nvidia0", None)],
                        ..ContainerEdits::default()
                    },
                })
                .collect(),
            container_edits: ContainerEdits::default(),
        }
    }

    fn mount(kind: Option<&str>) -> Mount {
        Mount {
            host_path: "/usr/bin/nvidia-smi".into(),
            container_path: "/usr/bin/nvidia-smi".into(),
            kind: kind.map(Into::into),
            options: vec!["ro".into(), "rbind".into()],
        }
    }

    #[test]
    fn minimum_version_follows_the_fields_used() {
        let mut s = spec(&["all", "GPU-1234"]);
        assert_eq!(minimum_version(&s), CdiVersion::V0_3_0);
        s.container_edits.mounts.push(mount(None));
        assert_eq!(minimum_version(&s), CdiVersion::V0_3_0, "untyped mount");
        s.container_edits.mounts.push(mount(Some("bind")));
        assert_eq!(minimum_version(&s), CdiVersion::V0_4_0, "mount type");
        // Device names may start with a digit only from 0.5.0: `0`, `1:0`.
        assert_eq!(minimum_version(&spec(&["0"])), CdiVersion::V0_5_0);
        assert_eq!(minimum_version(&spec(&["all", "1:0"])), CdiVersion::V0_5_0);
        // So may device nodes name a different host path.
        let mut s = spec(&["all"]);
        s.devices[0].container_edits.device_nodes[0].host_path = Some("/node/dev/nvidia0".into());
        assert_eq!(minimum_version(&s), CdiVersion::V0_5_0, "hostPath");
        let mut s = spec(&["all"]);
        s.kind = "nvidia.com/gpu.mig".into();
        assert_eq!(minimum_version(&s), CdiVersion::V0_6_0, "dot in class");
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!("0.5.0".parse::<CdiVersion>(), Ok(CdiVersion::V0_5_0));
        assert_eq!("v1.0.0".parse::<CdiVersion>(), Ok(CdiVersion::V1_0_0));
        assert!(CdiVersion::V0_4_0 < CdiVersion::V0_5_0);
        let e = "0.9.9".parse::<CdiVersion>().unwrap_err();
        assert!(e.contains("0.9.9") && e.contains("0.8.0"), "{e}");
        assert_eq!(CdiVersion::V0_5_0.to_string(), "0.5.0");
    }

    #[test]
    fn validation_rejects_what_engines_reject() {
        let ok = {
            let mut s = spec(&["0", "all"]);
            s.cdi_version = "0.5.0".into();
            s
        };
        validate(&ok).unwrap();
        let bad = |edit: &dyn Fn(&mut CdiSpec), needle: &str| {
            let mut s = ok.clone();
            edit(&mut s);
            let e = validate(&s).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
            assert!(!e.contains('\n'), "{e}");
        };
        bad(&|s| s.cdi_version = "0.4.0".into(), "needs 0.5.0");
        bad(&|s| s.cdi_version = "2".into(), "not a CDI version");
        bad(&|s| s.kind = "gpu".into(), "vendor/class");
        bad(&|s| s.kind = "nvidia.com/-gpu".into(), "class");
        bad(&|s| s.kind = "1nvidia.com/gpu".into(), "vendor");
        bad(
            &|s| s.devices[0].name = "gpu/0".into(),
            "invalid character '/'",
        );
        bad(&|s| s.devices[0].name = "0:".into(), "end with");
        bad(&|s| s.devices[1].name = "0".into(), "defined twice");
        bad(&|s| s.devices.clear(), "no devices");
        bad(
            &|s| s.devices[0].container_edits = ContainerEdits::default(),
            "no container edits",
        );
        bad(
            &|s| s.container_edits.env.push("NOVALUE".into()),
            "NAME=value",
        );
        bad(
            &|s| s.devices[0].container_edits.device_nodes[0].kind = Some("x".into()),
            "invalid type",
        );
        bad(
            &|s| s.devices[0].container_edits.device_nodes[0].permissions = Some("rwx".into()),
            "invalid permissions",
        );
        bad(
            &|s| s.devices[0].container_edits.device_nodes[0].path = "dev/x".into(),
            "not absolute",
        );
        bad(
            &|s| {
                s.container_edits.mounts.push(Mount {
                    container_path: "relative".into(),
                    ..mount(None)
                })
            },
            "absolute container path",
        );
        let hook = Hook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/nvhook".into(),
            args: vec![],
            env: vec!["PATH=/bin".into()],
            timeout: Some(30),
        };
        bad(
            &|s| {
                s.container_edits.hooks.push(Hook {
                    hook_name: "beforeEverything".into(),
                    ..hook.clone()
                })
            },
            "invalid hook name",
        );
        bad(
            &|s| {
                s.container_edits.hooks.push(Hook {
                    path: "nvhook".into(),
                    ..hook.clone()
                })
            },
            "hook path",
        );
    }

    #[test]
    fn yaml_and_json_round_trip() {
        let mut s = spec(&["0", "all"]);
        s.cdi_version = "0.5.0".into();
        s.container_edits.mounts.push(mount(None));
        for format in [Format::Yaml, Format::Json] {
            let text = s.to_text(format);
            assert_eq!(CdiSpec::parse(&text).unwrap(), s, "{text}");
        }
        let json = s.to_text(Format::Json);
        assert!(json.contains("\"cdiVersion\": \"0.5.0\""), "{json}");
        assert!(json.contains("\"containerPath\""), "{json}");
        assert_eq!(
            s.qualified_names(),
            vec!["nvidia.com/gpu=0", "nvidia.com/gpu=all"]
        );
        assert_eq!(
            Format::for_path(Some("/etc/cdi/x.json".as_ref())),
            Format::Json
        );
        assert_eq!(
            Format::for_path(Some("/etc/cdi/x.yaml".as_ref())),
            Format::Yaml
        );
        assert_eq!(Format::for_path(None), Format::Yaml);
    }
}
