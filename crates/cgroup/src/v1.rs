//! cgroup v1: append rules to the container's `devices.allow`.

use super::{CgroupError, DeviceRule};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

/// Writes each rule to `<dir>/devices.allow`, one write per rule, since the kernel parses
/// exactly one rule per write.
pub(super) fn allow(dir: &Path, rules: &[DeviceRule]) -> Result<(), CgroupError> {
    if rules.is_empty() {
        return Ok(());
    }
    let path = dir.join("devices.allow");
    let write_error = |rule: &DeviceRule, source| CgroupError::Write {
        rule: *rule,
        path: path.clone(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| write_error(&rules[0], e))?;
    for rule in rules {
        file.write_all(rule.to_string().as_bytes())
            .map_err(|e| write_error(rule, e))?;
    }
    tracing::debug!(path = %path.display(), count = rules.len(), "allowed devices in cgroup v1");
    Ok(())
}
