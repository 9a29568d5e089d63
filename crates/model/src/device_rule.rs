//! A cgroup device rule as plain data: what the plan asks for and what both cgroup versions
//! enforce, in the v1 text form (`c 195:0 rw`) that logs and configs use.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The kind of device node a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DeviceKind {
    #[serde(rename = "c")]
    Char,
    #[serde(rename = "b")]
    Block,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceKind::Char => "c",
            DeviceKind::Block => "b",
        })
    }
}

/// What a rule lets the container do with a device node; written as in cgroup v1 ("rwm").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Access {
    pub read: bool,
    pub write: bool,
    pub mknod: bool,
}

impl Access {
    pub const RW: Access = Access {
        read: true,
        write: true,
        mknod: false,
    };
    pub const RWM: Access = Access {
        read: true,
        write: true,
        mknod: true,
    };
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (set, letter) in [(self.read, "r"), (self.write, "w"), (self.mknod, "m")] {
            if set {
                f.write_str(letter)?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid device access {0:?}: use one or more of r (read), w (write), m (mknod), e.g. \"rw\""
)]
pub struct InvalidAccess(pub String);

impl FromStr for Access {
    type Err = InvalidAccess;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut access = Access::default();
        for letter in s.chars() {
            let bit = match letter {
                'r' => &mut access.read,
                'w' => &mut access.write,
                'm' => &mut access.mknod,
                _ => return Err(InvalidAccess(s.to_owned())),
            };
            *bit = true;
        }
        if access == Access::default() {
            return Err(InvalidAccess(s.to_owned()));
        }
        Ok(access)
    }
}

impl TryFrom<String> for Access {
    type Error = InvalidAccess;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Access> for String {
    fn from(access: Access) -> String {
        access.to_string()
    }
}

/// One device node the container may use; displayed in the cgroup v1 form `c 195:0 rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceRule {
    pub kind: DeviceKind,
    pub major: u32,
    pub minor: u32,
    pub access: Access,
}

impl DeviceRule {
    /// Read and write access to one character device: what a GPU node needs.
    pub fn char_rw(major: u32, minor: u32) -> DeviceRule {
        DeviceRule {
            kind: DeviceKind::Char,
            major,
            minor,
            access: Access::RW,
        }
    }
}

impl fmt::Display for DeviceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}:{} {}",
            self.kind, self.major, self.minor, self.access
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_displays_in_v1_form() {
        let rule = DeviceRule {
            kind: DeviceKind::Char,
            major: 195,
            minor: 0,
            access: Access::RWM,
        };
        assert_eq!(rule.to_string(), "c 195:0 rwm");
        let rule = DeviceRule {
            kind: DeviceKind::Block,
            major: 8,
            minor: 1,
            access: Access {
                read: true,
                ..Access::default()
            },
        };
        assert_eq!(rule.to_string(), "b 8:1 r");
    }

    #[test]
    fn access_parses_any_order_and_rejects_junk() {
        assert_eq!("wr".parse::<Access>().unwrap(), Access::RW);
        assert_eq!("mrw".parse::<Access>().unwrap(), Access::RWM);
        assert!("".parse::<Access>().is_err());
        assert!("rx".parse::<Access>().is_err());
    }

    #[test]
    fn rule_serde_round_trip() {
        let rule = DeviceRule {
            kind: DeviceKind::Char,
            major: 195,
            minor: 255,
            access: Access::RW,
        };
        let json = serde_json::to_string(&rule).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"c","major":195,"minor":255,"access":"rw"}"#
        );
        assert_eq!(serde_json::from_str::<DeviceRule>(&json).unwrap(), rule);
        let bad = r#"{"kind":"c","major":1,"minor":1,"access":"q"}"#;
        assert!(serde_json::from_str::<DeviceRule>(bad).is_err());
    }
}
