//! The OCI state a runtime passes a hook on stdin, and the few config.json fields nvhook reads.
//!
//! config.json is read through a tolerant struct rather than oci-spec's full model: oci-spec
//! rejects specs some engines write (a `process` without `user`) and nvhook needs five fields.

use crate::shown::ShownPath;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("cannot parse the OCI state on stdin: {0} (nvhook hook must be run by an OCI runtime)")]
    State(String),
    #[error("cannot read {}: {source}", ShownPath(path))]
    ReadSpec {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad OCI spec {}: {message}", ShownPath(path))]
    ParseSpec { path: PathBuf, message: String },
}

/// The container state (runtime-spec `state`), as given to hooks on stdin.
#[derive(Debug, Clone, Deserialize)]
pub struct State {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub pid: Option<i32>,
    pub bundle: PathBuf,
    /// The rootfs as the spec names it: not in the runtime-spec's state, but crun gives it.
    #[serde(default)]
    pub root: Option<PathBuf>,
}

impl State {
    pub fn parse(text: &str) -> Result<State, OciError> {
        let state: State = from_json_object(text).map_err(OciError::State)?;
        if !state.bundle.is_absolute() {
            return Err(OciError::State(format!(
                "bundle {} is not an absolute path",
                ShownPath(&state.bundle)
            )));
        }
        Ok(state)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Spec {
    #[serde(default)]
    pub process: Option<Process>,
    #[serde(default)]
    pub root: Option<Root>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub linux: Option<Linux>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Process {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub capabilities: Option<Capabilities>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Capabilities {
    #[serde(default)]
    pub bounding: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Root {
    pub path: PathBuf,
    #[serde(default)]
    pub readonly: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Mount {
    pub destination: PathBuf,
    #[serde(default)]
    pub source: Option<PathBuf>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub options: Vec<String>,
}

impl Mount {
    /// A bind mount shows the container a directory or file that lives on after it: the host's
    /// (Docker `-v`, hostPath, a PVC) or the engine's (emptyDir, /etc/hosts). Any other mount is
    /// a filesystem the runtime made for this container alone (its /dev tmpfs, /proc, /sys).
    pub fn is_bind(&self) -> bool {
        self.kind.as_deref() == Some("bind")
            || self.options.iter().any(|o| o == "bind" || o == "rbind")
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Linux {
    #[serde(default)]
    pub devices: Vec<LinuxDevice>,
    #[serde(default, rename = "rootfsPropagation")]
    pub rootfs_propagation: Option<String>,
    #[serde(default, rename = "maskedPaths")]
    pub masked_paths: Vec<String>,
    #[serde(default, rename = "readonlyPaths")]
    pub readonly_paths: Vec<String>,
    #[serde(default, rename = "cgroupsPath")]
    pub cgroups_path: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct LinuxDevice {
    pub path: PathBuf,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub major: Option<i64>,
    #[serde(default)]
    pub minor: Option<i64>,
}

impl Spec {
    pub fn parse(text: &str, path: &Path) -> Result<Spec, OciError> {
        from_json_object(text).map_err(|message| OciError::ParseSpec {
            path: path.to_path_buf(),
            message,
        })
    }

    /// The spec of config.json `text`, with the whole document as JSON for a caller that edits
    /// it and writes it back (unknown fields kept): the text is parsed once.
    pub fn parse_with_document(
        text: &str,
        path: &Path,
    ) -> Result<(Spec, serde_json::Value), OciError> {
        let parse_error = |message: String| OciError::ParseSpec {
            path: path.to_path_buf(),
            message,
        };
        let document: serde_json::Value = from_json_object(text).map_err(parse_error)?;
        let spec = Spec::deserialize(&document).map_err(|e| parse_error(e.to_string()))?;
        Ok((spec, document))
    }

    /// The value of an environment variable in `process.env`; the last entry wins, as in execve users.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.process
            .as_ref()?
            .env
            .iter()
            .rev()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
    }

    /// Every `NAME=value` of `process.env` whose name starts with `prefix`, last entry winning.
    pub fn env_with_prefix(&self, prefix: &str) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for kv in self.process.iter().flat_map(|p| p.env.iter()) {
            if let Some((k, v)) = kv.split_once('=')
                && k.starts_with(prefix)
            {
                out.insert(k.to_string(), v.to_string());
            }
        }
        out
    }

    /// CAP_SYS_ADMIN in the bounding set is what the NVIDIA stack calls "privileged".
    pub fn privileged(&self) -> bool {
        self.process
            .as_ref()
            .and_then(|p| p.capabilities.as_ref())
            .is_some_and(|c| c.bounding.iter().any(|cap| cap == "CAP_SYS_ADMIN"))
    }

    /// The container's rootfs: `root.path`, relative to the bundle unless absolute.
    pub fn rootfs(&self, bundle: &Path) -> Option<PathBuf> {
        self.root.as_ref().map(|r| bundle.join(&r.path))
    }

    /// `linux.rootfsPropagation` where it is shared (`shared`, `rshared`): mounts made under
    /// the rootfs would then propagate to the host's view of it.
    pub fn shared_rootfs_propagation(&self) -> Option<&str> {
        let propagation = self.linux.as_ref()?.rootfs_propagation.as_deref()?;
        propagation.contains("shared").then_some(propagation)
    }

    /// Whether the runtime leaves the container's procfs whole: no masked or read-only path
    /// under `/proc` (an absent list masks nothing, as the runtime spec says).
    pub fn proc_unmasked(&self) -> bool {
        let Some(linux) = &self.linux else {
            return true;
        };
        !linux
            .masked_paths
            .iter()
            .chain(&linux.readonly_paths)
            .any(|p| Path::new(p).starts_with("/proc"))
    }

    /// `linux.cgroupsPath`: where the runtime makes the container's cgroup.
    pub fn cgroups_path(&self) -> Option<&str> {
        self.linux.as_ref()?.cgroups_path.as_deref()
    }

    pub fn devices(&self) -> &[LinuxDevice] {
        self.linux.as_ref().map_or(&[], |l| &l.devices)
    }

    /// The spec's mounts as the rootfs's write boundary needs them: destination, and whether
    /// it is a bind (something that outlives the container).
    pub fn mount_points(&self) -> Vec<MountPoint> {
        self.mounts
            .iter()
            .filter_map(|m| {
                Some(MountPoint {
                    destination: m.destination.to_str()?.to_string(),
                    bind: m.is_bind(),
                })
            })
            .collect()
    }
}

/// Where the runtime mounted something in the container, and whether that is a bind mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPoint {
    pub destination: String,
    pub bind: bool,
}

/// serde reads a struct from a JSON array too (`[]` would be an empty spec): the state and
/// config.json are objects, and anything else is malformed input.
fn from_json_object<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    if !text.trim_start().starts_with('{') {
        return Err("not a JSON object".into());
    }
    serde_json::from_str(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_requires_absolute_bundle() {
        let s = State::parse(
            r#"{"ociVersion":"1.0.2","id":"c","status":"created","pid":42,"bundle":"/b"}"#,
        )
        .unwrap();
        assert_eq!(s.pid, Some(42));
        assert!(State::parse(r#"{"bundle":"rel"}"#).is_err());
        assert!(State::parse("not json").is_err());
        assert!(State::parse(r#"["c", 42, "/b"]"#).is_err());
        assert!(Spec::parse("[]", Path::new("c.json")).is_err());
    }

    #[test]
    fn the_spec_with_its_document_is_the_spec_parse_reads() {
        let text = r#"{"ociVersion":"1.2.0","process":{"env":["NVIDIA_VISIBLE_DEVICES=0"]},
            "root":{"path":"rootfs"},"mounts":[{"destination":"/proc","type":"proc"}],
            "annotations":{"a":"b"},"hooks":{"prestart":[]},"x-unknown":{"kept":true}}"#;
        let path = Path::new("config.json");
        let (spec, document) = Spec::parse_with_document(text, path).unwrap();
        let alone = Spec::parse(text, path).unwrap();
        assert_eq!(format!("{spec:?}"), format!("{alone:?}"));
        assert_eq!(
            document,
            serde_json::from_str::<serde_json::Value>(text).unwrap()
        );
        for bad in ["[]", "not json", r#"{"process":{"env":"A=1"}}"#] {
            let e = Spec::parse_with_document(bad, path).unwrap_err();
            assert!(matches!(e, OciError::ParseSpec { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn env_last_wins_and_prefix() {
        let spec = Spec::parse(
            r#"{"process":{"env":["A=1","NVIDIA_X=a","A=2","NVIDIA_Y=b=c"]}}"#,
            Path::new("c.json"),
        )
        .unwrap();
        assert_eq!(spec.env("A"), Some("2"));
        assert_eq!(spec.env("NVIDIA"), None);
        let m = spec.env_with_prefix("NVIDIA_");
        assert_eq!(m["NVIDIA_Y"], "b=c");
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn bind_mounts_are_told_from_the_containers_own() {
        let spec = Spec::parse(
            r#"{"mounts":[
                {"destination":"/dev","type":"tmpfs","source":"tmpfs","options":["nosuid"]},
                {"destination":"/proc","type":"proc","source":"proc"},
                {"destination":"/data","type":"bind","source":"/srv/v","options":["rw"]},
                {"destination":"/cfg","source":"/srv/c","options":["rbind","ro"]},
                {"destination":"/x","type":"none","source":"/srv/x","options":["bind"]}
            ]}"#,
            Path::new("c.json"),
        )
        .unwrap();
        let points = spec.mount_points();
        let binds: Vec<(&str, bool)> = points
            .iter()
            .map(|m| (m.destination.as_str(), m.bind))
            .collect();
        assert_eq!(
            binds,
            [
                ("/dev", false),
                ("/proc", false),
                ("/data", true),
                ("/cfg", true),
                ("/x", true)
            ]
        );
    }

    #[test]
    fn privileged_from_bounding_set() {
        let spec = Spec::parse(
            r#"{"process":{"user":{"uid":0,"gid":0},"capabilities":{"bounding":["CAP_SYS_ADMIN"]}},"unknown":{"x":1}}"#,
            Path::new("c.json"),
        )
        .unwrap();
        assert!(spec.privileged());
        assert!(!Spec::default().privileged());
    }
}
