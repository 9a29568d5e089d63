//! PCI bus ids in the forms NVML accepts and prints.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A PCI function address. Function is kept because NVML's lookup compares it too.
/// The topology spells it as text; parsing while deserialising rejects bad ids early.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct BusId {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

#[derive(Debug, PartialEq, Eq)]
pub struct BadBusId;

impl fmt::Display for BadBusId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a PCI bus id (domain:bus:device.function, hexadecimal)")
    }
}

impl BusId {
    /// Parses what `nvmlDeviceGetHandleByPciBusId_v2` accepts: `domain:bus:device.function`,
    /// `domain:bus:device` or `bus:device.function`, hexadecimal of any width and case
    /// (so both the 8-digit and the legacy 4-digit domain forms).
    pub fn parse(text: &str) -> Result<Self, BadBusId> {
        let (address, function) = match text.rsplit_once('.') {
            Some((address, function)) => (address, Some(hex(function, 0x7)?)),
            None => (text, None),
        };
        let parts: Vec<&str> = address.split(':').collect();
        let (domain, bus, device) = match (parts.as_slice(), function) {
            ([domain, bus, device], _) => (hex(domain, u32::MAX)?, *bus, *device),
            // Without a domain the function is mandatory, or "a:b" would be ambiguous.
            ([bus, device], Some(_)) => (0, *bus, *device),
            _ => return Err(BadBusId),
        };
        Ok(Self {
            domain,
            bus: hex(bus, 0xff)?,
            device: hex(device, 0x1f)?,
            function: function.unwrap_or(0),
        })
    }

    /// The `busId` field: NVML's `%08X:%02X:%02X.0` form.
    pub fn canonical(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// The `busIdLegacy` field: the 4-digit-domain form.
    pub fn legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

fn hex(digits: &str, max: u32) -> Result<u32, BadBusId> {
    // from_str_radix alone would accept a leading '+'.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BadBusId);
    }
    match u32::from_str_radix(digits, 16) {
        Ok(value) if value <= max => Ok(value),
        _ => Err(BadBusId),
    }
}

impl From<BusId> for String {
    fn from(id: BusId) -> String {
        id.canonical()
    }
}

impl TryFrom<String> for BusId {
    type Error = BadBusId;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        Self::parse(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: BusId = BusId {
        domain: 0,
        bus: 0x18,
        device: 0,
        function: 0,
    };

    #[test]
    fn accepts_every_form_nvml_accepts() {
        for text in [
            "00000000:18:00.0",
            "0000:18:00.0",
            "0:18:0.0",
            "0000:18:00",
            "18:00.0",
            "00000000:18:00.0".to_lowercase().as_str(),
        ] {
            assert_eq!(BusId::parse(text), Ok(GPU), "{text}");
        }
        assert_eq!(BusId::parse("0000:b3:00.0").map(|id| id.bus), Ok(0xb3));
    }

    #[test]
    fn rejects_malformed_ids() {
        for text in [
            "",
            "18:00",
            "0000:18:00.8",
            "0000:100:00.0",
            "0000:18:20.0",
            "x:18:00.0",
            "0:0:+1.0",
            "1:2:3:4.0",
        ] {
            assert_eq!(BusId::parse(text), Err(BadBusId), "{text}");
        }
    }

    #[test]
    fn prints_both_nvml_forms() {
        let id = BusId {
            domain: 0x1,
            bus: 0xb3,
            device: 0x1f,
            function: 0,
        };
        assert_eq!(id.canonical(), "00000001:B3:1F.0");
        assert_eq!(id.legacy(), "0001:B3:1F.0");
    }
}
