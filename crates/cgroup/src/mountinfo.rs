//! `/proc/<pid>/mountinfo` lines, read by the cgroup lookup and by nvhook for a container it
//! knows only by its process (nvidia-container-cli's `configure`).

use std::path::PathBuf;

/// The fields of one mountinfo line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// `major:minor` of the filesystem: the same for every mount of one filesystem.
    pub device: String,
    /// The directory of the filesystem this mount shows (`/` unless it is a bind of a subtree).
    pub root: String,
    pub mount_point: PathBuf,
    /// Propagation tags: `shared:N`, `master:N`, `propagate_from:N`, `unbindable`.
    pub optional: Vec<String>,
    pub fstype: String,
    pub super_options: String,
}

impl Mount {
    pub fn has_super_option(&self, option: &str) -> bool {
        self.super_options.split(',').any(|o| o == option)
    }

    /// Mounts made under it propagate to its peers.
    pub fn is_shared(&self) -> bool {
        self.optional.iter().any(|tag| tag.starts_with("shared:"))
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |n, b| n.wrapping_mul(8) + (b - b'0')));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One line; None for a line that is not a mountinfo entry.
pub fn parse_mount(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split(' ').collect();
    let separator = fields.iter().position(|f| *f == "-")?;
    let (before, after) = (fields.get(..separator)?, fields.get(separator + 1..)?);
    Some(Mount {
        device: (*before.get(2)?).to_owned(),
        root: unescape(before.get(3)?),
        mount_point: PathBuf::from(unescape(before.get(4)?)),
        optional: before.get(6..)?.iter().map(|t| (*t).to_owned()).collect(),
        fstype: (*after.first()?).to_owned(),
        super_options: (*after.get(2)?).to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_propagation_tags() {
        let mount = parse_mount(
            "612 611 0:61 / /run/c/rootfs/dev rw,nosuid master:3 propagate_from:1 - tmpfs tmpfs rw,mode=755",
        )
        .unwrap();
        assert_eq!(mount.device, "0:61");
        assert_eq!(mount.optional, ["master:3", "propagate_from:1"]);
        assert!(!mount.is_shared());
        let shared = parse_mount("22 1 259:1 / / rw shared:1 - ext4 /dev/root rw").unwrap();
        assert!(shared.is_shared());
        assert!(parse_mount("not a mount").is_none());
    }
}
