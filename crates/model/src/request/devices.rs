//! Device ids and device lists, as written in `NVIDIA_VISIBLE_DEVICES` and in the
//! volume mounts the Kubernetes device plugin adds under `/var/run/nvidia-container-devices/`.

use crate::oci::Spec;
use crate::shown::Shown;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

/// Where the device plugin's `deviceListStrategy=volume-mounts` puts one empty mount per device.
pub const DEVICE_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";

/// The GPUs a GPU container asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelection {
    /// `none`: no GPU device, but the driver files for the capabilities.
    NoDevices,
    /// `all`: every GPU, and every MIG device where MIG is enabled.
    All,
    /// Explicit devices, in the order given, without duplicates.
    List(Vec<DeviceId>),
}

/// One device as a container names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceId {
    /// NVML index, e.g. `0`.
    Index(u32),
    /// `GPU-<uuid>`, kept whole.
    GpuUuid(String),
    /// `MIG-<uuid>` (or the R450 form `MIG-GPU-<uuid>/<gi>/<ci>`), kept whole.
    MigUuid(String),
    /// Kernel form: lower case, at least 4 domain digits, e.g. `0000:3b:00.0`.
    PciBusId(String),
    /// `G:M`: MIG device M of GPU G.
    MigIndex { gpu: u32, mig: u32 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown device \"{0}\" (use an index, GPU-<uuid>, MIG-<uuid>, a PCI bus id, G:M, all or none)"
)]
pub struct UnknownDevice(pub Shown);

impl FromStr for DeviceId {
    type Err = UnknownDevice;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_device(s).ok_or_else(|| UnknownDevice(s.into()))
    }
}

fn parse_device(s: &str) -> Option<DeviceId> {
    if let Some(index) = decimal(s) {
        return Some(DeviceId::Index(index));
    }
    if let Some(body) = s.strip_prefix("GPU-") {
        return uuid_body(body, false).then(|| DeviceId::GpuUuid(s.to_string()));
    }
    if let Some(body) = s.strip_prefix("MIG-") {
        return uuid_body(body, true).then(|| DeviceId::MigUuid(s.to_string()));
    }
    // A MIG index has no '.', a PCI bus id always ends in ".<function>": no ambiguity.
    if let Some((gpu, mig)) = s.split_once(':')
        && let (Some(gpu), Some(mig)) = (decimal(gpu), decimal(mig))
    {
        return Some(DeviceId::MigIndex { gpu, mig });
    }
    pci_bus_id(s).map(DeviceId::PciBusId)
}

fn decimal(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// NVML UUIDs are hex groups joined by '-'; the pre-R470 MIG form adds `/gi/ci`.
fn uuid_body(body: &str, allow_slash: bool) -> bool {
    !body.is_empty()
        && body
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || (allow_slash && c == '/'))
}

/// Accepts `DDDD:BB:DD.F`, NVML's 8-digit-domain form, upper case, and `BB:DD.F` (domain 0),
/// and returns the kernel form that `/proc/driver/nvidia/gpus/` and the inventory use.
fn pci_bus_id(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.split(':').collect();
    let (domain, bus, dev_fn) = match parts[..] {
        [domain, bus, dev_fn] => (hex(domain, 4..=8)?, bus, dev_fn),
        [bus, dev_fn] => (0, bus, dev_fn),
        _ => return None,
    };
    let (device, function) = dev_fn.split_once('.')?;
    let (bus, device, function) = (hex(bus, 2..=2)?, hex(device, 2..=2)?, hex(function, 1..=1)?);
    // PCI allows 32 devices per bus and 8 functions per device.
    (device < 32 && function < 8)
        .then(|| format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

fn hex(s: &str, digits: std::ops::RangeInclusive<usize>) -> Option<u32> {
    if !digits.contains(&s.len()) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(s, 16).ok()
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::Index(i) => write!(f, "{i}"),
            DeviceId::GpuUuid(s) | DeviceId::MigUuid(s) | DeviceId::PciBusId(s) => f.write_str(s),
            DeviceId::MigIndex { gpu, mig } => write!(f, "{gpu}:{mig}"),
        }
    }
}

impl fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSelection::NoDevices => f.write_str("none"),
            DeviceSelection::All => f.write_str("all"),
            DeviceSelection::List(ids) => {
                for (i, id) in ids.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{id}")?;
                }
                Ok(())
            }
        }
    }
}

/// The items of a device list ([`super::list_items`]), or `None` when nothing is requested:
/// no item left, or any item is `void`.
pub(crate) fn requested_items<'a>(
    items: impl IntoIterator<Item = &'a str>,
) -> Option<Vec<&'a str>> {
    let items = super::list_items(items);
    (!items.is_empty() && !items.contains(&"void")).then_some(items)
}

/// The selection a requested list makes: `none` wins over `all`, and either makes the other
/// items irrelevant (the toolkit does not look at them, so neither do we); otherwise every
/// item must be a device id.
pub(crate) fn selection(items: &[&str]) -> Result<DeviceSelection, UnknownDevice> {
    if items.contains(&"none") {
        return Ok(DeviceSelection::NoDevices);
    }
    if items.contains(&"all") {
        return Ok(DeviceSelection::All);
    }
    let mut ids: Vec<DeviceId> = Vec::with_capacity(items.len());
    for item in items {
        let id = item.parse()?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(DeviceSelection::List(ids))
}

/// Device ids from the spec's volume mounts: a mount of host `/dev/null` onto
/// `/var/run/nvidia-container-devices/<id>`. Only the kubelet can add a mount whose source is
/// a host path, which is why this list is trusted where the image's environment is not.
pub(crate) fn mount_device_ids(spec: &Spec) -> Vec<String> {
    let mut ids = mount_ids(spec);
    // IMEX channel requests share the directory but select no GPU.
    ids.retain(|id| !id.starts_with(super::imex_and_families::IMEX_MOUNT_PREFIX));
    ids
}

/// Every id under the device-list directory, IMEX channels (`imex/<n>`) included.
pub(crate) fn mount_ids(spec: &Spec) -> Vec<String> {
    let root = Path::new(DEVICE_MOUNT_ROOT);
    spec.mounts
        .iter()
        .filter(|m| m.source.as_deref().map(lexical_clean) == Some(PathBuf::from("/dev/null")))
        .filter_map(|m| {
            let rest = lexical_clean(&m.destination);
            let rest = rest.strip_prefix(root).ok()?.to_string_lossy().into_owned();
            (!rest.is_empty()).then_some(rest)
        })
        .collect()
}

/// Resolves `.` and `..` without touching the filesystem (Go's `filepath.Clean`), so that
/// `/var/run/nvidia-container-devices/../x` does not count as a device mount.
fn lexical_clean(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> DeviceId {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn device_id_forms() {
        let uuid = "GPU-4cf8db2d-06c0-7d70-1a51-e59b25b2c16c";
        let cases = [
            ("0", DeviceId::Index(0)),
            ("17", DeviceId::Index(17)),
            (uuid, DeviceId::GpuUuid(uuid.into())),
            (
                "MIG-1d1a2b3c-0000-5e6f-7a8b-9c0d1e2f3a4b",
                DeviceId::MigUuid("MIG-1d1a2b3c-0000-5e6f-7a8b-9c0d1e2f3a4b".into()),
            ),
            (
                "MIG-GPU-4cf8/1/0",
                DeviceId::MigUuid("MIG-GPU-4cf8/1/0".into()),
            ),
            ("0:1", DeviceId::MigIndex { gpu: 0, mig: 1 }),
            ("12:3", DeviceId::MigIndex { gpu: 12, mig: 3 }),
            ("0000:3b:00.0", DeviceId::PciBusId("0000:3b:00.0".into())),
            (
                "00000000:3B:00.0",
                DeviceId::PciBusId("0000:3b:00.0".into()),
            ),
            ("3b:00.0", DeviceId::PciBusId("0000:3b:00.0".into())),
            ("10:00.1", DeviceId::PciBusId("0000:10:00.1".into())),
            ("10000:01:1f.7", DeviceId::PciBusId("10000:01:1f.7".into())),
        ];
        for (text, want) in cases {
            assert_eq!(id(text), want, "{text}");
        }
    }

    #[test]
    fn display_gives_the_form_back() {
        for text in ["3", "GPU-ab-cd", "MIG-ef-01", "0000:3b:00.0", "1:2"] {
            assert_eq!(id(text).to_string(), text);
        }
        assert_eq!(id("0000:3B:00.0").to_string(), "0000:3b:00.0");
    }

    #[test]
    fn unknown_devices() {
        for text in [
            "gpu7",
            "GPU-",
            "GPU-ab/cd",
            "MIG-",
            "-1",
            "+1",
            "4294967296",
            "0:",
            ":1",
            "0:1:2",
            "3b:00",
            "3b:20.0",
            "3b:00.8",
            "000:3b:00.0",
            "0000:3b:0.0",
            "0000:3b:00.00",
            "zz:00.0",
            "1.5",
            "a/b",
        ] {
            let err = text.parse::<DeviceId>().unwrap_err();
            assert_eq!(err, UnknownDevice(text.into()));
        }
        let msg = "gpu7".parse::<DeviceId>().unwrap_err().to_string();
        assert!(msg.contains("\"gpu7\"") && msg.contains("G:M"), "{msg}");
    }

    #[test]
    fn list_special_values_follow_the_toolkit() {
        use DeviceSelection::*;
        let parse = |value: &str| requested_items(value.split(',')).map(|i| selection(&i));
        let cases = [
            ("", None),
            (" , ,", None),
            ("void", None),
            ("0,void", None),
            ("none,void", None),
            ("none", Some(Ok(NoDevices))),
            ("all,none", Some(Ok(NoDevices))),
            ("all", Some(Ok(All))),
            ("0,all,junk", Some(Ok(All))),
            (
                " 1,0 ,1",
                Some(Ok(List(vec![DeviceId::Index(1), DeviceId::Index(0)]))),
            ),
            ("0,bogus", Some(Err(UnknownDevice("bogus".into())))),
        ];
        for (value, want) in cases {
            assert_eq!(parse(value), want, "{value:?}");
        }
    }

    #[test]
    fn selection_display() {
        let list = DeviceSelection::List(vec![DeviceId::Index(0), id("1:2")]);
        assert_eq!(list.to_string(), "0,1:2");
        assert_eq!(DeviceSelection::All.to_string(), "all");
        assert_eq!(DeviceSelection::NoDevices.to_string(), "none");
    }

    #[test]
    fn clean_resolves_dots() {
        assert_eq!(
            lexical_clean(Path::new("/a/./b/../c//d/")),
            Path::new("/a/c/d")
        );
        assert_eq!(lexical_clean(Path::new("/../..")), Path::new("/"));
    }
}
